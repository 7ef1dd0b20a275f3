"""The ledger on SQLite and on a real Postgres: all-or-nothing holds, exact charges, idempotency,
expiry of a dead replica's holds, trimming, soft alerts and period roll-over."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from switchyard.budgets.ledger import (
    BudgetLedger,
    Charge,
    HoldGranted,
    HoldRefused,
    HoldRequest,
    UnknownHold,
)
from switchyard.budgets.resolve import BudgetLine
from switchyard.db.engine import SQLITE_PREFIX, PostgresDatabase, SqliteDatabase

ORG = BudgetLine("org:acme:day:2026-11-30", 1_000, "2026-12-01T00:00:00+00:00", (0.5, 0.9))
TEAM = BudgetLine("team:support:day:2026-11-30", 300, "2026-12-01T00:00:00+00:00")


def hold(
    hid: str,
    amount: int,
    lines: tuple[BudgetLine, ...] = (ORG, TEAM),
    want: int | None = None,
    ttl: float = 60.0,
    holder: str = "r1",
) -> HoldRequest:
    return HoldRequest(hid, holder, lines, amount, amount if want is None else want, ttl)


def charge(cid: str, nanos: int, day: str = "2026-11-30") -> Charge:
    return Charge(cid, "support", "reply", "gpt-4o-mini", None, day, nanos, 10, 5)


def status(ledger: BudgetLedger) -> dict[str, tuple[int, int]]:
    return {s.key: (s.spent_nanos, s.reserved_nanos) for s in ledger.lines()}


def test_hold_is_all_or_nothing_and_names_the_line_that_refused(ledger: BudgetLedger) -> None:
    assert ledger.hold(hold("a", 200)) == HoldGranted("a", 200)
    refused = ledger.hold(hold("b", 200))
    # The team line (300) refuses; the org line (1000) would have fit, and holds nothing either.
    assert refused == HoldRefused(TEAM.key, 200, 300, TEAM.resets_at)
    assert status(ledger) == {ORG.key: (0, 200), TEAM.key: (0, 200)}


def test_settle_moves_reserved_to_spent_lower_and_higher_than_estimate(ledger: BudgetLedger) -> None:
    ledger.hold(hold("low", 100))
    ledger.settle("low", [charge("low", 60)], close=True)  # cheaper than the estimate
    assert status(ledger) == {ORG.key: (60, 0), TEAM.key: (60, 0)}
    ledger.hold(hold("high", 100))
    ledger.settle("high", [charge("high", 130)], close=True)  # dearer: the money was spent anyway
    assert status(ledger) == {ORG.key: (190, 0), TEAM.key: (190, 0)}
    assert ledger.charged_nanos() == 190
    # 110 left on the team line: a 111 hold is refused, a 110 one fits exactly.
    assert isinstance(ledger.hold(hold("c", 111)), HoldRefused)
    assert ledger.hold(hold("d", 110)) == HoldGranted("d", 110)


def test_settle_and_hold_are_idempotent(ledger: BudgetLedger) -> None:
    assert ledger.hold(hold("a", 100)) == HoldGranted("a", 100)
    assert ledger.hold(hold("a", 100)) == HoldGranted("a", 100)  # a retry reserves nothing more
    ledger.settle("a", [charge("a", 80)], close=True)
    ledger.settle("a", [charge("a", 80)], close=True)  # retried after a lost reply
    assert status(ledger) == {ORG.key: (80, 0), TEAM.key: (80, 0)}
    with pytest.raises(UnknownHold):
        ledger.settle("never", [], close=True)


def test_lease_settles_many_charges_and_trim_returns_all_but_in_flight(ledger: BudgetLedger) -> None:
    assert ledger.hold(hold("lease", 10, want=250)) == HoldGranted("lease", 250)
    ledger.settle("lease", [charge("r1", 10), charge("r2", 10)], close=False)
    assert status(ledger)[TEAM.key] == (20, 230)
    ledger.settle("lease", [charge("r3", 10)], close=False, keep_nanos=20)  # two still in flight
    assert status(ledger)[TEAM.key] == (30, 20)
    ledger.settle("lease", [charge("r4", 10), charge("r5", 15)], close=True)
    assert status(ledger)[TEAM.key] == (55, 0)


def test_a_lease_takes_at_most_its_share_of_the_headroom(ledger: BudgetLedger) -> None:
    req = HoldRequest("l1", "r1", (TEAM,), 10, 1_000, 60, max_share=0.25)
    assert ledger.hold(req) == HoldGranted("l1", 75)  # a quarter of 300
    tiny = HoldRequest("l2", "r1", (TEAM,), 200, 1_000, 60, max_share=0.01)
    assert ledger.hold(tiny) == HoldGranted("l2", 200)  # never less than the minimum asked


def test_expired_holds_of_a_dead_replica_are_released_and_late_charges_still_count(
    ledger: BudgetLedger,
) -> None:
    now = [1_000.0]
    ledger._clock = lambda: now[0]
    ledger.hold(hold("dead", 100, ttl=5, holder="dead-replica"))
    ledger.hold(hold("alive", 100, ttl=5, holder="live-replica"))
    now[0] += 4
    assert ledger.renew("live-replica", 5) == 1
    now[0] += 2
    assert ledger.expire() == ["dead"]
    assert status(ledger)[TEAM.key] == (0, 100)
    ledger.settle("dead", [charge("late", 40)], close=True)  # it did call the provider
    assert status(ledger)[TEAM.key] == (40, 100)
    assert ledger.open_holds() == 1


def test_soft_alerts_fire_once_per_threshold(ledger: BudgetLedger) -> None:
    ledger.hold(hold("a", 600, lines=(ORG,)))
    assert ledger.settle("a", [charge("a", 400)], close=False) == []
    alerts = ledger.settle("a", [charge("b", 150)], close=False)
    assert [(a.key, a.threshold) for a in alerts] == [(ORG.key, 0.5)]
    assert ledger.settle("a", [charge("c", 10)], close=False) == []
    alerts = ledger.settle("a", [charge("d", 400)], close=True)
    assert [(a.key, a.threshold) for a in alerts] == [(ORG.key, 0.9)]


def test_a_new_period_is_a_new_line(ledger: BudgetLedger) -> None:
    tomorrow = BudgetLine("team:support:day:2026-12-01", 300, "2026-12-02T00:00:00+00:00")
    ledger.hold(hold("today", 300, lines=(TEAM,)))
    assert isinstance(ledger.hold(hold("more", 1, lines=(TEAM,))), HoldRefused)
    assert ledger.hold(hold("tomorrow", 300, lines=(tomorrow,))) == HoldGranted("tomorrow", 300)


def test_spend_report_groups_by_team_flow_model_day(ledger: BudgetLedger) -> None:
    ledger.hold(hold("a", 300, lines=(ORG,)))
    ledger.settle("a", [charge("x", 10), charge("y", 20), charge("z", 5, day="2026-11-29")], close=True)
    rows = ledger.spend()
    assert [(r.day, r.nanos, r.requests) for r in rows] == [("2026-11-29", 5, 1), ("2026-11-30", 30, 2)]
    assert ledger.spend(team="payments") == []
    assert [r.day for r in ledger.spend(since_day="2026-11-30")] == ["2026-11-30"]


def test_concurrent_connections_never_overspend(ledger: BudgetLedger) -> None:
    """Several threads, each with its own connection, race for a 300 line."""
    db = ledger.db

    def other() -> BudgetLedger:
        if isinstance(db, PostgresDatabase):
            return BudgetLedger(PostgresDatabase(db.url))
        return BudgetLedger(SqliteDatabase(Path(db.url[len(SQLITE_PREFIX) :])))

    ledgers = [other() for _ in range(4)]
    granted: list[str] = []
    lock = threading.Lock()

    def worker(n: int) -> None:
        for i in range(10):
            hid = f"{n}-{i}"
            if isinstance(ledgers[n].hold(hold(hid, 10)), HoldGranted):
                ledgers[n].settle(hid, [charge(hid, 10)], close=True)
                with lock:
                    granted.append(hid)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for other_ledger in ledgers:
        other_ledger.db.close()
    assert len(granted) == 30  # 40 tried, exactly 300 / 10 fit
    assert status(ledger)[TEAM.key] == (300, 0)


def test_a_requests_charges_are_found_by_its_id_first_to_last_and_no_others(ledger: BudgetLedger) -> None:
    """`charges_of` (the audit recovery's view of what a cut-off stream was charged): every
    charge of a request, in attempt order across pages of lookups, and none of a request whose
    id merely starts the same way."""
    assert ledger.hold(hold("h", 200)) == HoldGranted("h", 200)
    many = [charge("req-1" if i == 1 else f"req-1.{i}", i) for i in range(1, 20)]  # more than a page
    others = [charge("req-10", 7), charge("req-1x", 8), charge("req-10.2", 9)]
    ledger.settle("h", [*others, *reversed(many)], close=True)
    found = ledger.charges_of(["req-1", "req-10", "req-2"])
    assert found["req-1"] == many
    assert found["req-10"] == [others[0], others[2]]
    assert "req-2" not in found  # never charged
