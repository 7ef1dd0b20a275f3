"""The budget ledger: holds (reservations) on every applicable budget at once, then charges.

A *hold* reserves money on a set of budget lines, all or nothing; a *charge* records what a
call actually cost and moves money from reserved to spent. One mechanism serves both gate
designs: a plain gate takes one hold per request (min = want = the estimate) and settles it
with one charge; a leasing replica takes a larger hold (a lease) and settles many charges
against it. Every operation is idempotent by id (hold id, charge id), so a caller may retry
after a crash or an actor restart without double-counting.

Invariant, per budget line: `reserved = sum over open holds of max(amount - used, 0)` and
`spent = sum of charges`. A hold is granted only if `spent + reserved + min <= limit` on every
line; so total charges exceed a limit only by what calls cost beyond their estimate.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from switchyard.budgets.resolve import BudgetLine
from switchyard.db.engine import Database, Transaction
from switchyard.db.migrations import Migration, Schema, prepare

log = logging.getLogger(__name__)

_V1 = (
    """CREATE TABLE IF NOT EXISTS budget_lines (
        key            TEXT PRIMARY KEY,
        limit_nanos    BIGINT NOT NULL,
        resets_at      TEXT NOT NULL,
        soft_alerts    TEXT NOT NULL DEFAULT '[]',
        spent_nanos    BIGINT NOT NULL DEFAULT 0,
        reserved_nanos BIGINT NOT NULL DEFAULT 0,
        alerted        DOUBLE PRECISION NOT NULL DEFAULT 0
    )""",
    """CREATE TABLE IF NOT EXISTS holds (
        hold_id      TEXT PRIMARY KEY,
        holder       TEXT NOT NULL,
        keys         TEXT NOT NULL,
        amount_nanos BIGINT NOT NULL,
        used_nanos   BIGINT NOT NULL DEFAULT 0,
        created_at   DOUBLE PRECISION NOT NULL,
        expires_at   DOUBLE PRECISION NOT NULL,
        is_open      INTEGER NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS holds_open_expiry ON holds (is_open, expires_at)",
    """CREATE TABLE IF NOT EXISTS charges (
        charge_id         TEXT PRIMARY KEY,
        hold_id           TEXT NOT NULL,
        team              TEXT NOT NULL,
        flow              TEXT NOT NULL,
        model             TEXT NOT NULL,
        end_user          TEXT,
        day               TEXT NOT NULL,
        nanos             BIGINT NOT NULL,
        prompt_tokens     BIGINT NOT NULL,
        completion_tokens BIGINT NOT NULL,
        cached_tokens     BIGINT NOT NULL,
        at                DOUBLE PRECISION NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS charges_team_day ON charges (team, day)",
)
SCHEMA = Schema("ledger", (Migration(1, _V1),))


class UnknownHold(Exception):
    """A settle named a hold the ledger never granted: a bug in the caller."""


@dataclass(frozen=True)
class HoldRequest:
    hold_id: str
    holder: str  # the replica that owns the hold; its holds expire if it stops renewing
    lines: tuple[BudgetLine, ...]
    min_nanos: int  # refuse unless at least this much fits on every line
    want_nanos: int  # grant up to this much
    ttl_s: float
    max_share: float = 1.0  # a lease takes at most this fraction of the smallest headroom


@dataclass(frozen=True)
class HoldGranted:
    hold_id: str
    amount_nanos: int
    # What is left unheld on its tightest line once this hold is taken (None: unlimited, or a
    # retried hold): the "budget remaining" a response reports, as of this answer.
    headroom_nanos: int | None = field(default=None, compare=False)


@dataclass(frozen=True)
class HoldRefused:
    """The budget line that could not fit the minimum: what a 402 names."""

    key: str
    committed_nanos: int  # spent + reserved
    limit_nanos: int
    resets_at: str
    # For the 402's message (what of `committed` is spent, what the request asked for).
    spent_nanos: int = field(default=0, compare=False)
    needed_nanos: int = field(default=0, compare=False)


@dataclass(frozen=True)
class Charge:
    charge_id: str
    team: str
    flow: str
    model: str
    user: str | None
    day: str  # UTC day of the call, YYYY-MM-DD
    nanos: int
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0


@dataclass(frozen=True)
class SoftAlert:
    key: str
    threshold: float
    spent_nanos: int
    limit_nanos: int


@dataclass(frozen=True)
class LineStatus:
    key: str
    limit_nanos: int
    spent_nanos: int
    reserved_nanos: int
    resets_at: str

    @property
    def remaining_nanos(self) -> int:
        return max(self.limit_nanos - self.spent_nanos - self.reserved_nanos, 0)


@dataclass(frozen=True)
class SpendRow:
    team: str
    flow: str
    model: str
    day: str
    nanos: int
    requests: int
    prompt_tokens: int
    completion_tokens: int


def _marks(n: int) -> str:
    return ", ".join("?" * n)


CHARGE_PAGE = 8  # charge ids read per query when looking a request's charges up


def _charge(row: tuple[Any, ...]) -> Charge:
    charge_id, team, flow, model, user, day, nanos, prompt, completion, cached = row
    return Charge(
        charge_id=str(charge_id),
        team=str(team),
        flow=str(flow),
        model=str(model),
        user=None if user is None else str(user),
        day=str(day),
        nanos=int(nanos),
        prompt_tokens=int(prompt),
        completion_tokens=int(completion),
        cached_tokens=int(cached),
    )


class BudgetLedger:
    """Ledger operations over one `Database` (which serialises its transactions)."""

    def __init__(self, db: Database, clock: Callable[[], float] = time.time) -> None:
        self.db = db
        self._clock = clock
        prepare(db, SCHEMA)

    # ------------------------------------------------------------ holds

    def hold(self, req: HoldRequest) -> HoldGranted | HoldRefused:
        if req.min_nanos < 0 or req.want_nanos < req.min_nanos:
            raise ValueError(f"hold {req.hold_id}: need 0 <= min ({req.min_nanos}) <= want ({req.want_nanos})")
        with self.db.transaction() as tx:
            done = tx.execute("SELECT amount_nanos FROM holds WHERE hold_id = ?", (req.hold_id,)).rows
            if done:  # a retry of a hold that was granted
                return HoldGranted(req.hold_id, int(done[0][0]))
            lines = sorted(req.lines, key=lambda line: line.key)
            status = self._lock_lines(tx, lines)
            headroom: int | None = None
            for line in lines:
                s = status[line.key]
                room = s.limit_nanos - s.spent_nanos - s.reserved_nanos
                if room < req.min_nanos:
                    return HoldRefused(
                        line.key,
                        s.spent_nanos + s.reserved_nanos,
                        s.limit_nanos,
                        s.resets_at,
                        s.spent_nanos,
                        req.min_nanos,
                    )
                headroom = room if headroom is None else min(headroom, room)
            grant = req.want_nanos
            if headroom is not None:
                grant = min(req.want_nanos, max(req.min_nanos, int(headroom * req.max_share)))
            keys = [line.key for line in lines]
            if keys:
                tx.execute(
                    f"UPDATE budget_lines SET reserved_nanos = reserved_nanos + ? WHERE key IN ({_marks(len(keys))})",
                    (grant, *keys),
                )
            now = self._clock()
            tx.execute(
                "INSERT INTO holds (hold_id, holder, keys, amount_nanos, used_nanos, created_at,"
                " expires_at, is_open)"
                " VALUES (?, ?, ?, ?, 0, ?, ?, 1)",
                (req.hold_id, req.holder, json.dumps(keys), grant, now, now + req.ttl_s),
            )
            return HoldGranted(req.hold_id, grant, None if headroom is None else headroom - grant)

    def _lock_lines(self, tx: Transaction, lines: Sequence[BudgetLine]) -> dict[str, LineStatus]:
        """Create or update each line's limit (policy may change), locking rows in key order."""
        for line in lines:
            tx.execute(
                "INSERT INTO budget_lines (key, limit_nanos, resets_at, soft_alerts)"
                " VALUES (?, ?, ?, ?)"
                " ON CONFLICT (key) DO UPDATE SET limit_nanos = excluded.limit_nanos,"
                " soft_alerts = excluded.soft_alerts",
                (line.key, line.limit_nanos, line.resets_at, json.dumps(list(line.soft_alerts))),
            )
        return {s.key: s for s in self._status(tx, [line.key for line in lines])}

    def _status(self, tx: Transaction, keys: Sequence[str]) -> list[LineStatus]:
        if not keys:
            return []
        rows = tx.execute(
            "SELECT key, limit_nanos, spent_nanos, reserved_nanos, resets_at FROM budget_lines"
            f" WHERE key IN ({_marks(len(keys))}) ORDER BY key",
            tuple(keys),
        ).rows
        return [LineStatus(str(k), int(lim), int(sp), int(rs), str(ra)) for k, lim, sp, rs, ra in rows]

    # ------------------------------------------------------------ charges

    def settle(
        self, hold_id: str, charges: Sequence[Charge], close: bool, keep_nanos: int | None = None
    ) -> list[SoftAlert]:
        """Record charges against a hold (each once, by id); `close` returns the unused rest.

        `keep_nanos` trims an open hold: it keeps at most that much unused (what the holder's
        in-flight requests still need) and returns the rest now. Charges against a closed or
        expired hold still count as spent: the money was spent whatever became of the hold.
        """
        with self.db.transaction() as tx:
            found = tx.execute(
                f"SELECT keys, amount_nanos, used_nanos, is_open FROM holds WHERE hold_id = ?{self.db.lock_rows}",
                (hold_id,),
            ).rows
            if not found:
                raise UnknownHold(f"no hold {hold_id!r} in the ledger")
            keys_json, amount, used, is_open = found[0]
            keys: list[str] = json.loads(keys_json)
            if keys:  # lock in key order, as `hold` does, so the two cannot deadlock
                tx.execute(
                    f"SELECT key FROM budget_lines WHERE key IN ({_marks(len(keys))}) ORDER BY key{self.db.lock_rows}",
                    tuple(keys),
                )
            new = self._insert_charges(tx, hold_id, charges)
            release = 0
            if is_open:
                before = max(int(amount) - int(used), 0)
                after = max(int(amount) - int(used) - new, 0)
                kept = 0 if close else after if keep_nanos is None else min(after, max(keep_nanos, 0))
                release = before - kept
                amount = int(amount) - (after - kept)  # a trimmed hold no longer owns what it returned
            if keys and (new or release):
                tx.execute(
                    "UPDATE budget_lines SET spent_nanos = spent_nanos + ?,"
                    " reserved_nanos = reserved_nanos - ?"
                    f" WHERE key IN ({_marks(len(keys))})",
                    (new, release, *keys),
                )
            tx.execute(
                "UPDATE holds SET used_nanos = used_nanos + ?, amount_nanos = ?, is_open = ? WHERE hold_id = ?",
                (new, int(amount), 0 if close else int(is_open), hold_id),
            )
            return self._soft_alerts(tx, keys) if new else []

    def _insert_charges(self, tx: Transaction, hold_id: str, charges: Sequence[Charge]) -> int:
        new = 0
        now = self._clock()
        for c in charges:
            inserted = tx.execute(
                "INSERT INTO charges (charge_id, hold_id, team, flow, model, end_user, day, nanos,"
                " prompt_tokens, completion_tokens, cached_tokens, at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (charge_id) DO NOTHING",
                (
                    c.charge_id,
                    hold_id,
                    c.team,
                    c.flow,
                    c.model,
                    c.user,
                    c.day,
                    c.nanos,
                    c.prompt_tokens,
                    c.completion_tokens,
                    c.cached_tokens,
                    now,
                ),
            )
            if inserted.rowcount == 1:
                new += c.nanos
            else:
                log.info("charge %s was already recorded; not counting it twice", c.charge_id)
        return new

    def _soft_alerts(self, tx: Transaction, keys: Sequence[str]) -> list[SoftAlert]:
        alerts = []
        rows = tx.execute(
            "SELECT key, limit_nanos, spent_nanos, soft_alerts, alerted FROM budget_lines"
            f" WHERE key IN ({_marks(len(keys))})",
            tuple(keys),
        ).rows
        for key, limit, spent, thresholds, alerted in rows:
            if int(limit) <= 0:
                continue
            crossed = [t for t in json.loads(thresholds) if t > alerted and int(spent) >= t * int(limit)]
            if crossed:
                tx.execute("UPDATE budget_lines SET alerted = ? WHERE key = ?", (max(crossed), key))
                alerts.append(SoftAlert(str(key), max(crossed), int(spent), int(limit)))
        return alerts

    # ------------------------------------------------------------ holders

    def renew(self, holder: str, ttl_s: float) -> int:
        """A live replica's heartbeat: push back the expiry of its open holds."""
        with self.db.transaction() as tx:
            return tx.execute(
                "UPDATE holds SET expires_at = ? WHERE holder = ? AND is_open = 1",
                (self._clock() + ttl_s, holder),
            ).rowcount

    def expire(self, spare: Callable[[str], bool] = lambda holder: False) -> list[str]:
        """Release the holds of replicas that stopped renewing them (died or hung); `spare`:
        holders known to be alive whatever the stored expiry says (`LedgerService.expire_due`)."""
        with self.db.transaction() as tx:
            due = tx.execute(
                "SELECT hold_id, holder FROM holds WHERE is_open = 1 AND expires_at < ?", (self._clock(),)
            ).rows
        stale = [str(hold_id) for hold_id, holder in due if not spare(str(holder))]
        if len(stale) < len(due):
            log.warning(
                "%d holds past their expiry kept: their replicas renewed them within their TTL", len(due) - len(stale)
            )
        for hold_id in stale:
            log.warning("hold %s expired: its replica stopped renewing it; releasing the rest", hold_id)
            self.settle(hold_id, (), close=True)
        return stale

    # ------------------------------------------------------------ reading

    def lines(self, key_prefixes: Sequence[str] | None = None) -> list[LineStatus]:
        with self.db.transaction() as tx:
            rows = tx.execute(
                "SELECT key, limit_nanos, spent_nanos, reserved_nanos, resets_at FROM budget_lines ORDER BY key"
            ).rows
        out = [LineStatus(str(k), int(lim), int(sp), int(rs), str(ra)) for k, lim, sp, rs, ra in rows]
        if key_prefixes is None:
            return out
        return [s for s in out if s.key.startswith(tuple(key_prefixes))]

    def spend(self, team: str | None = None, since_day: str | None = None) -> list[SpendRow]:
        """Settled spend by team, flow, model and UTC day."""
        where, params = ["1 = 1"], []
        if team is not None:
            where.append("team = ?")
            params.append(team)
        if since_day is not None:
            where.append("day >= ?")
            params.append(since_day)
        with self.db.transaction() as tx:
            rows = tx.execute(
                "SELECT team, flow, model, day, SUM(nanos), COUNT(*), SUM(prompt_tokens),"
                " SUM(completion_tokens)"
                f" FROM charges WHERE {' AND '.join(where)} GROUP BY team, flow, model, day"
                " ORDER BY day, team, flow, model",
                params,
            ).rows
        return [
            SpendRow(str(t), str(f), str(m), str(d), int(n), int(c), int(p), int(o)) for t, f, m, d, n, c, p, o in rows
        ]

    def charges_of(self, request_ids: Sequence[str]) -> dict[str, list[Charge]]:
        """Each request's charges, first to last (`<id>`, then `<id>.2`, `<id>.3` ...: one per
        billed attempt), looked up by primary key; a request the ledger never charged is absent."""
        out: dict[str, list[Charge]] = {}
        with self.db.transaction() as tx:
            for request_id in request_ids:
                found: list[Charge] = []
                first = 1
                while True:  # a request has as many charges as billed attempts: a few, read a page at a time
                    ids = [request_id if i == 1 else f"{request_id}.{i}" for i in range(first, first + CHARGE_PAGE)]
                    rows = tx.execute(
                        "SELECT charge_id, team, flow, model, end_user, day, nanos, prompt_tokens,"
                        f" completion_tokens, cached_tokens FROM charges WHERE charge_id IN ({_marks(len(ids))})",
                        ids,
                    ).rows
                    page = {str(r[0]): r for r in rows}
                    found += [_charge(page[i]) for i in ids if i in page]
                    if ids[-1] not in page:
                        break
                    first += CHARGE_PAGE
                if found:
                    out[request_id] = found
        return out

    def charged_nanos(self) -> int:
        with self.db.transaction() as tx:
            return int(tx.execute("SELECT COALESCE(SUM(nanos), 0) FROM charges").rows[0][0])

    def open_holds(self) -> int:
        with self.db.transaction() as tx:
            return int(tx.execute("SELECT COUNT(*) FROM holds WHERE is_open = 1").rows[0][0])
