#!/usr/bin/env bash
# Runs keel's whole test suite. Installs what the tests need when it is
# missing (each setup step is idempotent and fast once done):
#   - cargo-nextest
#   - the embedded default model (SmolLM2 GGUF) and llama.cpp's build tools
#   - the local embedding model (all-MiniLM-L6-v2)
#   - the official MCP reference servers, the MCP conformance suite, Node 22
#   - the official OpenAI Python SDKs, for the Responses API tests
#   - Debian's Chromium and ChromeDriver, for the console's browser tests
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/keel-target}"

if ! cargo nextest --version >/dev/null 2>&1; then
  echo "installing cargo-nextest"
  cargo install cargo-nextest --locked
fi

bash scripts/setup-local-model.sh
bash scripts/setup-embedder.sh
bash scripts/setup-browser.sh
eval "$(bash scripts/setup-mcp.sh | tail -n 1)"
eval "$(bash scripts/setup-python-sdk.sh | tail -n 1)"
export KEEL_MCP_NPM KEEL_PYENV

# The example plant MCP server (stdlib only), then the workspace.
python3 -m unittest examples/test_plant_server.py
# The MCP fixture server that keel's tests spawn, built with the arguments
# they build it with: a test then finds it made, rather than compiling it
# inside its own time limit on a loaded machine.
cargo build --quiet -p keel -p keel-test-support --bin mcp-fixture
cargo nextest run --workspace --no-fail-fast "$@"
