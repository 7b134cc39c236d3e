#!/usr/bin/env bash
# Builds a Debian bookworm base image without a registry: debootstrap from the Debian mirror
# this machine's apt sources already name, then `docker import`.
#   deploy/local/build_base.sh TAG [EXTRA_PACKAGES,comma,separated]
# Needs root (debootstrap). Downloads are kept in $IDEMPAY_DEBOOTSTRAP_CACHE so the images
# built one after another fetch each .deb once. Skips the build if TAG already exists.
set -euo pipefail
tag="$1"
extra="${2:-}"
suite=bookworm
here="$(cd "$(dirname "$0")" && pwd)"
cache="${IDEMPAY_DEBOOTSTRAP_CACHE:-/var/cache/idempay-debootstrap}"
if docker image inspect "$tag" >/dev/null 2>&1; then
  echo "$tag: already built"; exit 0
fi
command -v debootstrap >/dev/null || { echo "debootstrap missing: apt-get install -y debootstrap" >&2; exit 1; }
mirror="$("$here/debian_mirror.sh" "$suite")"
include="ca-certificates${extra:+,$extra}"
root="$(mktemp -d /tmp/idempay-rootfs.XXXXXX)"
trap 'rm -rf "$root"' EXIT
mkdir -p "$cache"
echo "$tag: debootstrap $suite from $mirror (+ $include)"
start=$SECONDS
nice -n 10 debootstrap --variant=minbase --include="$include" --cache-dir="$cache" \
  "$suite" "$root" "$mirror" >"$root.log" 2>&1 || { tail -20 "$root.log" >&2; exit 1; }
rm -f "$root.log"
# What a container image does not need: apt lists and caches, docs, man pages.
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb \
       "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/*
tar -C "$root" -c . | docker import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change 'CMD ["/bin/bash"]' \
  --message "debootstrap --variant=minbase --include=$include $suite $mirror" \
  - "$tag" >/dev/null
echo "$tag: built in $((SECONDS - start)) s, $(docker image inspect -f '{{.Size}}' "$tag" | numfmt --to=si)B"
