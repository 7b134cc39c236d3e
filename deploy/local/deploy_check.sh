#!/usr/bin/env bash
# `make deploy-check`: the compose stack run for real, then taken down.
#   1. compose up (deploy/compose.yaml + compose.local.yaml + compose.check.yaml) from the
#      images `make images` built, on free loopback ports, with fresh random secrets;
#   2. an API key (`migrate admin create-key`), `/readyz` through nginx; the acquirer-sim
#      healthy (its compose healthcheck: an ISO 8583 sign-on), and both API replicas on it
#      (their start-up line names iso8583://acquirer-sim:8583, not a child host of their own);
#   3. `idempay simulate` from the host through the chaos proxy to nginx's published port;
#      one API container is SIGKILLed mid-run (and started again, as an orchestrator would);
#      the simulator then checks the contract §8 invariants against the stack's Postgres and,
#      from the acquirer's side, against the acquirer-sim's store, read from its volume on
#      this host (skipped, saying so, where the engine's volumes are not readable here);
#   4. the acquirer-sim's clearing file for the day, written in its container;
#   5. the audit in its container: `--profile audit run --rm audit` (export + spark-submit);
#   6. compose down -v: containers, network and volumes removed (images kept; DEPLOY_CHECK_RMI=1
#      removes the five images too).
# Only the project's own containers and 127.0.0.1 are ever targets. Output in var/deploy-check/.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
out="$root/var/deploy-check"
rm -rf "$out" && mkdir -p "$out"
free_port() { .venv/bin/python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
export IDEMPAY_PROJECT="idempay-check-$$"
export IDEMPAY_COMPOSE_EXTRA="$root/deploy/local/compose.check.yaml"
export IDEMPAY_HTTP_BIND=127.0.0.1 IDEMPAY_HTTP_PORT="$(free_port)" IDEMPAY_CHECK_PG_PORT="$(free_port)"
POSTGRES_PASSWORD="$(openssl rand -hex 24)"
IDEMPAY_SECRET_KEY="$(openssl rand -base64 48)"
export POSTGRES_PASSWORD IDEMPAY_SECRET_KEY
compose() { "$root/deploy/local/compose.sh" "$@"; }
teardown() {
  local status=$?
  compose --profile audit logs --no-color >"$out/compose.log" 2>&1 || true
  # Each container's health-check history: why a dependency was "unhealthy" when up failed.
  for id in $(docker ps -aq --filter "label=com.docker.compose.project=$IDEMPAY_PROJECT"); do
    docker inspect -f '{{.Name}} {{.State.Status}} {{json .State.Health}}' "$id"
  done >"$out/health.log" 2>&1 || true
  if [ "$status" != 0 ]; then
    # CI shows only this script's output: what failed, and why, before the stack goes.
    {
      echo "deploy-check failed (exit $status); compose up said (tail of $out/up.log):"
      tail -n 20 "$out/up.log" 2>/dev/null | sed 's/^/  up| /'
      echo "containers and their last health checks ($out/health.log):"
      sed -E 's/^/  health| /; s/(.{400}).*/\1…/' "$out/health.log" 2>/dev/null
      echo "the last lines of each service's log ($out/compose.log):"
      tail -n 60 "$out/compose.log" 2>/dev/null | sed 's/^/  log| /'
    } >&2
  fi
  compose --profile audit down -v --remove-orphans >/dev/null 2>&1 || true
  if [ "${DEPLOY_CHECK_RMI:-0}" = 1 ]; then
    docker image rm idempay:local idempay-spark:local idempay/postgres:15-local \
      idempay/redis:7-local idempay/nginx:local >/dev/null 2>&1 || true
  fi
  left="$(docker ps -aq --filter "label=com.docker.compose.project=$IDEMPAY_PROJECT")"
  [ -z "$left" ] && echo "down: nothing of $IDEMPAY_PROJECT left" || echo "down: LEFT $left" >&2
}
trap teardown EXIT
url="http://127.0.0.1:$IDEMPAY_HTTP_PORT"

start=$SECONDS
# One more `up` if the first fails (a dependency's health check missed on a loaded host, as
# an orchestrator would start it again); why it failed is printed either way.
if ! compose up -d --no-build >"$out/up.log" 2>&1; then
  {
    echo "compose up failed after $((SECONDS - start)) s; once more. It said:"
    tail -n 15 "$out/up.log" | sed 's/^/  up| /'
    for id in $(docker ps -aq --filter "label=com.docker.compose.project=$IDEMPAY_PROJECT"); do
      docker inspect -f '{{.Name}} {{.State.Status}} {{json .State.Health}}' "$id"
    done | sed -E 's/^/  health| /; s/(.{600}).*/\1…/'
  } >&2
  mv "$out/up.log" "$out/up.first.log"
  compose up -d --no-build >"$out/up.log" 2>&1
fi
until curl -fsS "$url/readyz" >"$out/readyz.json" 2>/dev/null; do
  (( SECONDS - start < 180 )) || { echo "no /readyz after 180 s" >&2; exit 1; }
  sleep 1
done
echo "up: $url/readyz $(cat "$out/readyz.json") after $((SECONDS - start)) s"
acquirer="$(compose ps -q acquirer-sim)"
health="$(docker inspect -f '{{.State.Health.Status}}' "$acquirer")"
[ "$health" = healthy ] || { echo "acquirer-sim is $health, not healthy" >&2; exit 1; }
for replica in api-1 api-2; do
  line="$(compose logs --no-color "$replica" 2>/dev/null | grep -o 'acquirer [^,]*, workers' | tail -n1)"
  [ "$line" = "acquirer iso8583://acquirer-sim:8583, workers" ] \
    || { echo "$replica is not on the acquirer-sim: '${line:-no start-up line}'" >&2; exit 1; }
done
echo "acquirer-sim: $health; api-1 and api-2 on iso8583://acquirer-sim:8583"
# The acquirer's side of §8 reads its store where the engine keeps the volume (a private
# dockerd as root: a directory on this host). SQLite's WAL is shared safely between the
# host's reader and the container's writer: one kernel, one file.
acquirer_store=()
volume="$(docker volume inspect -f '{{.Mountpoint}}' "${IDEMPAY_PROJECT}_acquirer" 2>/dev/null || true)"
if [ -n "$volume" ] && [ -r "$volume/acquirer.sqlite3" ] && [ -w "$volume" ]; then
  acquirer_store=(--acquirer-store "$volume/acquirer.sqlite3")
else
  echo "acquirer checks: SKIPPED: the acquirer-sim's store (volume ${IDEMPAY_PROJECT}_acquirer," \
       "mount point '${volume:-unknown}') is not readable from this host; the fleet checks" \
       "idempay's side of §8 only"
fi
key="$(compose run --rm migrate admin create-key --merchant deploy-check 2>/dev/null | grep -o 'idp_[A-Za-z0-9_-]*' | tail -n1)"

export IDEMPAY_DATABASE_URL="postgresql+asyncpg://idempay:$POSTGRES_PASSWORD@127.0.0.1:$IDEMPAY_CHECK_PG_PORT/idempay"
victim="$(compose ps -q api-1)"
start=$SECONDS
nice -n 5 .venv/bin/idempay simulate --url "$url" --api-key "$key" --via-proxy \
  --terminals "${FLEET_TERMINALS:-16}" --payments "${FLEET_PAYMENTS:-150}" --loss 0.05 --seed 7 \
  --workdir "$out/fleet" "${acquirer_store[@]}" >"$out/simulate.log" 2>&1 &
fleet=$!
sleep "${KILL_AFTER_S:-2}"
kill -0 "$fleet" 2>/dev/null || { echo "the fleet ended before the kill: raise FLEET_PAYMENTS" >&2; exit 1; }
docker kill "$victim" >/dev/null
echo "killed api-1 ($victim) $((SECONDS - start)) s into the fleet"
sleep 3
docker start "$victim" >/dev/null
rc=0; wait "$fleet" || rc=$?
# The summary lines of the simulator's table, without its box-drawing characters (sed in a
# UTF-8 locale: `tr` works on bytes and cut them in half).
grep -E "terminals ×|payments |approved|declined|duplicates|lost|in-doubt|payments/s|acquirer|advice|invariant|all invariants|FAIL" "$out/simulate.log" \
  | grep -v '^fleet ' | LC_ALL=C.UTF-8 sed -E 's/[│┃━─]+//g; s/ +/ /g; s/^ //; s/ $//' \
  | tee "$out/simulate.summary" || true
echo "fleet: exit $rc after $((SECONDS - start)) s"
[ "$rc" = 0 ] || exit "$rc"
if [ "${#acquirer_store[@]}" -gt 0 ]; then
  for invariant in acquirer_one_0200_per_key acquirer_advice_drained acquirer_net_approvals \
      acquirer_timeout_advised; do
    grep -qx "invariant $invariant ok" "$out/simulate.summary" \
      || { echo "the fleet's §8 checks lack $invariant" >&2; exit 1; }
  done
  echo "acquirer checks: the four acquirer-side invariants of §8 hold on the acquirer-sim's store"
fi

day="$(date -u +%F)"
compose exec -T acquirer-sim idempay acquirer clearing --store /data/acquirer.sqlite3 \
  --date "$day" --out /tmp/clearing.csv >"$out/clearing.log" 2>&1
echo "clearing: $(tail -n1 "$out/clearing.log")"
grep -q '^/tmp/clearing.csv: [1-9][0-9]* records, net amount ' "$out/clearing.log"

start=$SECONDS
AUDIT_DATE="$(date -u +%F)" compose --profile audit run --rm audit >"$out/audit.log" 2>&1
grep -E "^(transactions|duplicate_requests|suspected_double_charges|exactly_once_violations|report): " "$out/audit.log"
echo "audit: ok in $((SECONDS - start)) s"
grep -q '^exactly_once_violations: 0$' "$out/audit.log"
grep -q '^suspected_double_charges: 0$' "$out/audit.log"
