#!/usr/bin/env bash
# Installs Debian's Chromium and ChromeDriver for the console's browser tests
# (crates/keel/tests/console.rs). Idempotent: does nothing once both exist.
set -euo pipefail

if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
  exit 0
fi
echo "installing Debian's chromium and chromium-driver for the browser tests…"
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  sudo="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq >/dev/null
$sudo apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null
chromium --version
chromedriver --version
