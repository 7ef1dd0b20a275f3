"""Python run as on a host whose wall clock is off: a separate process whose `time.time()` is
moved by a set amount before anything else is imported, as the host's clock would be (stop 48:
what replicas, consoles and CLIs on several hosts decide when their clocks disagree)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
_PRELUDE = "import time\n_wall = time.time\ntime.time = lambda: _wall() + {skew!r}\n"


def on_a_skewed_host(skew_s: float, script: str, *args: str) -> str:
    """Run `script` (its arguments in `sys.argv[1:]`) with the clock `skew_s` seconds off; its
    standard output. A failing script fails the test with its standard error."""
    done = subprocess.run(
        [sys.executable, "-c", _PRELUDE.format(skew=float(skew_s)) + script, *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout
