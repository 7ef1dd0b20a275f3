"""The budget ledger on the cluster: one named Ray actor that every gateway replica shares.

The actor hosts a `LedgerService` over the durable store (SQLite WAL in the state directory,
or Postgres). It restarts after a crash (`max_restarts=-1`) and reopens the same store, so no
settled charge is lost; callers retry (`max_task_retries=-1`, plus `ActorLedgerClient`'s own
retry while the actor is coming back), and every operation is idempotent by id, so a retried
call is never counted twice. Holds of a replica that stops renewing them expire.
Metrics (spend and remaining budget per budget line, labelled by team) go through
`ray.util.metrics`.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import ActorUnavailableError, RayActorError
from ray.util.metrics import Gauge

from switchyard.budgets.admission import Admissions
from switchyard.budgets.charge_journal import ChargeJournal, ChargesOnHost, journal_dir
from switchyard.budgets.leased_gate import LeaseConfig, LeasedBudgetGate, check_lease_bound
from switchyard.budgets.ledger import BudgetLedger, Charge, HoldRequest, LineStatus, SoftAlert, SpendRow
from switchyard.budgets.money import nanos_to_usd
from switchyard.budgets.ratelimit import PermitDemand
from switchyard.budgets.service import Admission, LedgerService
from switchyard.cluster.placement import on_head
from switchyard.cluster.record import NAMESPACE
from switchyard.db.engine import open_database
from switchyard.db.location import ledger_url
from switchyard.gateway.seams import BudgetUnavailable
from switchyard.policy.models import MAX_DEADLINE_MS
from switchyard.policy.store import PolicySource

log = logging.getLogger(__name__)

LEDGER_ACTOR = "switchyard-ledger"
METRICS_EVERY_S = 1.0  # publishing reads every line; once a second keeps it off the hot path


def _team_of(key: str) -> str:
    """`team:support:day:...` and `flow:support/reply:...` -> `support`; org lines -> ``."""
    scope, _, rest = key.partition(":")
    return "" if scope == "org" else rest.split(":", 1)[0].split("/", 1)[0]


# num_cpus=0: an actor that names a custom resource (the head pin) and no CPUs holds one whole CPU
# for its life; that starved the head of room for the console's replica (see `placement`).
@ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=-1)
class LedgerActor:
    def __init__(self, url: str, expire_every_s: float = 1.0) -> None:
        self.service = LedgerService(BudgetLedger(open_database(url)), expire_every_s=expire_every_s)
        tags = ("budget", "team")
        self._spent = Gauge("switchyard_budget_spent_usd", "settled spend per budget line", tags)
        self._remaining = Gauge(
            "switchyard_budget_remaining_usd", "limit minus spent and reserved, per budget line", tags
        )
        self._published = 0.0
        log.info("ledger actor up on %s", url.split("@")[-1])  # no credentials in logs

    def admit(self, permits: tuple[PermitDemand, ...], hold: HoldRequest | None) -> Admission:
        return self.service.admit(permits, hold)

    def settle(
        self, hold_id: str, charges: Sequence[Charge], close: bool, keep_nanos: int | None = None
    ) -> list[SoftAlert]:
        alerts = self.service.settle(hold_id, charges, close, keep_nanos)
        self._publish()
        return alerts

    def give_back(self, returned: dict[str, int], limits: dict[str, int]) -> None:
        self.service.give_back(returned, limits)

    def renew(self, holder: str, ttl_s: float) -> int:
        return self.service.renew(holder, ttl_s)

    def expire(self) -> list[str]:
        # It also keeps the budget gauges set, which Ray drops when nothing sets them for a
        # while (a quiet hour would empty the budget panels).
        self._publish()
        return self.service.expire_now()  # the live replicas' holds kept, as on every call

    def lines(self, key_prefixes: Sequence[str] | None = None) -> list[LineStatus]:
        return self.service.lines(key_prefixes)

    def spend(self, team: str | None = None, since_day: str | None = None) -> list[SpendRow]:
        return self.service.spend(team, since_day)

    def charged_nanos(self) -> int:
        return self.service.ledger.charged_nanos()

    def charges_of(self, request_ids: Sequence[str]) -> dict[str, list[Charge]]:
        return self.service.charges_of(request_ids)

    def health(self) -> dict[str, int]:
        """The process id (changes when Ray restarted the actor) and the open holds."""
        return {"pid": os.getpid(), "open_holds": self.service.ledger.open_holds()}

    def _publish(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._published < METRICS_EVERY_S:
            return
        self._published = now
        for s in self.service.lines():
            tags = {"budget": s.key, "team": _team_of(s.key)}
            self._spent.set(nanos_to_usd(s.spent_nanos), tags)
            self._remaining.set(nanos_to_usd(s.remaining_nanos), tags)


def ledger_actor_name(url: str) -> str:
    """The ledger actor's name, bound to the ledger's URL, so two platforms on one cluster never
    share a ledger by mistake."""
    return f"{LEDGER_ACTOR}-{hashlib.sha256(url.encode()).hexdigest()[:10]}"


def ledger_actor(url: str, name: str | None = None, detached: bool = True) -> Any:
    """The shared ledger actor: created on first use (by the first gateway replica), found by
    name afterwards; in the platform's namespace, where `switchyard down` finds it to stop it."""
    options: dict[str, Any] = {
        "name": name or ledger_actor_name(url),
        "namespace": NAMESPACE,  # else the creator's: Serve's, for a replica
        "get_if_exists": True,
        **on_head(),  # SQLite: the head's disk
    }
    if detached:
        options["lifetime"] = "detached"  # outlives the process that created it (the first replica)
    return LedgerActor.options(**options).remote(url)  # type: ignore[attr-defined]


