#!/usr/bin/env bash
# Creates the Python virtualenv that keel's OpenAI-SDK compatibility tests
# run their client scripts with (crates/keel/tests/openai_sdk.rs): the
# official `openai` SDK, the `openai-agents` SDK, and `openresponses-types`
# to validate every streamed event against the Open Responses schema.
# The venv lives outside the clone so the repository stays clean and CI
# caches can keep it. Idempotent: a venv that already has every package at
# the pinned version is left alone.
#
# Usage: scripts/setup-python-sdk.sh [TARGET_DIR]
#   TARGET_DIR defaults to $KEEL_PYENV, else $HOME/.cache/keel-pyenv
# Prints `export KEEL_PYENV=...` as its last line; the tests look there
# (and in the default directory when the variable is unset).
set -euo pipefail

target="${1:-${KEEL_PYENV:-$HOME/.cache/keel-pyenv}}"

# Pinned (the versions the openai-agents peer benchmark is locked to) so a
# new release cannot change what the tests see overnight.
packages=(
    "openai==3.54.0"
    "openai-agents==0.24.0"
    "openresponses-types==2.4.0"
)

python="${PYTHON:-python3}"
command -v "$python" >/dev/null || { echo "setup-python-sdk: $python is required" >&2; exit 1; }

complete() {
    [[ -x "$target/bin/python" ]] || return 1
    local frozen spec
    frozen="$("$target/bin/python" -m pip freeze --disable-pip-version-check 2>/dev/null)" || return 1
    for spec in "${packages[@]}"; do
        # pip normalizes names to lower case with dashes in `freeze`.
        grep -qix -- "$spec" <<<"$frozen" || return 1
    done
}

if complete; then
    echo "setup-python-sdk: $target is up to date" >&2
else
    if [[ ! -x "$target/bin/python" ]]; then
        mkdir -p "$(dirname "$target")"
        "$python" -m venv "$target"
    fi
    "$target/bin/python" -m pip install --disable-pip-version-check --quiet "${packages[@]}"
    complete || { echo "setup-python-sdk: packages missing after install" >&2; exit 1; }
    echo "setup-python-sdk: installed ${packages[*]} into $target" >&2
fi
echo "export KEEL_PYENV=$target"
