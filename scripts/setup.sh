#!/usr/bin/env bash
# Creates .venv at the repo root and installs switchyard with every dependency, pinned.
# Idempotent: a second run with unchanged inputs only checks the machine and a stamp, and exits.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=.venv
PY=${PYTHON:-python3}
PY_WANT=3.11  # pyproject.toml requires-python = ">=3.11,<3.12"
STAMP=$VENV/.switchyard-installed

# What the machine must have, checked before anything is installed and on every run (it takes
# milliseconds): each missing piece is named with the apt-get line that adds it, rather than
# pip failing half-way through an install. An existing venv's interpreter is the one checked.
problems=() packages=()
lacks() { problems+=("$1"); packages+=("$2"); }
py=$PY
[ -x "$VENV/bin/python" ] && py=$VENV/bin/python
if ! command -v "$py" >/dev/null 2>&1; then
  lacks "no $py: switchyard needs Python $PY_WANT" "python$PY_WANT python$PY_WANT-venv"
elif ! have=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])') || [ "$have" != "$PY_WANT" ]; then
  lacks "$py is Python ${have:-?}; switchyard needs $PY_WANT (rerun with PYTHON=python$PY_WANT)" \
    "python$PY_WANT python$PY_WANT-venv"
elif [ "$py" = "$PY" ] && ! "$py" -c 'import venv, ensurepip' 2>/dev/null; then
  lacks "$py cannot create a virtual environment (no venv/ensurepip module)" "python$PY_WANT-venv"
fi
command -v make >/dev/null 2>&1 || lacks "no make (make setup, make test, make demo)" "make"
if ! command -v c++ >/dev/null 2>&1 && ! command -v g++ >/dev/null 2>&1; then
  lacks "no C++ compiler (c++ or g++): DeepSpeed compiles its ops with it" "build-essential"
fi
if [ ${#problems[@]} -gt 0 ]; then
  {
    echo "setup: this machine lacks what switchyard needs; nothing was installed:"
    printf '  - %s\n' "${problems[@]}"
    echo "setup: install it (as root), then run this again:"
    echo "  apt-get install -y ${packages[*]}"
  } >&2
  exit 1
fi

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
