"""Fuzz the gateway from its OpenAPI document with many more cases than `make test` runs.

    .venv/bin/python bench/gateway_fuzz.py [--examples 1000] [--seed N]

Runs tests/gateway/test_gw_fuzz.py (schemathesis over real sockets: no 500, errors in
OpenAI's shape without echoes, no work past a deadline + 100 ms) with `--examples` cases per
operation, randomized with the printed seed, and prints the cases run per operation and how
long it took. A failure prints the seed to rerun it with; it becomes a regression test.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--examples", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=random.randrange(2**32))
    args = ap.parse_args()
    env = {**os.environ, "SWITCHYARD_FUZZ_EXAMPLES": str(args.examples), "RAY_ADDRESS": ""}
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        "-q",
        "tests/gateway/test_gw_fuzz.py",
        f"--hypothesis-seed={args.seed}",
        "--hypothesis-show-statistics",
    ]
    started = time.monotonic()
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    took = time.monotonic() - started
    out = done.stdout + done.stderr
    print(f"seed {args.seed}, up to {args.examples} cases per operation, {took:.0f} s, pytest exit {done.returncode}\n")
    # Hypothesis' statistics: one block per generated test, i.e. per operation, in the
    # document's order (chat completions first, then the others).
    blocks = re.split(r"\n(?=tests/gateway/test_gw_fuzz\.py::)", out)
    for i, block in enumerate(b for b in blocks if b.startswith("tests/gateway/test_gw_fuzz.py::")):
        name = block.split("\n", 1)[0].removeprefix("tests/gateway/test_gw_fuzz.py::").rstrip(":")
        counts = re.search(r"(\d+) passing, (\d+) failing, and (\d+) invalid", block)
        stop = re.search(r"Stopped because (.*)", block)
        if counts:
            print(
                f"#{i} {name:50} passing {counts[1]:>5}  failing {counts[2]:>3}  invalid {counts[3]:>4}"
                f"  ({stop[1] if stop else '?'})"
            )
    failures = [line for line in out.splitlines() if line.startswith(("E   ", "case = "))]
    if failures:
        print("\nfailures (each becomes a regression test):\n" + "\n".join(failures[:40]))
    print("\n" + "\n".join(out.strip().splitlines()[-3:]))
    print(f"\nreproduce: .venv/bin/python bench/gateway_fuzz.py --examples {args.examples} --seed {args.seed}")
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
