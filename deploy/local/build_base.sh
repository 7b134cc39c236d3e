#!/usr/bin/env bash
# Builds a Debian bookworm base image without a registry: debootstrap from the Debian mirror
# this machine's apt sources already name, then `docker import`.
#   deploy/local/build_base.sh TAG [EXTRA_PACKAGES,comma,separated]
# Needs root (debootstrap). Downloads are kept in $IDEMPAY_DEBOOTSTRAP_CACHE so the images
# built one after another fetch each .deb once. Skips the build if TAG already exists.
# The finished root file system is kept there too, as a tar keyed by suite, mirror and
# packages (rootfs/TAG.tar + .key): a later run younger than IDEMPAY_BASE_MAX_AGE_DAYS (7)
# imports it instead of running debootstrap again (`make deploy-test` removes every image
# at its end). IDEMPAY_BASE_MAX_AGE_DAYS=0 always runs debootstrap.
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
mkdir -p "$cache/rootfs"
saved="$cache/rootfs/$(echo "$tag" | tr '/:' '__').tar"
key="debootstrap --variant=minbase --include=$include $suite $mirror"
max_age="${IDEMPAY_BASE_MAX_AGE_DAYS:-7}"
import_rootfs() {
  docker import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["/bin/bash"]' \
    --message "$key" \
    - "$tag" >/dev/null
}
start=$SECONDS
if [ "$max_age" -gt 0 ] && [ -s "$saved" ] && [ "$(cat "$saved.key" 2>/dev/null)" = "$key" ] \
   && [ -n "$(find "$saved" -mtime "-$max_age")" ]; then
  import_rootfs <"$saved"
  echo "$tag: imported the root file system saved $(date -r "$saved" -u +%F) ($saved) in $((SECONDS - start)) s, $(docker image inspect -f '{{.Size}}' "$tag" | numfmt --to=si)B"
  exit 0
fi
root="$(mktemp -d /tmp/idempay-rootfs.XXXXXX)"
trap 'rm -rf "$root" "$root.log"' EXIT
echo "$tag: debootstrap $suite from $mirror (+ $include)"
nice -n 10 debootstrap --variant=minbase --include="$include" --cache-dir="$cache" \
  "$suite" "$root" "$mirror" >"$root.log" 2>&1 || { tail -20 "$root.log" >&2; exit 1; }
# What a container image does not need: apt lists and caches, docs, man pages.
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb \
       "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/*
rm -f "$saved.key"
tar -C "$root" -c . >"$saved.part" && mv "$saved.part" "$saved" && echo "$key" >"$saved.key"
import_rootfs <"$saved"
echo "$tag: built in $((SECONDS - start)) s, $(docker image inspect -f '{{.Size}}' "$tag" | numfmt --to=si)B"
