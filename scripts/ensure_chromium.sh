#!/usr/bin/env bash
# Make sure a headless Chromium is available for the report test (tests/analytics) and
# `make test`: Debian's package, installed with apt-get when /usr/bin/chromium is missing.
# Safe to run repeatedly; prints the browser's path on success.
set -euo pipefail

CHROMIUM="${IDEMPAY_CHROMIUM:-/usr/bin/chromium}"
if [ ! -x "$CHROMIUM" ]; then
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "chromium is missing and apt-get is not available" >&2
    exit 1
  fi
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq >/dev/null
  $SUDO apt-get install -y -qq --no-install-recommends chromium >/dev/null
fi
[ -x "$CHROMIUM" ] || { echo "chromium not found at $CHROMIUM" >&2; exit 1; }
echo "$CHROMIUM"
