#!/usr/bin/env bash
# A private Docker engine for `make deploy-test`: its own data root, exec root, socket, PID
# file and log, so it neither uses nor disturbs any other dockerd on the machine, and it is
# stopped by its PID.
#   scripts/dockerd.sh check      prints why a dockerd cannot run here (exit 1), or nothing
#   scripts/dockerd.sh install    apt-get installs what is missing (docker.io, debootstrap,
#                                 docker-compose; services are not started: no init here)
#   scripts/dockerd.sh start      starts it and waits until it answers; prints DOCKER_HOST
#   scripts/dockerd.sh stop       stops it by PID (TERM, then KILL after 30 s)
#   scripts/dockerd.sh purge      stop, then remove its data root and exec root
#   scripts/dockerd.sh status
# Clients use it with DOCKER_HOST=unix:///run/idempay-docker.sock.
#
# Settings that work on these machines (Debian 12, cgroup v1 hybrid, no systemd, no iptables
# binary, shared with other users): cgroupfs driver, overlay2 (IDEMPAY_DOCKER_STORAGE=vfs if
# the data root's file system refuses it), no default bridge (--bridge=none: builds run with
# --network host, compose creates its own bridge network), and no iptables, IP forwarding or
# masquerading: published ports go through docker-proxy on loopback, the containers never
# need to reach beyond their own network, and the host's firewall and sysctls stay as they are.
set -euo pipefail
data_root="${IDEMPAY_DOCKER_ROOT:-/var/lib/idempay-docker}"
exec_root="${IDEMPAY_DOCKER_EXEC_ROOT:-/run/idempay-docker}"
sock="${IDEMPAY_DOCKER_SOCK:-/run/idempay-docker.sock}"
pidfile="${exec_root}.pid"
log="${IDEMPAY_DOCKER_LOG:-/var/log/idempay-docker.log}"
storage="${IDEMPAY_DOCKER_STORAGE:-overlay2}"
pools="${IDEMPAY_DOCKER_POOLS:-base=10.213.0.0/16,size=24}"
export DOCKER_HOST="unix://$sock"
packages=(docker.io debootstrap docker-compose)

