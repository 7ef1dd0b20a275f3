"""The planner's math is pure Python: importing it pulls in neither torch nor Ray."""

from __future__ import annotations

import subprocess
import sys


def test_plan_imports_neither_torch_nor_ray() -> None:
    code = (
        "import sys; import switchyard.train.plan as p; "
        "p.plan(p.model_preset('llama3-70b'), p.ClusterSpec(gpus=64), p.TrainingJob()); "
        "bad = [m for m in ('torch', 'ray', 'deepspeed') if m in sys.modules]; "
        "sys.exit(f'imported {bad}' if bad else 0)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=None, cwd=None, check=False, timeout=60)
    assert done.returncode == 0, done.stderr
