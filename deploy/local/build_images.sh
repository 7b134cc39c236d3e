#!/usr/bin/env bash
# `make images`: every image the compose stack runs, built on this machine without a
# registry or a package index (deploy/README.md, "Without a registry").
#   1. the Debian bases, by debootstrap from the mirror the apt sources name + docker import;
#   2. the wheelhouse on the host (pip wheel at the tested virtualenv's versions);
#   3. idempay:local and idempay-spark:local (deploy/local/Dockerfile*), installed --no-index;
#   4. Postgres, Redis and nginx from Debian's packages (deploy/local/services/).
# The build context is streamed as a tar of an allow-list (the classic builder of Debian's
# docker.io reads no <Dockerfile>.dockerignore), so .venv, var/ and secrets never enter it.
# Builds run on the host's network (`--network host`): the service images apt-get from the
# Debian mirror, and the private dockerd of `make deploy-test` has no default bridge or NAT.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
here="$root/deploy/local"
cd "$root"
export DOCKER_BUILDKIT=0
tag="${IDEMPAY_TAG:-local}"
wheelhouse="$root/var/wheelhouse"
wh=var/wheelhouse
logs="$root/var/images"  # each build's output (the docker client's warnings, a failure's log)
mkdir -p "$logs"

"$here/build_base.sh" idempay/base:bookworm python3,python3-venv
"$here/build_base.sh" idempay/base-jre:bookworm python3,python3-venv,openjdk-17-jre-headless,tini,procps
"$here/build_wheelhouse.sh" "$wheelhouse" idempay/base:bookworm

build() {  # build TAG DOCKERFILE PATH... : the context is exactly the paths given
  local image="$1" dockerfile="$2"
  shift 2
  local start=$SECONDS
  tar -c --exclude='__pycache__' --exclude='*.pyc' \
      --transform "s|^$wh|wheelhouse|" \
      "$dockerfile" "$@" \
    | nice -n 10 docker build -q --network host -t "$image" -f "$dockerfile" - \
      >/dev/null 2>"$logs/${image//[\/:]/_}.log" \
    || { tail -n 30 "$logs/${image//[\/:]/_}.log" >&2; return 1; }
  echo "$image: built in $((SECONDS - start)) s, $(docker image inspect -f '{{.Size}}' "$image" | numfmt --to=si)B"
}

build "idempay:$tag" deploy/local/Dockerfile "$wh"
build "idempay-spark:$tag" deploy/local/Dockerfile.spark "$wh" analytics deploy/spark/entrypoint.sh
build "idempay/postgres:15-$tag" deploy/local/services/Dockerfile.postgres deploy/local/services/postgres-entrypoint.sh
build "idempay/redis:7-$tag" deploy/local/services/Dockerfile.redis
build "idempay/nginx:$tag" deploy/local/services/Dockerfile.nginx deploy/local/services/nginx.conf deploy/nginx/idempay.conf
