#!/usr/bin/env bash
# A throwaway local Postgres server for the stores' tests.
#
#   eval "$(scripts/postgres.sh)"        # install if missing, start (or reuse), print the export
#   scripts/postgres.sh restart          # restart it (cutting every connection), back once it accepts them
#   scripts/postgres.sh stop             # stop it and delete its data
#
# Prints `export SWITCHYARD_TEST_POSTGRES_URL=postgresql://...` on stdout (everything else goes
# to stderr, so `eval` sees only the export). Idempotent: a second call reuses the running server.
# The cluster lives in $SWITCHYARD_PG_DIR (default /tmp/switchyard-pg), owned by the `postgres`
# user because initdb refuses to run as root; it listens on 127.0.0.1:$SWITCHYARD_PG_PORT
# (default 25432) with trust auth for local TCP only: a test server, never a deployment.
set -euo pipefail

PGDIR=${SWITCHYARD_PG_DIR:-/tmp/switchyard-pg}
# Below the ephemeral range (32768-60999) and above Ray's worker ports (10002-19999), so no
# outgoing connection or Ray process can be holding it when the server starts.
PORT=${SWITCHYARD_PG_PORT:-25432}
DB=switchyard_test
URL="postgresql://postgres@127.0.0.1:${PORT}/${DB}"
SERVER_OPTS="-c listen_addresses=127.0.0.1 -p ${PORT} -k ${PGDIR} -c fsync=on"

say() { echo "postgres.sh: $*" >&2; }

find_bin() {
  local d
  for d in /usr/lib/postgresql/*/bin; do
    if [ -x "$d/pg_ctl" ]; then echo "$d"; return 0; fi
  done
  return 1
}

as_owner() {
  # Run as the cluster's owner: `postgres` when we are root, else ourselves.
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

install_server() {
  [ "$(id -u)" = 0 ] || { say "the Postgres server is missing and installing it needs root"; exit 1; }
  say "installing the postgresql server package (apt-get)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q postgresql >&2 || { apt-get update -q >&2 && apt-get install -y -q postgresql >&2; }
}

BIN=$(find_bin) || { install_server; BIN=$(find_bin); }

if [ "${1:-start}" = stop ]; then
  if [ -f "$PGDIR/data/PG_VERSION" ]; then
    as_owner "$BIN/pg_ctl" -D "$PGDIR/data" -m fast stop >&2 || say "server was not running"
  fi
  rm -rf "$PGDIR"
  say "stopped; removed $PGDIR"
  exit 0
fi

if [ "${1:-start}" = restart ]; then
  [ -f "$PGDIR/data/PG_VERSION" ] || { say "no server in $PGDIR to restart (run: scripts/postgres.sh start)"; exit 1; }
  # -m fast: every open connection is cut, as a crash or a failover would; -w: back once it is up.
  if ! as_owner "$BIN/pg_ctl" -D "$PGDIR/data" -l "$PGDIR/server.log" -m fast -w -t 180 \
      -o "$SERVER_OPTS" restart >&2; then
    say "the server did not restart; its log:"
    tail -n 30 "$PGDIR/server.log" >&2 || true
    exit 1
  fi
  "$BIN/pg_isready" -q -h 127.0.0.1 -p "$PORT" -t 60 || { say "the server restarted but refuses connections"; exit 1; }
  say "restarted"
  exit 0
fi

if [ ! -f "$PGDIR/data/PG_VERSION" ]; then
  mkdir -p "$PGDIR"
  [ "$(id -u)" = 0 ] && chown postgres: "$PGDIR"
  as_owner "$BIN/initdb" -D "$PGDIR/data" -U postgres --auth=trust -E UTF8 >/dev/null
fi

if ! as_owner "$BIN/pg_ctl" -D "$PGDIR/data" status >/dev/null 2>&1; then
  # -t 180: a loaded 2-core machine can take well over pg_ctl's default 60 s.
  if ! as_owner "$BIN/pg_ctl" -D "$PGDIR/data" -l "$PGDIR/server.log" -w -t 180 \
      -o "$SERVER_OPTS" start >&2; then
    say "the server did not start; its log:"
    tail -n 30 "$PGDIR/server.log" >&2 || true
    exit 1
  fi
fi

if ! as_owner "$BIN/psql" -h 127.0.0.1 -p "$PORT" -U postgres -tAc \
    "SELECT 1 FROM pg_database WHERE datname = '${DB}'" postgres | grep -q 1; then
  as_owner "$BIN/createdb" -h 127.0.0.1 -p "$PORT" -U postgres "$DB"
fi

echo "export SWITCHYARD_TEST_POSTGRES_URL=${URL}"
