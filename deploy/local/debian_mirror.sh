#!/usr/bin/env bash
# Prints the Debian mirror this machine's apt sources already name (deb822 `URIs:` in
# /etc/apt/sources.list.d/*.sources, or a classic `deb URL bookworm …` line), for debootstrap.
# Only the main archive counts (not -security, not third-party repositories).
set -euo pipefail
suite="${1:-bookworm}"
shopt -s nullglob
for f in /etc/apt/sources.list.d/*.sources; do
  awk -v suite="$suite" '
    /^$/ { if (uri != "" && suites ~ "(^| )" suite "( |$)") { print uri; exit }
           uri = ""; suites = "" }
    /^URIs:/ { uri = $2 }
    /^Suites:/ { $1 = ""; suites = substr($0, 2) }
    END { if (uri != "" && suites ~ "(^| )" suite "( |$)") print uri }
  ' "$f"
done | head -n1 | grep . && exit 0
for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
  awk -v suite="$suite" '$1 == "deb" { i = 2; if ($2 ~ /^\[/) while ($i !~ /\]$/) i++; if ($2 ~ /^\[/) i++
                                        if ($(i + 1) == suite) { print $i; exit } }' "$f"
done | head -n1 | grep . && exit 0
echo "no apt source names a $suite mirror" >&2
exit 1
