#!/usr/bin/env bash
# Runs the official MCP conformance suite (@modelcontextprotocol/conformance,
# client scenarios) against keel's MCP client through the
# `keel-mcp-conformance-client` entry point, one scenario at a time.
#
# Fails when a scenario fails that tests/mcp-conformance/expected-failures.txt
# does not list. An expected failure that now passes is reported, not fatal:
# remove it from the list.
#
# Usage: scripts/mcp-conformance.sh [SCENARIO...]   (default: every client scenario)
# Installs what it needs with scripts/setup-mcp.sh (idempotent).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/keel-target}"

npm_dir="$(bash scripts/setup-mcp.sh | sed -n 's/^export KEEL_MCP_NPM=//p')"
node="$npm_dir/node_modules/node/bin/node"
suite="$npm_dir/node_modules/@modelcontextprotocol/conformance/dist/index.js"
expected_file="tests/mcp-conformance/expected-failures.txt"

cargo build --quiet -p keel-tools --bin keel-mcp-conformance-client
client="$CARGO_TARGET_DIR/debug/keel-mcp-conformance-client"

if (($# > 0)); then
    scenarios=("$@")
else
    mapfile -t scenarios < <("$node" "$suite" list --client | sed -n 's/^[[:space:]]*- \([^ ]*\).*/\1/p')
fi
((${#scenarios[@]} > 0)) || { echo "mcp-conformance: the suite lists no client scenarios" >&2; exit 1; }

expected=()
if [[ -f "$expected_file" ]]; then
    mapfile -t expected < <(sed -e 's/#.*//' -e 's/[[:space:]]*$//' -e '/^$/d' "$expected_file")
fi
is_expected() {
    local e
    for e in "${expected[@]}"; do [[ "$e" == "$1" ]] && return 0; done
    return 1
}

out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
passed=() unexpected=() known=() fixed=()
for scenario in "${scenarios[@]}"; do
    log="$out/$(echo "$scenario" | tr '/' '_').log"
    if "$node" "$suite" client --command "$client" --scenario "$scenario" \
        --timeout 30000 -o "$out/results" >"$log" 2>&1; then
        passed+=("$scenario")
        if is_expected "$scenario"; then fixed+=("$scenario"); fi
        echo "PASS  $scenario"
    elif is_expected "$scenario"; then
        known+=("$scenario")
        echo "xfail $scenario"
    else
        unexpected+=("$scenario")
        echo "FAIL  $scenario"
        sed 's/\x1b\[[0-9;]*m//g' "$log" | grep -E 'FAILURE|Error|error' | head -n 20 | sed 's/^/      /'
    fi
done

echo
echo "passed: ${#passed[@]}, expected failures: ${#known[@]}, unexpected failures: ${#unexpected[@]}"
for s in "${fixed[@]}"; do
    echo "note: $s passes now; remove it from $expected_file"
done
if ((${#unexpected[@]} > 0)); then
    echo "unexpected failures: ${unexpected[*]}" >&2
    exit 1
fi
