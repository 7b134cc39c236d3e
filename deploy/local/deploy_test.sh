#!/usr/bin/env bash
# `make deploy-test`: the deployment from nothing, on a private Docker engine, then nothing left.
#   1. installs what is missing from Debian's packages (docker.io, debootstrap, docker-compose);
#   2. starts a private dockerd (scripts/dockerd.sh: its own data root, exec root and socket);
#   3. `make deploy-check` against it (which builds `make images` first): the bases by
#      debootstrap, the wheelhouse, the five images; compose up; the fleet through the chaos
#      proxy with api-1 SIGKILLed; the contract §8 invariants; the audit in the Spark image;
#      compose down -v and the five images removed (DEPLOY_CHECK_RMI=1);
#   4. always, also on failure: every container, image and volume of the private engine
#      removed, dockerd stopped by its PID, its data root removed; then checked.
# Kept between runs, outside the repository: debootstrap's downloads and the bases' root file
# systems (/var/cache/idempay-debootstrap, deploy/local/build_base.sh), pip's cache.
#
#   deploy/local/deploy_test.sh                 cannot run here → fails
#   deploy/local/deploy_test.sh --if-possible   (`make test`) cannot run here (not root, no
#       cgroups, apt cannot install docker.io, dockerd does not start) → one line saying why,
#       exit 0; any failure once it runs still fails.
# Output: var/deploy-test/ (this script, dockerd's log) and var/deploy-check/ (the stack's).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
mode="${1:-}"
out="$root/var/deploy-test"
dockerd_sh="$root/scripts/dockerd.sh"
export IDEMPAY_DOCKER_LOG="$out/dockerd.log"
export DOCKER_HOST="unix://${IDEMPAY_DOCKER_SOCK:-/run/idempay-docker.sock}"
export DOCKER_BUILDKIT=0

not_run() {
  if [ "$mode" = --if-possible ]; then
    echo "deploy-test: NOT RUN on this machine: $1"; exit 0
  fi
  echo "deploy-test: cannot run here: $1" >&2; exit 1
}

begin=$SECONDS
stamp() { printf '[deploy-test +%ss] %s\n' "$((SECONDS - begin))" "$*"; }

reason="$("$dockerd_sh" check)" || not_run "$reason"
mkdir -p "$out"
if status="$("$dockerd_sh" status)"; then
  echo "deploy-test: a private dockerd already runs ($status): another deploy-test, or one" \
       "that was killed (scripts/dockerd.sh purge)" >&2
  exit 1
fi
stamp "installing what is missing (docker.io, debootstrap, docker-compose)"
"$dockerd_sh" install >"$out/install.log" 2>&1 \
  || not_run "apt-get could not install the packages: $(tail -n1 "$out/install.log")"

pid=""
cleanup() {
  local rc=$?
  set +e
  trap - EXIT INT TERM
  if [ -n "$pid" ]; then
    stamp "cleaning up the private engine"
    docker ps -aq | xargs -r docker rm -f -v >/dev/null
    docker image ls -q | sort -u | xargs -r docker image rm -f >/dev/null 2>&1
    docker system prune -af --volumes >/dev/null
    echo "before stop: $(docker ps -aq | wc -l) containers, $(docker image ls -aq | wc -l) images," \
         "$(docker volume ls -q | wc -l) volumes, $(docker network ls -q --filter type=custom | wc -l) networks of its own"
    "$dockerd_sh" purge || rc=1
    left="$(ps -eo pid=,args= | grep -F "${IDEMPAY_DOCKER_EXEC_ROOT:-/run/idempay-docker}" | grep -v grep)"
    if [ -d "/proc/$pid" ] || [ -n "$left" ]; then
      echo "deploy-test: LEFT RUNNING: dockerd PID $pid $( [ -d "/proc/$pid" ] && echo alive || echo gone); $left" >&2
      rc=1
    else
      stamp "dockerd PID $pid gone, no process of the private engine left"
    fi
  fi
  # Not started (the not-run line said why): neither passed nor failed.
  if [ -z "$pid" ] && [ "$rc" = 0 ]; then exit 0; fi
  if [ "$rc" = 0 ]; then stamp "PASSED"; else stamp "FAILED (exit $rc)"; fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

stamp "starting the private dockerd"
if ! "$dockerd_sh" start 2>"$out/dockerd-start.err"; then
  "$dockerd_sh" purge >/dev/null 2>&1 || true
  [ "$mode" = --if-possible ] || cat "$out/dockerd-start.err" >&2
  why="$(grep -E '^failed to start daemon|level=fatal' "$IDEMPAY_DOCKER_LOG" | tail -n1)"
  [ -n "$why" ] || why="$(tail -n1 "$out/dockerd-start.err")"
  not_run "dockerd does not start: ${why:0:200} ($IDEMPAY_DOCKER_LOG)"
fi
pid="$(cat "${IDEMPAY_DOCKER_EXEC_ROOT:-/run/idempay-docker}.pid")"

stamp "make deploy-check (make images first)"
DEPLOY_CHECK_RMI=1 nice -n 10 make --no-print-directory deploy-check
stamp "deploy-check passed"
