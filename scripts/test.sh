#!/usr/bin/env bash
# Runs keel's whole test suite. Installs what the tests need when it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/keel-target}"

if ! cargo nextest --version >/dev/null 2>&1; then
  echo "installing cargo-nextest"
  cargo install cargo-nextest --locked
fi

cargo nextest run --workspace --no-fail-fast "$@"
