#!/usr/bin/env bash
# Builds the wheelhouse the images install from with `pip install --no-index`: the project's
# wheel and every dependency of its `api` and `analytics` extras, at the versions of the
# tested virtualenv (`pip freeze` of .venv is the constraints file). Runs on the host, which
# reaches the package index; the image builds never do. Usable offline afterwards.
#   deploy/local/build_wheelhouse.sh [DIR [IMAGE]]   (default: var/wheelhouse)
# With IMAGE (a base image with python3 -m venv), the wheelhouse is then completed for that
# image's interpreter: a dependency whose marker holds there but not on the host (redis needs
# async-timeout on Python < 3.11.3; Debian 12 ships 3.11.2) is found by a dry-run
# `pip install --no-index` inside IMAGE, with no network, and added from the host.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
out="$(realpath -m "${1:-$root/var/wheelhouse}")"
pip="$root/.venv/bin/pip"
mkdir -p "$out"
constraints="$out/constraints.txt"
"$pip" freeze --exclude-editable | grep -v '^idempay' >"$constraints"
rm -f "$out"/idempay-*.whl
start=$SECONDS
nice -n 10 "$pip" wheel -q --wheel-dir "$out" -c "$constraints" "$root[api,analytics]"
image="${2:-}"
for _ in 1 2 3 4 5; do
  [ -n "$image" ] || break
  missing="$(docker run --rm --network none -v "$out:/wheels:ro" "$image" sh -c \
    'python3 -m venv /tmp/venv && /tmp/venv/bin/pip install -q --dry-run --no-index \
       --find-links /wheels -c /wheels/constraints.txt "$(ls /wheels/idempay-*.whl)[api,analytics]"' \
    2>&1 | sed -n 's/.*No matching distribution found for \([^;]*\).*$/\1/p')" || true
  [ -n "$missing" ] || break
  echo "wheelhouse: $image also needs $missing"
  nice -n 10 "$pip" wheel -q --wheel-dir "$out" -c "$constraints" "$missing"
done
echo "wheelhouse: $(ls "$out"/*.whl | wc -l) wheels, $(du -sh "$out" | cut -f1) in $((SECONDS - start)) s ($out)"
