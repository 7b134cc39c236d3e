#!/usr/bin/env bash
# Citus for the local PostgreSQL 15, and a private Citus cluster on localhost (issue 18).
#
#   scripts/citus.sh build            build + install the extension (cached: instant when done)
#   scripts/citus.sh start [DIR]      build if needed, then a coordinator + 2 workers in DIR
#   scripts/citus.sh stop [DIR]       stop that cluster (pg_ctl by data dir, never by name)
#   scripts/citus.sh status [DIR]     the nodes, their ports and PIDs; exit 1 if one is down
#   scripts/citus.sh env [DIR]        IDEMPAY_DATABASE_URL=… for the coordinator
#
# The extension comes from ../shared/vendor/citus-13.2.2.tar.gz and the patch beside it
# (../shared/vendor/README.md); production takes Citus's own packages instead. The build is
# cached outside the repository under $IDEMPAY_CITUS_CACHE (default
# /var/cache/idempay-citus, or ~/.cache/idempay/citus when that is not writable), keyed by
# the tarball's and the patch's checksums and the server's version. `make install` copies
# citus.so and the extension's SQL files into /usr/lib/postgresql/15; nothing else of the
# machine's PostgreSQL is touched: the shared cluster on 5432 keeps its configuration and
# is never restarted. The private cluster's nodes are separate initdb'd data directories on
# free ports >= 20000 (DIR defaults to var/citus in the repository), trust auth on
# 127.0.0.1, shared_preload_libraries='citus,pg_stat_statements' (citus_stat_statements
# tells router from multi-shard queries), run as the postgres user when we are root.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/.." && pwd)"
# The vendored sources sit beside the checkout (../shared/vendor); a clone elsewhere on the
# same machine (a CI checkout, a clean clone under /tmp) finds them at /work/shared/vendor.
VENDOR="${IDEMPAY_CITUS_VENDOR:-}"
if [ -z "$VENDOR" ]; then
  for candidate in "$REPO/../shared/vendor" /work/shared/vendor; do
    if [ -f "$candidate/citus-13.2.2.tar.gz" ]; then VENDOR="$candidate"; break; fi
  done
  VENDOR="${VENDOR:-$REPO/../shared/vendor}"
fi
TARBALL="$VENDOR/citus-13.2.2.tar.gz"
PATCH="$VENDOR/citus-13.2.2-pg15.20.patch"
PG_MAJOR=15
PGBIN="/usr/lib/postgresql/$PG_MAJOR/bin"
PG_CONFIG="$PGBIN/pg_config"
[ -x "$PG_CONFIG" ] || PG_CONFIG="$(command -v pg_config || true)"
APT_DEPS=(postgresql-server-dev-$PG_MAJOR libcurl4-openssl-dev liblz4-dev libzstd-dev
          libkrb5-dev libselinux1-dev libxslt1-dev libpam0g-dev libreadline-dev
          build-essential patch)
# Bump when the build recipe below changes, so cached builds are redone.
RECIPE=2
WORKERS=2
DB=postgres

