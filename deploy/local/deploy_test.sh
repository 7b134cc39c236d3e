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
# Beside another job (by hand; `make test` runs it after pytest — beside it, on 2 cores,
# the stack missed its readiness bound), with IDEMPAY_DEPLOY_TEST_JOIN=1:
#   deploy/local/deploy_test.sh --if-possible --start   the checks and step 1 in the
#       foreground (so no apt-get runs beside pytest's), then steps 2-4 in the background,
#       their output in var/deploy-test/background/log; returns at once;
#   deploy/local/deploy_test.sh --if-possible           (IDEMPAY_DEPLOY_TEST_JOIN=1, a run
#       started so) waits for that run, prints its output and exits with its status.
# Output: var/deploy-test/ (this script, dockerd's log) and var/deploy-check/ (the stack's).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
mode="" start="" child=""
for arg in "$@"; do
  case "$arg" in
    --if-possible) mode=--if-possible ;;
    --start) start=1 ;;
    --background-child) child=1 ;;  # internal: the run that --start leaves in the background
    *) echo "deploy-test: unknown argument $arg" >&2; exit 2 ;;
  esac
done
out="$root/var/deploy-test"
bg="$out/background"  # the run beside pytest: pid, log, rc (written when it ends)
dockerd_sh="$root/scripts/dockerd.sh"
export IDEMPAY_DOCKER_LOG="$out/dockerd.log"
export DOCKER_HOST="unix://${IDEMPAY_DOCKER_SOCK:-/run/idempay-docker.sock}"
export DOCKER_BUILDKIT=0

not_run() {
  if [ "$mode" = --if-possible ]; then
    if [ -n "$start" ] && mkdir -p "$bg" 2>/dev/null; then  # said once, at the join
      echo "deploy-test: NOT RUN on this machine: $1" >"$bg/log"
      echo 0 >"$bg/rc" && echo none >"$bg/pid"
      exit 0
    fi
    echo "deploy-test: NOT RUN on this machine: $1"; exit 0
  fi
  echo "deploy-test: cannot run here: $1" >&2; exit 1
}

# The join: wait for the run --start left in the background, then report it as if it had
# run here. Its state goes once reported; its log stays (var/deploy-test/background.log).
if [ "${IDEMPAY_DEPLOY_TEST_JOIN:-}" = 1 ] && [ -z "$start$child" ] && [ -s "$bg/pid" ]; then
  runner="$(cat "$bg/pid")"
  if [ "$runner" != none ] && [ ! -s "$bg/rc" ] && [ -d "/proc/$runner" ]; then
    echo "deploy-test: waiting for the run started beside pytest (PID $runner)"
    while [ ! -s "$bg/rc" ] && [ -d "/proc/$runner" ]; do sleep 2; done
  fi
  rc="$(cat "$bg/rc" 2>/dev/null || true)"
  if [ "$runner" != none ]; then
    echo "---- deploy-test, run beside pytest (var/deploy-test/background.log) ----"
  fi
  cat "$bg/log" 2>/dev/null || true
  mv -f "$bg/log" "$out/background.log" 2>/dev/null || true
  rm -rf "$bg"
  if [ -z "$rc" ]; then
    echo "deploy-test: FAILED: the run beside pytest (PID $runner) ended without a status" >&2
    exit 1
  fi
  exit "$rc"
fi

begin=$SECONDS
stamp() { printf '[deploy-test +%ss] %s\n' "$((SECONDS - begin))" "$*"; }

if [ -z "$child" ]; then
  [ -z "$start" ] || rm -rf "$bg" "$out/background.log"
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
fi
if [ -n "$start" ]; then
  mkdir -p "$bg"
  ( set +e
    "$0" $mode --background-child </dev/null >"$bg/log" 2>&1
    echo $? >"$bg/rc.new" && mv -f "$bg/rc.new" "$bg/rc" ) </dev/null >/dev/null 2>&1 &
  echo $! >"$bg/pid"
  echo "deploy-test: started beside pytest (PID $!); its output is printed when pytest is done"
  exit 0
fi

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
