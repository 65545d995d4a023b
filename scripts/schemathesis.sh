#!/usr/bin/env bash
# Fuzzes a live `keel serve` against its own OpenAPI document with
# schemathesis: every operation gets schema-derived valid and invalid
# requests, and fails on a 5xx, an undocumented status code or content
# type, or a body that does not match the documented schema.
#
#   bash scripts/schemathesis.sh                 # the CI run
#   SCHEMATHESIS_MAX_EXAMPLES=200 bash scripts/schemathesis.sh
#   SCHEMATHESIS_SEED=123 bash scripts/schemathesis.sh   # replay a run
#
# Installs schemathesis into a venv under $HOME/.cache (once), builds the
# `keel` binary (a no-op when it is up to date), and serves from a temporary
# data dir that is removed afterwards. The model provider points at a closed
# port: runs fail at their first model call, which is all an HTTP-surface
# fuzzer needs (no network, no model).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/keel-target}"

SCHEMATHESIS_VERSION=4.32.5
VENV="$HOME/.cache/keel-schemathesis"
MAX_EXAMPLES="${SCHEMATHESIS_MAX_EXAMPLES:-100}"
# A fixed seed keeps CI reproducible; the seed is printed with every failure.
SEED="${SCHEMATHESIS_SEED:-20240601}"
# Seconds for the whole schemathesis run (well under a minute at the defaults).
TIME_LIMIT="${SCHEMATHESIS_TIME_LIMIT:-900}"

if ! "$VENV/bin/schemathesis" --version 2>/dev/null | grep -qF "$SCHEMATHESIS_VERSION"; then
  echo "installing schemathesis $SCHEMATHESIS_VERSION into $VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check "schemathesis==$SCHEMATHESIS_VERSION"
fi

cargo build -p keel --locked --quiet
KEEL="$CARGO_TARGET_DIR/debug/keel"

WORK="$(mktemp -d)"
KEEL_PID=""
cleanup() {
  if [ -n "$KEEL_PID" ]; then
    kill "$KEEL_PID" 2>/dev/null || true
    wait "$KEEL_PID" 2>/dev/null || true
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT

# Port 1 (tcpmux) is never served here: model calls are refused at once.
cat >"$WORK/keel.toml" <<EOF
[server]
bind = "127.0.0.1:0"
data_dir = "$WORK/data"

[[providers]]
name = "main"
kind = "openai"
base_url = "http://127.0.0.1:1/v1"
model = "unreachable"
stream = false
max_retries = 0
timeout_s = 2

[[agents]]
id = "default"
provider = "main"
system_prompt = "You answer questions."
tools = []

[agents.drift]
enabled = false

[memory]
embedder = "none"

[[auth.keys]]
key_env = "KEEL_SCHEMATHESIS_KEY"
tenant = "fuzz"
principal = "schemathesis"
roles = ["approver"]

[auth]
approver_roles = ["approver"]
EOF

export KEEL_SCHEMATHESIS_KEY="schemathesis-$RANDOM$RANDOM"
KEEL_LOG=error "$KEEL" serve --config "$WORK/keel.toml" >"$WORK/stdout" 2>"$WORK/keel.log" &
KEEL_PID=$!

BASE=""
for _ in $(seq 1 300); do
  BASE="$(sed -n 's/^keel listening on //p' "$WORK/stdout" | head -n 1)"
  [ -n "$BASE" ] && break
  if ! kill -0 "$KEEL_PID" 2>/dev/null; then
    echo "keel exited before listening:" >&2
    cat "$WORK/keel.log" >&2
    exit 1
  fi
  sleep 0.1
done
if [ -z "$BASE" ]; then
  echo "keel did not start within 30 s" >&2
  cat "$WORK/keel.log" >&2
  exit 1
fi
echo "keel serving on $BASE"

status=0
# Checks: no 5xx; every status code, content type and body (JSON, and each
# SSE frame) as documented. Every request carries the key; the 401s are
# covered by crates/keel-server/tests/openapi.rs. One worker: Python 3.11's
# ast.parse, which hypothesis calls to describe its strategies, can fail
# with "AST constructor recursion depth mismatch" when threads race it.
# Run from the temporary dir: schemathesis keeps a cache in the working
# directory. Bounded: an SSE stream that never ends would otherwise hold a
# request open for ever (heartbeats defeat --request-timeout).
(cd "$WORK" && timeout --signal=INT --kill-after=30 "$TIME_LIMIT" \
  "$VENV/bin/schemathesis" run "$BASE/openapi.json" \
  --checks not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance \
  --header "Authorization: Bearer $KEEL_SCHEMATHESIS_KEY" \
  --max-examples "$MAX_EXAMPLES" \
  --seed "$SEED" \
  --workers 1 \
  --request-timeout 20 \
  --generation-database none \
  --suppress-health-check too_slow,filter_too_much \
  --no-color) || status=$?

if [ "$status" -eq 124 ]; then
  echo "schemathesis did not finish within $TIME_LIMIT s (a request that never ends?)" >&2
fi
if ! kill -0 "$KEEL_PID" 2>/dev/null; then
  echo "keel died during the run:" >&2
  status=1
fi
if [ "$status" -ne 0 ]; then
  echo "== keel log (last 100 lines)" >&2
  tail -n 100 "$WORK/keel.log" >&2
fi
exit "$status"
