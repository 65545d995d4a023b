#!/usr/bin/env bash
# Installs the real MCP servers and the official conformance suite that
# keel's MCP client is tested against, plus a Node >= 22 (the conformance
# suite needs one; the `node@22` npm package provides it). Everything goes
# into one directory outside the clone, so the repository stays clean and
# CI caches can keep it. Idempotent: an install with every package at the
# pinned version is left alone.
#
# Usage: scripts/setup-mcp.sh [TARGET_DIR]
#   TARGET_DIR defaults to $KEEL_MCP_NPM, else $HOME/.cache/keel-npm
# Prints `export KEEL_MCP_NPM=...` as its last line; the tests look there
# (and in the default directory when the variable is unset).
set -euo pipefail

target="${1:-${KEEL_MCP_NPM:-$HOME/.cache/keel-npm}}"

# Pinned so a new release cannot change what the tests see overnight.
packages=(
    "@modelcontextprotocol/server-everything@2026.8.31"
    "@modelcontextprotocol/server-filesystem@2026.8.31"
    "@modelcontextprotocol/conformance@0.1.16"
    "node@22.23.3"
)

command -v npm >/dev/null || { echo "setup-mcp: npm is required" >&2; exit 1; }

installed_version() {
    # node_modules/<name>/package.json's "version", empty when absent.
    local pkg="$target/node_modules/$1/package.json"
    [[ -f "$pkg" ]] || return 0
    sed -n 's/^[[:space:]]*"version":[[:space:]]*"\([^"]*\)".*/\1/p' "$pkg" | head -n1
}

complete() {
    local spec name version
    for spec in "${packages[@]}"; do
        name="${spec%@*}"
        version="${spec##*@}"
        [[ "$(installed_version "$name")" == "$version" ]] || return 1
    done
    [[ -x "$target/node_modules/node/bin/node" ]] || return 1
}

if complete; then
    echo "MCP test packages already present in $target" >&2
else
    mkdir -p "$target"
    [[ -f "$target/package.json" ]] || echo '{"name": "keel-mcp-test-deps", "private": true}' > "$target/package.json"
    echo "installing ${packages[*]} into $target…" >&2
    npm install --prefix "$target" --no-audit --no-fund --loglevel=error "${packages[@]}" >&2
    complete || { echo "setup-mcp: install finished but packages are missing in $target" >&2; exit 1; }
fi

node_major="$("$target/node_modules/node/bin/node" -p 'process.versions.node.split(".")[0]')"
if (( node_major < 22 )); then
    echo "setup-mcp: $target/node_modules/node/bin/node is Node $node_major, need >= 22" >&2
    exit 1
fi
echo "export KEEL_MCP_NPM=$target"
