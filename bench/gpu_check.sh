#!/usr/bin/env bash
# The trainer on one GPU (H200 class) in under 5 minutes: bf16 FSDP2 on the 1b preset (MFU,
# tokens/s, peak memory against the planner), CUDA prefetch on/off, torch.compile on/off.
#
#   bash bench/gpu_check.sh            # on the GPU machine, with its own CUDA torch
#   bash bench/gpu_check.sh --cpu      # the same sections as a CPU smoke run
#
# Uses the machine's python (PYTHON=... to choose) and its CUDA torch; no Ray, no network.
# Besides torch it needs two pure-Python wheels the trainer's spec imports: pydantic
# (+ pydantic-core, annotated-types, typing-inspection) and pyyaml. Without network, bring
# them as files and set WHEELS=dir: `pip download pydantic pyyaml -d dir` on a connected
# machine of the same platform and Python version.
#
# Each section runs in its own process under a time box and prints its rows as it finishes;
# a section that fails or runs out of time prints a row saying so and the next one runs.
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
CPU_FLAG=""
[ "${1:-}" = "--cpu" ] && CPU_FLAG="--cpu"

missing=$("$PY" - <<'EOF'
import importlib.util
print(" ".join(m for m in ("torch", "pydantic", "yaml") if importlib.util.find_spec(m) is None))
EOF
)
if [[ " $missing " == *" torch "* ]]; then
    echo "gpu_check: $PY has no torch; run it with the machine's CUDA torch (PYTHON=/path/to/python)" >&2
    exit 1
elif [ -n "$missing" ] && [ -n "${WHEELS:-}" ]; then
    "$PY" -m pip install --no-index --find-links "$WHEELS" pydantic pyyaml >/dev/null || exit 1
elif [ -n "$missing" ]; then
    echo "gpu_check: missing Python modules: $missing (pip install pydantic pyyaml, or WHEELS=dir of wheels)" >&2
    exit 1
fi
if [ -z "$CPU_FLAG" ]; then
    command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    "$PY" -c "import torch; assert torch.cuda.is_available(), 'this torch has no CUDA'; print('torch', torch.__version__, 'cuda', torch.version.cuda)" || exit 1
fi

# Seconds per section, 285 s in all: model build (~1B parameters initialised on the host),
# warm-up and timed steps; compile builds two models and compiles a block's forward and backward.
boxes=("fsdp:60" "prefetch:75" "compile:150")
header="--header"
for box in "${boxes[@]}"; do
    section="${box%%:*}"
    seconds="${box##*:}"
    started=$(date +%s)
    timeout --kill-after=10 "$seconds" "$PY" bench/gpu_check.py --section "$section" $CPU_FLAG $header 2>"/tmp/gpu_check.$section.log"
    status=$?
    header=""
    if [ "$status" -ne 0 ]; then
        reason="exit $status, log /tmp/gpu_check.$section.log"
        [ "$status" -eq 124 ] || [ "$status" -eq 137 ] && reason="over its ${seconds}s box"
        echo "| $section | failed | | | | | $reason |"
    fi
    echo "# $section: $(( $(date +%s) - started )) s" >&2
done
