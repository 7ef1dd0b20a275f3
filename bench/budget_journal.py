"""What the leased gate's charge journal costs per request, side by side in one run: no
journal, and the journal (a reservation line at reserve, a charge line at settle).

    .venv/bin/python bench/budget_journal.py [--requests 400] [--rounds 3]

One in-process gate over a SQLite ledger in a temp dir, no flushes during the run (charges
stay local), `reserve` + `settle` of a 1-turn request per iteration, timed per request. The
request count stays under the shipped per-team rate limit.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "platform"))
sys.path.insert(0, str(ROOT / "tests" / "budgets"))

from _budget_helpers import shipped, wall_clock_ctx  # noqa: E402  (the tests' shipped-policy helpers)

from switchyard.budgets.admission import Admissions  # noqa: E402
from switchyard.budgets.charge_journal import ChargeJournal  # noqa: E402
from switchyard.budgets.leased_gate import LeaseConfig, LeasedBudgetGate  # noqa: E402
from switchyard.budgets.ledger import BudgetLedger  # noqa: E402
from switchyard.budgets.service import InProcessLedgerClient, LedgerService  # noqa: E402
from switchyard.db.engine import SqliteDatabase  # noqa: E402
from switchyard.gateway.seams import Bill, Usage  # noqa: E402


async def per_request_us(journal: bool, requests: int) -> float:
    tmp = Path(tempfile.mkdtemp(prefix="budget-journal-"))
    policy = shipped()
    gate = LeasedBudgetGate(
        Admissions(lambda: policy),
        InProcessLedgerClient(LedgerService(BudgetLedger(SqliteDatabase(tmp / "ledger.db")))),
        "bench",
        LeaseConfig(flush_every_s=3600, flush_batch=10**6),
        journal=ChargeJournal(tmp / "journal", "bench") if journal else None,
    )
    contexts = [wall_clock_ctx(policy) for _ in range(requests)]
    estimate = await gate.estimate(contexts[0], "gpt-4o-mini", [{"role": "user", "content": "hi"}], 16)
    samples = []
    for ctx in contexts:
        started = time.perf_counter()
        reservation = await gate.reserve(ctx, estimate)
        await gate.settle(reservation, [Bill("gpt-4o-mini", Usage(10, 5), 1000)])
        samples.append(time.perf_counter() - started)
    return statistics.median(samples) * 1e6


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print("| round | no journal, p50 us | journal, p50 us | ratio |")
    print("|---|---|---|---|")
    for n in range(1, args.rounds + 1):
        bare = await per_request_us(False, args.requests)
        journaled = await per_request_us(True, args.requests)
        print(f"| {n} | {bare:.1f} | {journaled:.1f} | {journaled / bare:.2f} |")
    print(f"\nreproduce: .venv/bin/python bench/budget_journal.py --requests {args.requests} --rounds {args.rounds}")


if __name__ == "__main__":
    asyncio.run(main())