log() { printf 'citus.sh: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

cache_root() {
  if [ -n "${IDEMPAY_CITUS_CACHE:-}" ]; then echo "$IDEMPAY_CITUS_CACHE"; return; fi
  if mkdir -p /var/cache/idempay-citus 2>/dev/null && [ -w /var/cache/idempay-citus ]; then
    echo /var/cache/idempay-citus
  else
    echo "${XDG_CACHE_HOME:-$HOME/.cache}/idempay/citus"
  fi
}

build_key() {
  [ -f "$TARBALL" ] || die "no $TARBALL (see ../shared/vendor/README.md)"
  local pgver
  pgver="$("$PG_CONFIG" --version 2>/dev/null || echo none)"
  { sha256sum "$TARBALL" | cut -c1-64
    if [ -f "$PATCH" ]; then sha256sum "$PATCH" | cut -c1-64; fi
    echo "$pgver recipe $RECIPE"; } | sha256sum | cut -c1-16
}

installed() {  # the extension built in $1 is the one in the server's directories
  local lib share
  lib="$("$PG_CONFIG" --pkglibdir 2>/dev/null)" || return 1
  share="$("$PG_CONFIG" --sharedir 2>/dev/null)" || return 1
  [ -f "$share/extension/citus.control" ] \
    && cmp -s "$1/src/src/backend/distributed/citus.so" "$lib/citus.so"
}

apt_deps() {
  local missing=()
  for pkg in "${APT_DEPS[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' \
      || missing+=("$pkg")
  done
  [ "${#missing[@]}" -eq 0 ] && return 0
  log "installing build dependencies: ${missing[*]}"
  local sudo=()
  [ "$(id -u)" -eq 0 ] || sudo=(sudo)
  "${sudo[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq "${missing[@]}" >/dev/null
}

cmd_build() {
  local cache key dir stamp
  cache="$(cache_root)"
  key="$(build_key)"
  dir="$cache/$key"
  stamp="$dir/.built"
  if [ -f "$stamp" ] && installed "$dir"; then
    return 0  # built from this tarball for this server, and installed
  fi
  [ -f "$stamp" ] || apt_deps
  [ -x "$PG_CONFIG" ] || PG_CONFIG="$PGBIN/pg_config"
  mkdir -p "$cache"
  exec 9>"$cache/.lock"
  flock 9  # two test sessions building at once take turns
  if [ ! -f "$stamp" ]; then
    log "building Citus from $(basename "$TARBALL") in $dir (about 5 minutes on 2 cores)"
    rm -rf "$dir"
    mkdir -p "$dir/src"
    tar -xzf "$TARBALL" -C "$dir/src" --strip-components=1
    if [ -f "$PATCH" ]; then (cd "$dir/src" && patch -p1 -s <"$PATCH"); fi
    (cd "$dir/src" && ./configure --without-libcurl PG_CONFIG="$PG_CONFIG" >"$dir/configure.log" 2>&1) \
      || die "configure failed: $dir/configure.log"
    # with_llvm=no: no JIT bitcode (the server runs without it), half the build time.
    (cd "$dir/src" && make -j"$(nproc)" with_llvm=no >"$dir/make.log" 2>&1) \
      || die "make failed: tail $dir/make.log"
    touch "$stamp"
    find "$cache" -mindepth 1 -maxdepth 1 -type d ! -name "$key" -exec rm -rf {} +  # old builds
  fi
  if ! installed "$dir"; then
    log "installing Citus into $("$PG_CONFIG" --pkglibdir)"
    (cd "$dir/src" && make install with_llvm=no >"$dir/install.log" 2>&1) \
      || die "make install failed: $dir/install.log"
  fi
  flock -u 9
}

# ---------------------------------------------------------------------------------------
# The private cluster. DIR/<node>/data, DIR/<node>/port, DIR/<node>/log; run as postgres
# when we are root (the server refuses root).

cluster_dir() { local d="${1:-$REPO/var/citus}"; mkdir -p "$d"; (cd "$d" && pwd); }

as_pg() {
  if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

nodes() { echo coordinator; for i in $(seq 1 "$WORKERS"); do echo "worker$i"; done; }

port_free() {
  ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

pick_port() {  # a free port in 20000-32767 (below the kernel's ephemeral range), not one
  local dir="$1" port  # another node of DIR already holds
  for _ in $(seq 1 200); do
    port=$((20000 + RANDOM % 12768))
    if port_free "$port" && ! grep -qx "$port" "$dir"/*/port 2>/dev/null; then
      echo "$port"; return 0
    fi
  done
  die "no free port found"
}

node_port() { cat "$1/$2/port"; }

psql_node() {  # psql_node DIR NODE SQL
  "$PGBIN/psql" -X -q -v ON_ERROR_STOP=1 -At -h 127.0.0.1 -p "$(node_port "$1" "$2")" \
    -U postgres -d "$DB" -c "$3"
}

node_running() {
  local pidfile="$1/$2/data/postmaster.pid" pid
  [ -f "$pidfile" ] || return 1
  pid="$(head -1 "$pidfile")"
  kill -0 "$pid" 2>/dev/null
}

init_node() {
  local dir="$1" node="$2" port
  [ -f "$dir/$node/data/PG_VERSION" ] && return 0
  mkdir -p "$dir/$node"
  port="$(pick_port "$dir")"
  echo "$port" >"$dir/$node/port"
  if [ "$(id -u)" -eq 0 ]; then
    chown -R postgres:postgres "$dir"
    local p="$dir"
    while [ "$p" != "/" ]; do  # let the postgres user reach its folder
      [ "$(stat -c %u "$p")" -eq 0 ] && chmod o+x "$p"
      p="$(dirname "$p")"
    done
  fi
  as_pg "$PGBIN/initdb" -D "$dir/$node/data" -U postgres -A trust -E UTF8 \
    --no-instructions --no-sync >"$dir/$node/initdb.log" 2>&1 \
    || die "initdb failed: $dir/$node/initdb.log"
  cat >>"$dir/$node/data/postgresql.conf" <<EOF
# idempay private Citus node ($node), written by scripts/citus.sh
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = '$dir/$node'
shared_preload_libraries = 'citus,pg_stat_statements'
citus.stat_statements_track = 'all'
# Loopback only: SSL when a node has it (CREATE EXTENSION citus turns it on), never required,
# so a node still reloading its new certificate is not refused.
citus.node_conninfo = 'sslmode=prefer'
max_connections = 200
shared_buffers = 128MB
max_prepared_transactions = 200
wal_level = logical
max_wal_senders = 10
max_replication_slots = 10
fsync = on
synchronous_commit = on
citus.shard_count = 32
log_min_messages = warning
log_line_prefix = '%m [%p] db=%d app=%a '
EOF
  printf 'host all all 127.0.0.1/32 trust\n' >>"$dir/$node/data/pg_hba.conf"
}

ensure_conf() {  # settings added after a node's initdb: appended once, read at its next start
  local conf="$1/$2/data/postgresql.conf"
  # Every database with the extension runs a Citus maintenance daemon, a background worker:
  # with the default 8 slots the tests' databases (one per module, on every node) used them
  # all, and a shard move's logical-replication apply worker could not start — the move
  # waited for ever ("out of background worker slots").
  grep -q '^max_worker_processes' "$conf" \
    || printf 'max_worker_processes = 64\n' >>"$conf"
}

start_node() {  # a node never registered may move to another port if its own was taken
  local dir="$1" node="$2" fresh="${3:-0}" port
  node_running "$dir" "$node" && return 0
  for _ in 1 2 3 4 5; do
    as_pg "$PGBIN/pg_ctl" -D "$dir/$node/data" -l "$dir/$node/log" -w -t 60 start >/dev/null \
      && return 0
    if [ "$fresh" -eq 1 ] && tail -5 "$dir/$node/log" | grep -q "Address already in use"; then
      port="$(pick_port "$dir")"
      echo "$port" >"$dir/$node/port"
      sed -i "s/^port = .*/port = $port/" "$dir/$node/data/postgresql.conf"
      continue
    fi
    break
  done
  tail -20 "$dir/$node/log" >&2
  die "$node did not start"
}

cmd_start() {
  local dir fresh=0
  dir="$(cluster_dir "${1:-}")"
  cmd_build
  [ -f "$dir/coordinator/data/PG_VERSION" ] || fresh=1
  for node in $(nodes); do
    init_node "$dir" "$node"
    ensure_conf "$dir" "$node"
    start_node "$dir" "$node" "$fresh"
  done
  for node in $(nodes); do psql_node "$dir" "$node" "CREATE EXTENSION IF NOT EXISTS citus"; done
  if [ "$fresh" -eq 1 ] || [ "$(psql_node "$dir" coordinator \
      "SELECT count(*) FROM pg_dist_node WHERE groupid > 0")" != "$WORKERS" ]; then
    psql_node "$dir" coordinator \
      "SELECT citus_set_coordinator_host('127.0.0.1', $(node_port "$dir" coordinator))" >/dev/null
    for i in $(seq 1 "$WORKERS"); do
      psql_node "$dir" coordinator "SELECT citus_add_node('127.0.0.1', \
        $(node_port "$dir" "worker$i")) WHERE NOT EXISTS (SELECT 1 FROM pg_dist_node \
        WHERE nodename = '127.0.0.1' AND nodeport = $(node_port "$dir" "worker$i"))" >/dev/null
    done
  fi
  cmd_status "$dir" >&2
  cmd_env "$dir"
}

cmd_stop() {
  local dir
  dir="$(cluster_dir "${1:-}")"
  for node in $(nodes); do
    if node_running "$dir" "$node"; then
      as_pg "$PGBIN/pg_ctl" -D "$dir/$node/data" -m fast -w -t 60 stop >/dev/null \
        || as_pg "$PGBIN/pg_ctl" -D "$dir/$node/data" -m immediate -w stop >/dev/null
    fi
  done
}

cmd_status() {
  local dir ok=0
  dir="$(cluster_dir "${1:-}")"
  for node in $(nodes); do
    if [ ! -f "$dir/$node/port" ]; then
      echo "$node: not initialised"; ok=1
    elif node_running "$dir" "$node"; then
      echo "$node: up on 127.0.0.1:$(node_port "$dir" "$node") pid $(head -1 "$dir/$node/data/postmaster.pid")"
    else
      echo "$node: down (port $(node_port "$dir" "$node"))"; ok=1
    fi
  done
  return "$ok"
}

cmd_env() {
  local dir
  dir="$(cluster_dir "${1:-}")"
  echo "IDEMPAY_DATABASE_URL=postgresql+asyncpg://postgres@127.0.0.1:$(node_port "$dir" coordinator)/$DB"
}

case "${1:-}" in
  build) shift; cmd_build "$@" ;;
  start) shift; cmd_start "$@" ;;
  stop) shift; cmd_stop "$@" ;;
  status) shift; cmd_status "$@" ;;
  env) shift; cmd_env "$@" ;;
  *) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
