#!/usr/bin/env bash
# Start the local Postgres and Redis the test suite talks to, if they are installed and not
# running. Safe to run repeatedly. Tests never mock them (contract §8, STYLE.md habit 9).
set -euo pipefail

pg_up() { pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; }
redis_up() { redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; }

if ! pg_up; then
  if command -v pg_ctlcluster >/dev/null 2>&1 && [ -d /etc/postgresql ]; then
    echo "starting PostgreSQL"
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start || true
    for _ in $(seq 1 60); do pg_up && break; sleep 0.5; done
  fi
fi
pg_up || { echo "PostgreSQL is not reachable on 127.0.0.1:5432 (install it, or set IDEMPAY_TEST_PG)" >&2; exit 1; }

if ! redis_up; then
  if command -v redis-server >/dev/null 2>&1; then
    echo "starting Redis"
    redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no
    for _ in $(seq 1 40); do redis_up && break; sleep 0.25; done
  fi
fi
redis_up || { echo "Redis is not reachable on 127.0.0.1:6379" >&2; exit 1; }
echo "services: postgres ok, redis ok"
