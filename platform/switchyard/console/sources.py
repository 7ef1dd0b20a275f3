"""Where the console's figures come from: the platform's own stores and services, read only.

The ledger, the audit log and the key store are read from their databases (the state
directory's SQLite files or the shared Postgres), as the CLI reads them; the scheduler
through its actor; the gateway's circuits from its status endpoint. `switchyard report`
builds the same object outside the cluster, with the scheduler and gateway optional.
"""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from switchyard.audit.query import AuditQuery, AuditReader
from switchyard.audit.record import RequestRecord
from switchyard.audit.store import AuditStore
from switchyard.audit.subject_keys import SubjectKeyring
from switchyard.budgets.ledger import BudgetLedger
from switchyard.budgets.report import spend_report
from switchyard.db.engine import open_database
from switchyard.db.location import ledger_url
from switchyard.policy.errors import PolicyError
from switchyard.policy.keys import Principal
from switchyard.policy.loader import load_policy_set
from switchyard.policy.models import DataPolicies
from switchyard.policy.policy_set import PolicySet
from switchyard.scheduler.core.config import load_policy_file
from switchyard.train.metrics_log import MetricsFileError, read_metrics, team_metrics_file

log = logging.getLogger(__name__)

MAX_AUDIT_ROWS = 50_000  # a chart's window; larger windows are the audit export's job


class Scheduler(Protocol):
    """What the console asks the scheduler (a `SchedulerClient`)."""

    def status(self) -> dict[str, Any]: ...

    def events(self, workload_id: str | None = None) -> list[dict[str, Any]]: ...

    def list_workloads(self) -> list[dict[str, Any]]: ...

    def nodes(self) -> list[dict[str, Any]]: ...


@dataclass
class PlatformReader:
    state: Path
    policies_dir: Path
    scheduler: Callable[[], Scheduler | None]  # None: no scheduler reachable (an offline report)
    gateway_url: str | None = None

    def __post_init__(self) -> None:
        self._policies: tuple[tuple[tuple[str, int], ...], PolicySet, list[str]] | None = None
        self.audit = AuditStore.in_state_dir(self.state)
        self.keyring = SubjectKeyring.in_state_dir(self.state)
        self.ledger = BudgetLedger(open_database(ledger_url(self.state)))
        self._reader = AuditReader(self.audit, self.keyring, self.data_policies)

    def close(self) -> None:
        self.audit.close()
        self.keyring.close()
        self.ledger.db.close()

    # ---------------------------------------------------------------- policy

    def policy_set(self) -> PolicySet:
        return self._loaded()[1]

    def data_policies(self) -> DataPolicies:
        return self.policy_set().data

    def teams(self) -> list[str]:
        """Gateway teams and GPU teams (a team may only train, or only call the gateway)."""
        return self._loaded()[2]

    def _loaded(self) -> tuple[tuple[tuple[str, int], ...], PolicySet, list[str]]:
        """The policy files, parsed again only when one of them changed (a page asks several
        times, and parsing them all takes ~100 ms)."""
        files = tuple(sorted((str(p), p.stat().st_mtime_ns) for p in self.policies_dir.rglob("*.yaml")))
        if self._policies is None or self._policies[0] != files:
            try:
                policy_set = load_policy_set(self.policies_dir)
                gpu = {t.name for t in load_policy_file(self.policies_dir / "scheduler.yaml").to_policy().teams}
            except (PolicyError, ValueError) as exc:
                if self._policies is None:
                    raise
                # As the gateway does: an invalid edit is refused, the last good set stays.
                log.warning("the console keeps the last valid policies: %s", exc)
                return self._policies
            self._policies = (files, policy_set, sorted(set(policy_set.teams) | gpu))
        return self._policies

    # ---------------------------------------------------------------- money and audit

    def spend(self, team: str | None, since_day: str | None) -> dict[str, Any]:
        return spend_report(self.ledger, team, since_day)

    def request_records(self, team: str | None, since: float) -> list[RequestRecord]:
        """Request records (metadata only: no body is read) from `since`, oldest first."""
        found = self.audit.find(team, None, since, MAX_AUDIT_ROWS)
        return [e.entry for e in found if isinstance(e.entry, RequestRecord)]

    def audit_query(self, who: Principal, q: AuditQuery) -> list[dict[str, Any]]:
        """Role-checked; a read that returns bodies is itself audited (`AuditReader`)."""
        return self._reader.query(who, q)

    def verify_chain(self) -> dict[str, Any]:
        findings = self.audit.verify()
        head_seq, head_hash = self.audit.head()
        return {
            "ok": not findings,
            "entries": head_seq,
            "head": head_hash,
            "findings": [{"seq": f.seq, "problem": f.problem, "detail": f.detail} for f in findings],
        }

    # ---------------------------------------------------------------- GPUs and training

    def scheduler_view(self) -> dict[str, Any] | None:
        """The scheduler's status, event log, workloads and nodes, or None when it is not reachable."""
        scheduler = self.scheduler()
        if scheduler is None:
            return None
        try:
            return {
                "status": scheduler.status(),
                "events": scheduler.events(),
                "workloads": scheduler.list_workloads(),
                "nodes": scheduler.nodes(),
            }
        except Exception as exc:  # noqa: BLE001 - a dead, restarting or slow actor: the page says "not reachable"
            log.warning("the console could not read the scheduler: %s", exc)
            return None

    def run_metrics(self, team: str, job_name: str) -> list[dict[str, Any]]:
        """The metrics lines of `team`'s run `job_name` ([] when it has written none yet). Only
        the team's own run directory: the name is the workload's description (free text), and
        another team may run a job of the same name."""
        path = team_metrics_file(job_name, team, self.state)
        try:
            return [] if path is None else read_metrics(path).rows
        except MetricsFileError:
            return []

    # ---------------------------------------------------------------- the gateway

    def circuits(self) -> dict[str, Any] | None:
        """Each provider's circuit as the gateway reports it, read with the platform's admin
        key (`<state>/admin.key`); None when there is no gateway or key to ask with."""
        key_file = self.state / "admin.key"
        if self.gateway_url is None or not key_file.is_file():
            return None
        request = urllib.request.Request(
            f"{self.gateway_url}/v1/switchyard/status",
            headers={"Authorization": f"Bearer {key_file.read_text().strip()}"},
        )
        try:
            with urllib.request.urlopen(request, timeout=5) as resp:
                circuits: dict[str, Any] = json.loads(resp.read()).get("circuits", {})
                return circuits
        except (OSError, ValueError) as exc:  # urllib's errors are OSErrors; a bad body, ValueError
            log.warning("could not read the gateway's circuits: %s", exc)
            return None
