#!/usr/bin/env bash
# Debian's Chromium for the console's browser test (Playwright drives it: no browser download).
#
#   scripts/chromium.sh        # install it if missing (apt-get, as root), print its path
#
# Idempotent: a machine that has /usr/bin/chromium only prints the path. Without root and
# without the browser it fails, naming the package: the browser test fails then, never skips.
set -euo pipefail

BIN=/usr/bin/chromium
say() { echo "chromium.sh: $*" >&2; }

if [ ! -x "$BIN" ]; then
  [ "$(id -u)" = 0 ] || { say "Chromium is missing and installing it needs root: apt-get install -y chromium"; exit 1; }
  say "installing Debian's chromium package (apt-get)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q chromium >&2 || { apt-get update -q >&2 && apt-get install -y -q chromium >&2; }
fi
[ -x "$BIN" ] || { say "apt-get ran but $BIN is still missing"; exit 1; }
echo "$BIN"
