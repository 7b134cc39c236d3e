#!/usr/bin/env bash
# docker compose with deploy/compose.yaml + deploy/local/compose.local.yaml (+ any -f given
# through IDEMPAY_COMPOSE_EXTRA), on whichever Compose this machine has:
#   - Compose v2 (`docker compose`): the files as they are;
#   - Compose v1 (`docker-compose` 1.29, Debian 12's package): it rejects the top-level `name:`
#     of the Compose specification, so it reads a copy without that line (var/compose.v1.yaml),
#     with the project directory set to deploy/ so every relative path means the same.
# The project name is IDEMPAY_PROJECT (default idempay, as compose.yaml's `name:`).
#   deploy/local/compose.sh up -d --no-build
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
project="${IDEMPAY_PROJECT:-idempay}"
files=(-f "$root/deploy/local/compose.local.yaml")
for extra in ${IDEMPAY_COMPOSE_EXTRA:-}; do files+=(-f "$extra"); done
if docker compose version >/dev/null 2>&1; then
  exec docker compose -p "$project" -f "$root/deploy/compose.yaml" "${files[@]}" "$@"
fi
mkdir -p "$root/var"
sed '/^name: /d' "$root/deploy/compose.yaml" >"$root/var/compose.v1.yaml"
exec docker-compose --project-directory "$root/deploy" -p "$project" \
  -f "$root/var/compose.v1.yaml" "${files[@]}" "$@"
