"""The audit spool's loss bound, measured: SIGKILL a writer under load, then recover.

    .venv/bin/python bench/audit_spool_kill.py [--runs 3] [--drain-interval 0.2]

Each run starts tests/audit/_audit_spool_writer.py (every 4th request high-risk and durable,
the rest spooled; redaction and encryption on), kills it with SIGKILL after 2-4 s, and reports:
  acked        records whose `record()` returned (a response could have been sent)
  at risk      acknowledged records only in the spool file at the kill: what a *host* crash
               at that instant would have lost (a process crash loses none of them)
  window       how old the oldest at-risk record was at the kill, in seconds
  lost         acknowledged records missing after `recover_orphans` (must be 0)
  dup          records stored twice (must be 0)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "platform")]

from switchyard.audit.spool import recover_orphans  # noqa: E402
from switchyard.audit.store import AuditStore  # noqa: E402


def one_run(tmp: Path, drain_interval: float) -> dict[str, float]:
    state, ack = tmp / "state", tmp / "acks.txt"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "platform"), str(ROOT / "tests" / "audit")]),
        "SWITCHYARD_AUDIT_DRAIN_INTERVAL": str(drain_interval),
    }
    writer = ROOT / "tests" / "audit" / "_audit_spool_writer.py"
    proc = subprocess.Popen([sys.executable, str(writer), str(state), str(ack)], env=env)
    while not ack.exists():
        time.sleep(0.05)
    time.sleep(random.uniform(2, 4))
    proc.send_signal(signal.SIGKILL)
    killed_at = time.time()
    proc.wait()
    acked = {line.split()[0] for line in ack.read_text().splitlines() if line.count(" ") == 2}
    spool = state / "audit" / "spool"
    at_risk = []
    for path in spool.glob("*.spool"):
        for raw in path.read_bytes().splitlines():
            try:
                at_risk.append(json.loads(raw)["record"]["time"])
            except ValueError:
                continue  # a torn line: never acknowledged
    store = AuditStore.in_state_dir(state)
    recover_orphans(spool, store)
    stored = [e.entry.request_id for e in store.find(limit=1_000_000)]
    assert store.verify() == [], "the chain does not verify"
    return {
        "acked": len(acked),
        "at_risk": len(at_risk),
        "window_s": killed_at - min(at_risk) if at_risk else 0.0,
        "lost": len(acked - set(stored)),
        "dup": len(stored) - len(set(stored)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--drain-interval", type=float, default=0.2)
    args = parser.parse_args()
    print(f"{'run':>3} {'acked':>6} {'at risk':>8} {'window s':>9} {'lost':>5} {'dup':>4}")
    for n in range(1, args.runs + 1):
        with tempfile.TemporaryDirectory() as d:
            r = one_run(Path(d), args.drain_interval)
        print(f"{n:>3} {r['acked']:>6} {r['at_risk']:>8} {r['window_s']:>9.3f} {r['lost']:>5} {r['dup']:>4}")
    print(
        f"reproduce: .venv/bin/python bench/audit_spool_kill.py --runs {args.runs} "
        f"--drain-interval {args.drain_interval}"
    )


if __name__ == "__main__":
    main()