running_pid() {  # the PID of our dockerd if it runs, else nothing
  local pid
  [ -s "$pidfile" ] || return 1
  pid="$(cat "$pidfile")"
  [ -d "/proc/$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = dockerd ] && echo "$pid"
}

why_not() {  # one line: why a private dockerd cannot run on this machine
  [ "$(id -u)" = 0 ] || { echo "not root (dockerd and debootstrap need root)"; return; }
  [ "$(uname -s)" = Linux ] || { echo "not Linux"; return; }
  if [ ! -e /sys/fs/cgroup/memory/memory.limit_in_bytes ] && [ ! -e /sys/fs/cgroup/cgroup.controllers ]; then
    echo "no cgroup file system mounted at /sys/fs/cgroup"; return
  fi
  grep -qw overlay /proc/filesystems || [ "$storage" != overlay2 ] \
    || { echo "the kernel has no overlay file system (IDEMPAY_DOCKER_STORAGE=vfs to use vfs)"; return; }
  command -v dockerd >/dev/null || command -v apt-get >/dev/null \
    || { echo "no dockerd and no apt-get to install docker.io"; return; }
  return 0
}

case "${1:-}" in
  check)
    reason="$(why_not)"
    [ -z "$reason" ] || { echo "$reason"; exit 1; }
    ;;
  install)
    missing=()
    command -v dockerd >/dev/null || missing+=(docker.io)
    command -v debootstrap >/dev/null || missing+=(debootstrap)
    docker compose version >/dev/null 2>&1 || command -v docker-compose >/dev/null || missing+=(docker-compose)
    [ "${#missing[@]}" -gt 0 ] || exit 0
    echo "dockerd.sh: apt-get install ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      "${missing[@]}" >/dev/null
    ;;
  start)
    if pid="$(running_pid)"; then
      echo "dockerd.sh: already running (PID $pid); stop it first" >&2; exit 1
    fi
    reason="$(why_not)"
    [ -z "$reason" ] || { echo "dockerd.sh: cannot start: $reason" >&2; exit 1; }
    mkdir -p "$data_root" "$exec_root" "$(dirname "$log")"
    echo '{}' >"$exec_root.json"  # its own (empty) config: /etc/docker/daemon.json is not read
    rm -f "$sock"
    # dockerd 20.10 writes an identity key to /etc/docker/key.json whatever its roots: if it
    # is not there yet, it is this engine's, and purge removes it (and /etc/docker if new).
    [ -d /etc/docker ] || touch "$data_root/.made-etc-docker"
    [ -e /etc/docker/key.json ] || touch "$data_root/.made-etc-docker-key.json"
    setsid dockerd \
      --config-file "$exec_root.json" \
      --data-root "$data_root" --exec-root "$exec_root" --pidfile "$pidfile" \
      --host "unix://$sock" \
      --exec-opt native.cgroupdriver=cgroupfs --storage-driver "$storage" \
      --bridge none --iptables=false --ip-forward=false --ip-masq=false \
      --default-address-pool "$pools" \
      >"$log" 2>&1 </dev/null &
    launched=$!
    for _ in $(seq 1 120); do
      docker version >/dev/null 2>&1 && break
      kill -0 "$launched" 2>/dev/null || { echo "dockerd.sh: dockerd exited; the end of $log:" >&2; tail -n 15 "$log" >&2; exit 1; }
      sleep 0.5
    done
    docker version >/dev/null 2>&1 || { echo "dockerd.sh: no answer after 60 s; $log" >&2; kill "$launched"; exit 1; }
    echo "dockerd.sh: dockerd $(docker version -f '{{.Server.Version}}') PID $(cat "$pidfile"), $storage, DOCKER_HOST=$DOCKER_HOST, log $log"
    ;;
  stop|purge)
    if pid="$(running_pid)"; then
      kill -TERM "$pid"
      for _ in $(seq 1 60); do [ -d "/proc/$pid" ] || break; sleep 0.5; done
      if [ -d "/proc/$pid" ]; then
        echo "dockerd.sh: PID $pid still there after 30 s: KILL" >&2
        kill -KILL "$pid"; sleep 1
      fi
      echo "dockerd.sh: stopped PID $pid"
    fi
    rm -f "$pidfile" "$sock" "$exec_root.json"
    if [ "$1" = purge ]; then
      # What dockerd leaves mounted once stopped is its own: the bind mount of the host's
      # network namespace (EXEC_ROOT/netns/default), always; the data root bound on itself
      # when a start fails. Unmounted deepest first. Then never remove a directory something
      # is still mounted under.
      findmnt -rn -o TARGET | grep -E "^($data_root|$exec_root)(/|$)" | sort -r \
        | while read -r target; do umount "$target" || true; done
      if findmnt -rn -o TARGET | grep -qE "^($data_root|$exec_root)(/|$)"; then
        echo "dockerd.sh: mounts remain under $data_root or $exec_root: not removed" >&2; exit 1
      fi
      [ ! -e "$data_root/.made-etc-docker-key.json" ] || rm -f /etc/docker/key.json
      [ ! -e "$data_root/.made-etc-docker" ] || rmdir /etc/docker 2>/dev/null || true
      rm -rf "$data_root" "$exec_root"
      echo "dockerd.sh: removed $data_root and $exec_root"
    fi
    ;;
  status)
    if pid="$(running_pid)"; then echo "running: PID $pid, DOCKER_HOST=$DOCKER_HOST"; else echo "not running"; exit 1; fi
    ;;
  *)
    echo "usage: $0 check|install|start|stop|purge|status" >&2; exit 2
    ;;
esac
