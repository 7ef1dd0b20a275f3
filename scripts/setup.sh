#!/usr/bin/env bash
# Creates .venv at the repo root and installs switchyard with every dependency, pinned.
# Idempotent: a second run with unchanged inputs only checks a stamp and exits.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=.venv
PY=${PYTHON:-python3}
STAMP=$VENV/.switchyard-installed
# The stamp is the hash of every file that decides what gets installed.
want=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then
  exit 0
fi

[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP="$VENV/bin/python -m pip --disable-pip-version-check --no-input"

# torch first, exactly this version: its CPU wheel is on these machines; anything looser
# pulls a multi-GB CUDA build.
$PIP install -q torch==2.13.0
# DeepSpeed is built against the installed torch, with its CPU shared-memory collective
# op compiled now rather than (35-60 s, sometimes repeatedly) at the first engine start.
if ! "$VENV/bin/python" -c "import deepspeed" 2>/dev/null; then
  $PIP install -q setuptools wheel packaging ninja py-cpuinfo psutil
  DS_BUILD_OPS=0 DS_BUILD_SHM_COMM=1 $PIP install -q --no-build-isolation --no-cache-dir deepspeed==0.19.8
fi
$PIP install -q -e ".[dev]"
echo "$want" > "$STAMP"
