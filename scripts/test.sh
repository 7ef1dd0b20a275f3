#!/usr/bin/env bash
# The test command (`make test`, and what CI runs): static checks, then the whole suite,
# with every service the tests need (a local Postgres) started here, not by hand.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh

echo "== static checks: ruff, import contracts, mypy"
.venv/bin/ruff check platform serve_apps train_jobs tests bench
.venv/bin/lint-imports --config pyproject.toml
.venv/bin/mypy
[ "${1:-}" = "--lint-only" ] && exit 0

echo "== services: local Postgres for the ledger tests"
# Captured first so that a server that fails to start fails this script (set -e), rather
# than an empty eval letting the Postgres tests run without it.
pg_env=$(bash scripts/postgres.sh start)
eval "$pg_env"
trap 'bash scripts/postgres.sh stop >/dev/null 2>&1 || true' EXIT
echo "== services: Chromium (the console's browser test) and Prometheus (the dashboards' check)"
bash scripts/chromium.sh >/dev/null
bash scripts/prometheus.sh install

echo "== tests"
# Ray workers inherit this; a test never attaches to a cluster it did not start.
export RAY_ADDRESS=
# The slowest tests are listed at the end: the suite's budget is about 30 minutes on 2 cores.
.venv/bin/python -m pytest -p no:cacheprovider --durations=30 "$@"
