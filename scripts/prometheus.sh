#!/usr/bin/env bash
# A throwaway local Prometheus server for the dashboards' check (tests/platform/prometheus_check.py).
#
#   scripts/prometheus.sh install                # install Debian's prometheus if missing (root only)
#   scripts/prometheus.sh start CONFIG DATA_DIR  # start one; prints "PID PORT" on stdout once it is ready
#   scripts/prometheus.sh stop PID               # stop the server `start` printed (its data dir stays)
#
# `start` installs first when the binary is missing. The server listens on 127.0.0.1 only, on a
# free listener port (switchyard.ports: below the ephemeral range, above Ray's worker ports), and
# logs to DATA_DIR/prometheus.log. Everything but the "PID PORT" line goes to stderr. The Debian
# package's own service (port 9090) is never left running: nothing here uses it.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${SWITCHYARD_PROMETHEUS_BIN:-/usr/bin/prometheus}
PYTHON=${PYTHON:-$ROOT/.venv/bin/python}
READY_TIMEOUT_S=${SWITCHYARD_PROMETHEUS_READY_TIMEOUT_S:-60}

say() { echo "prometheus.sh: $*" >&2; }

install_server() {
  [ -x "$BIN" ] && return 0
  [ "$(id -u)" = 0 ] || { say "$BIN is missing and installing Debian's prometheus package needs root"; exit 1; }
  say "installing Debian's prometheus package (apt-get)"
  # The package starts its service on install; a policy-rc.d that answers 101 ("action forbidden")
  # stops that, as Debian's chroots and container images do. One already there is left alone.
  local policy=/usr/sbin/policy-rc.d placed=0
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && placed=1
  fi
  export DEBIAN_FRONTEND=noninteractive
  local ok=0
  apt-get install -y -q --no-install-recommends prometheus >&2 \
    || { apt-get update -q >&2 && apt-get install -y -q --no-install-recommends prometheus >&2; } || ok=$?
  [ "$placed" = 1 ] && rm -f "$policy"
  [ "$ok" = 0 ] || { say "apt-get could not install prometheus"; exit 1; }
  [ -x "$BIN" ] || { say "the prometheus package is installed but $BIN is not there"; exit 1; }
  # Where systemd runs, the unit is also enabled for the next boot: a test server is not a service.
  if [ -d /run/systemd/system ]; then
    systemctl disable --now prometheus >&2 || say "could not stop the prometheus service"
  fi
}

is_ours() {
  # PID is a live Prometheus process (not a PID reused by something else since `start`).
  [ -r "/proc/$1/comm" ] && [ "$(cat "/proc/$1/comm")" = prometheus ]
}

stop_server() {
  local pid=$1
  [[ "$pid" =~ ^[0-9]+$ ]] || { say "stop: '$pid' is not a PID"; exit 1; }
  if ! is_ours "$pid"; then
    say "stop: no Prometheus runs as PID $pid (already stopped)"
    return 0
  fi
  kill -TERM "$pid"
  # Prometheus flushes its head block on SIGTERM: seconds at most for a test's data.
  for _ in $(seq 1 100); do
    is_ours "$pid" || { say "stopped PID $pid"; return 0; }
    sleep 0.1
  done
  say "PID $pid ignored SIGTERM for 10 s; killing it"
  kill -KILL "$pid" 2>/dev/null || true
}

start_server() {
  local config=$1 data=$2 port pid tries
  [ -f "$config" ] || { say "start: no config file at $config"; exit 1; }
  if command -v promtool >/dev/null; then  # the same package ships it
    promtool check config "$config" >&2 || { say "start: $config is not a valid Prometheus config"; exit 1; }
  fi
  mkdir -p "$data"
  for tries in 1 2 3; do
    port=$(PYTHONPATH="$ROOT/platform" "$PYTHON" -c 'from switchyard.ports import listener_port; print(listener_port())')
    # stdin, stdout and stderr all leave the caller's pipes, so a caller that reads this
    # script's output to its end (subprocess.run) is not held open by the server.
    "$BIN" --config.file="$config" --storage.tsdb.path="$data" --web.listen-address="127.0.0.1:$port" \
      --storage.tsdb.retention.time=1d --log.level=warn </dev/null >>"$data/prometheus.log" 2>&1 &
    pid=$!
    for _ in $(seq 1 $((READY_TIMEOUT_S * 10))); do
      if ! kill -0 "$pid" 2>/dev/null; then break; fi
      if curl -fsS -o /dev/null --max-time 1 "http://127.0.0.1:$port/-/ready" 2>/dev/null; then
        say "ready on 127.0.0.1:$port (PID $pid, data $data)"
        echo "$pid $port"
        return 0
      fi
      sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
      stop_server "$pid"
      say "not ready within ${READY_TIMEOUT_S}s; its log:"
      tail -n 20 "$data/prometheus.log" >&2 || true
      exit 1
    fi
    # Exited. Another listener may have taken the port between the draw and the bind: draw again.
    say "exited before it was ready (try $tries); its log:"
    tail -n 5 "$data/prometheus.log" >&2 || true
    grep -q "address already in use" "$data/prometheus.log" || exit 1
  done
  exit 1
}

case "${1:-}" in
  install) install_server ;;
  start)
    [ $# = 3 ] || { say "usage: $0 start CONFIG DATA_DIR"; exit 2; }
    install_server
    start_server "$2" "$3"
    ;;
  stop)
    [ $# = 2 ] || { say "usage: $0 stop PID"; exit 2; }
    stop_server "$2"
    ;;
  *) say "usage: $0 install | start CONFIG DATA_DIR | stop PID"; exit 2 ;;
esac
