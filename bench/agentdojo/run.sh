#!/usr/bin/env bash
# Replays AgentDojo's banking, slack, travel and workspace suites through
# keel with a model that obeys every injection it reads, in four policy
# configurations, and prints the table of bench/README.md.
#
# Usage: bench/agentdojo/run.sh [replay.py options]
#   e.g. bench/agentdojo/run.sh --suites banking --configs deny
# The Python environment lives outside the clone ($KEEL_AGENTDOJO_ENV, else
# $HOME/.cache/keel-agentdojo); keel is built in release mode first.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
venv="${KEEL_AGENTDOJO_ENV:-$HOME/.cache/keel-agentdojo}"
python="${PYTHON:-python3}"

if ! "$venv/bin/python" -c "import agentdojo, mcp, uvicorn" 2>/dev/null ||
    ! "$venv/bin/python" -m pip freeze --disable-pip-version-check 2>/dev/null |
        grep -qix "agentdojo==0.1.35"; then
    "$python" -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$here/requirements.txt"
fi

# llama.cpp's build tools must exist before anything compiles keel-local.
(cd "$repo" && bash scripts/setup-local-model.sh >&2 && cargo build --release --quiet -p keel --bin keel)
target="${CARGO_TARGET_DIR:-$repo/target}"

cd "$here"
exec "$venv/bin/python" replay.py --keel "$target/release/keel" "$@"