def stop_ledger_actor(state_dir: Path) -> bool:
    """Stop the ledger actor of the platform whose state is `state_dir` (its store keeps every
    balance; the next replica to ask starts a new one over it). False if none was running."""
    try:
        ray.kill(ray.get_actor(ledger_actor_name(ledger_url(state_dir)), namespace=NAMESPACE), no_restart=True)
    except ValueError:
        return False
    return True


class ActorLedgerClient:
    """`LedgerClient` over the actor handle, waiting out an actor restart (a request's own
    calls are cut short by its deadline in the pipeline; upkeep waits the whole window)."""

    def __init__(self, handle: Any, retry_for_s: float = 60.0) -> None:
        self.handle = handle
        self.retry_for_s = retry_for_s

    async def _call(self, method: str, *args: Any) -> Any:
        deadline = time.monotonic() + self.retry_for_s
        delay = 0.05
        while True:
            try:
                return await getattr(self.handle, method).remote(*args)
            except (RayActorError, ActorUnavailableError) as exc:
                # Safe to repeat: every ledger call is idempotent by hold and charge id.
                if time.monotonic() > deadline:
                    raise BudgetUnavailable(f"the ledger actor is unavailable ({type(exc).__name__})") from exc
                log.warning("ledger actor unavailable (%s); retrying %s in %.2fs", exc, method, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)

    async def admit(self, permits: tuple[PermitDemand, ...], hold: HoldRequest | None) -> Admission:
        result: Admission = await self._call("admit", permits, hold)
        return result

    async def settle(
        self, hold_id: str, charges: Sequence[Charge], close: bool, keep_nanos: int | None = None
    ) -> list[SoftAlert]:
        alerts: list[SoftAlert] = await self._call("settle", hold_id, list(charges), close, keep_nanos)
        return alerts

    async def give_back(self, returned: dict[str, int], limits: dict[str, int]) -> None:
        await self._call("give_back", returned, limits)

    async def renew(self, holder: str, ttl_s: float) -> int:
        renewed: int = await self._call("renew", holder, ttl_s)
        return renewed


def replica_holder() -> str:
    """The id a gateway replica holds its leases under; its charge journal and audit spool are
    named after it (`journal_name`)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def gateway_budget_gate(
    policies: PolicySource,
    state_dir: str | Path,
    pseudonym: Callable[[str, str], str] | None = None,
    holder: str | None = None,
) -> LeasedBudgetGate:
    """The budget gate of one gateway replica: leases from the shared ledger actor.

    The ledger's store is `$SWITCHYARD_LEDGER_URL`, else `ledger.db` in the state directory.
    Charges are journaled under `<state>/budgets/journal/` before each response; call
    `await gate.recover()` before taking traffic (it sends what dead replicas on this host
    journaled) and `await gate.aclose()` when the replica stops, so its queued charges are
    sent and its leases returned at once (otherwise they expire after `LeaseConfig.ttl_s`).
    """
    actor = ledger_actor(ledger_url(Path(state_dir)))
    holder = holder or replica_holder()
    journal = ChargeJournal(journal_dir(state_dir), holder)
    config = LeaseConfig()
    check_lease_bound(config, MAX_DEADLINE_MS / 1000)  # every set the loader takes, reloads included
    admissions = Admissions(lambda: policies.current, pseudonym=pseudonym)
    return LeasedBudgetGate(admissions, ActorLedgerClient(actor), holder, config, journal=journal)


class ActorSpendSource:
    """`SpendSource` (sync, for the spend admin endpoint's threadpool) over the ledger actor."""

    def __init__(self, handle: Any, timeout_s: float = 30.0) -> None:
        self.handle = handle
        self.timeout_s = timeout_s

    def lines(self, key_prefixes: list[str] | None = None) -> list[LineStatus]:
        result: list[LineStatus] = ray.get(self.handle.lines.remote(key_prefixes), timeout=self.timeout_s)
        return result

    def spend(self, team: str | None = None, since_day: str | None = None) -> list[SpendRow]:
        result: list[SpendRow] = ray.get(self.handle.spend.remote(team, since_day), timeout=self.timeout_s)
        return result


def gateway_spend_source(state_dir: str | Path) -> ActorSpendSource:
    return ActorSpendSource(ledger_actor(ledger_url(Path(state_dir))))


def gateway_charges_on_host(state_dir: str | Path, timeout_s: float = 30.0) -> ChargesOnHost:
    """The ledger's charges of dead replicas' requests, for the audit spool's recovery (which
    runs in a worker thread, so it asks the ledger actor synchronously)."""
    actor = ledger_actor(ledger_url(Path(state_dir)))

    def lookup(request_ids: Sequence[str]) -> dict[str, list[Charge]]:
        found: dict[str, list[Charge]] = ray.get(actor.charges_of.remote(list(request_ids)), timeout=timeout_s)
        return found

    return ChargesOnHost(journal_dir(state_dir), lookup)
