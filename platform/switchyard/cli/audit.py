"""`switchyard audit verify|query|erase|drain|purge|export`: the audit log from the shell."""

from __future__ import annotations

import argparse
import asyncio
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from switchyard.audit.data_policy import DataPolicyError, load_data_policies
from switchyard.audit.erasure import erase_subject
from switchyard.audit.export import S3Target, export_sealed, verify_export
from switchyard.audit.query import AuditQuery, AuditReader, parse_since
from switchyard.audit.spool import pending_lines, recover_orphans
from switchyard.audit.store import AuditStore, distinct
from switchyard.audit.subject_keys import SubjectKeyring, subject_of
from switchyard.budgets.charge_journal import ChargesOnHost, journal_dir
from switchyard.budgets.charge_journal import recover_orphans as recover_charges
from switchyard.budgets.ledger import BudgetLedger, Charge
from switchyard.budgets.service import InProcessLedgerClient, LedgerService
from switchyard.cli._args import int_between
from switchyard.cli._auth import NotAuthenticated, add_auth_args, require
from switchyard.cli._output import fail, print_json, print_table
from switchyard.cli._teams import unknown_team
from switchyard.db.engine import open_database
from switchyard.db.location import ledger_url
from switchyard.db.migrations import SchemaError
from switchyard.gateway.idempotency import IdempotencyStore
from switchyard.gateway.idempotency_sql import SqlIdempotencyStore
from switchyard.paths import policies_dir
from switchyard.policy.roles import Action, Forbidden
from switchyard.state import state_dir

Handler = Callable[[argparse.Namespace], int]

BUCKET_ENV = "SWITCHYARD_AUDIT_BUCKET"
ENDPOINT_ENV = "SWITCHYARD_AUDIT_S3_ENDPOINT"


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("audit", help="verify, query and erase the audit log")
    sub = parser.add_subparsers(dest="audit_command", required=True)
    verify = sub.add_parser(
        "verify",
        help="check the hash chain, body digests and anchored heads, and the S3 copies if a bucket is"
        " given; say where it breaks",
    )
    _add_s3_args(verify)
    verify.set_defaults(handler=_guarded(run_verify))
    query = sub.add_parser("query", help="list a team's audit records")
    query.add_argument("--team", help="the team (omit for all teams: auditors only)")
    query.add_argument("--flow")
    query.add_argument("--since", help="unix seconds, ISO 8601, or an age: 30m, 24h, 7d")
    query.add_argument("--bodies", action="store_true", help="include bodies (audited; per data class)")
    # Bounded for SQLite's 64-bit LIMIT (20 digits raised OverflowError); the demo counts with 10^6.
    query.add_argument("--limit", type=int_between(1, 1_000_000_000), default=1000)
    query.set_defaults(handler=_guarded(run_query))
    erase = sub.add_parser(
        "erase",
        help="delete a subject's key: its bodies become unreadable, its pseudonym unlinkable, its stored"
        " idempotent answers are purged",
    )
    erase.add_argument("--team", required=True)
    whom = erase.add_mutually_exclusive_group(required=True)
    whom.add_argument("--subject", help="the end user the team named in requests")
    whom.add_argument(
        "--team-key", action="store_true", help="the team's own key: the bodies of its requests that named no user"
    )
    erase.set_defaults(handler=_guarded(run_erase))
    drain = sub.add_parser(
        "drain",
        help="move what dead gateway replicas on this host left: audit spools into the store,"
        " journaled charges into the budget ledger",
    )
    drain.set_defaults(handler=_guarded(run_drain))
    purge = sub.add_parser("purge", help="remove bodies past their class's retention (for cron)")
    purge.set_defaults(handler=_guarded(run_purge))
    export = sub.add_parser("export", help="seal full segments and upload them and the chain head to S3 (object lock)")
    _add_s3_args(export)
    export.add_argument("--segment-size", type=int_between(1, 1_000_000), default=10_000, help="entries per segment")
    export.add_argument("--retention-days", type=int_between(1, 36_500), default=365, help="object-lock retain-until")
    export.add_argument("--all", action="store_true", help="also seal the last, partial segment")
    export.set_defaults(handler=_guarded(run_export))
    for p in sub.choices.values():
        add_auth_args(p)
        p.add_argument("--policies", help="policy directory (default: $SWITCHYARD_POLICIES or the repo's)")
        p.add_argument("--json", action="store_true")


def _add_s3_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bucket", default=os.environ.get(BUCKET_ENV), help=f"export bucket (default: ${BUCKET_ENV})")
    parser.add_argument("--prefix", default="audit/")
    parser.add_argument(
        "--endpoint-url",
        default=os.environ.get(ENDPOINT_ENV),
        help=f"S3-compatible endpoint (default: ${ENDPOINT_ENV}, else AWS)",
    )


def _s3_client(args: argparse.Namespace) -> Any:
    import boto3  # only the S3 commands need it; keeps `switchyard --help` fast

    return boto3.client("s3", endpoint_url=args.endpoint_url)


def _guarded(fn: Handler) -> Handler:
    def wrapper(args: argparse.Namespace) -> int:
        try:
            return fn(args)
        except (NotAuthenticated, Forbidden) as exc:
            return fail(str(exc), 3)
        except (DataPolicyError, SchemaError, ValueError) as exc:  # SchemaError names the migration to run
            return fail(str(exc))
        except Exception as exc:
            if not _from_s3(exc):
                raise
            # No credentials, a bucket that is not there, an endpoint that does not answer:
            # export marks each segment after its upload, so the next run goes on from there.
            return fail(
                f"S3 ({getattr(args, 'endpoint_url', None) or 'AWS'}, bucket {getattr(args, 'bucket', None)!r}): {exc}"
            )

    return wrapper


def _from_s3(exc: Exception) -> bool:
    """Whether boto3 raised `exc` (imported only then: `switchyard --help` stays fast)."""
    from botocore.exceptions import BotoCoreError, ClientError

    return isinstance(exc, BotoCoreError | ClientError)


def _state(args: argparse.Namespace) -> Path:
    return state_dir(args.state_dir)


@contextmanager
def _store(args: argparse.Namespace) -> Iterator[AuditStore]:
    """The state directory's audit store (its SQLite file, or the shared database)."""
    store = AuditStore.in_state_dir(_state(args))
    try:
        yield store
    finally:
        store.close()  # writes the anchor of what this command appended


@contextmanager
def _keyring(args: argparse.Namespace) -> Iterator[SubjectKeyring]:
    keyring = SubjectKeyring.in_state_dir(_state(args))
    try:
        yield keyring
    finally:
        keyring.close()


def run_verify(args: argparse.Namespace) -> int:
    require(args, Action.READ_AUDIT, None)
    with _store(args) as store:
        findings = store.verify()
        compared = None
        if args.bucket:
            target = S3Target(args.bucket, args.prefix)
            findings = distinct(findings + verify_export(store, _s3_client(args), target))
            compared = f"s3://{target.bucket}/{target.prefix}"
        seq, head = store.head()
        exported = any(seg.exported_to for seg in store.segments())
    if args.json:
        print_json(
            {
                "ok": not findings,
                "entries": seq,
                "head": head,
                "compared_with": compared,
                "findings": [{"seq": f.seq, "problem": f.problem, "detail": f.detail} for f in findings],
            }
        )
        return 1 if findings else 0
    for f in findings:
        print(f"BROKEN {f}")
    if not findings:
        against = f", agrees with {compared}" if compared else ""
        print(f"ok: {seq} entries, chain head {head[:16]}{against}")
    if exported and compared is None:
        print(f"note: segments were exported; pass --bucket (or set ${BUCKET_ENV}) to compare with the S3 copies")
    return 1 if findings else 0


def run_query(args: argparse.Namespace) -> int:
    who = require(args, Action.READ_AUDIT, args.team)
    since = None if args.since is None else parse_since(args.since)
    policies = load_data_policies(policies_dir(args.policies))
    with _store(args) as store, _keyring(args) as keyring:
        found = AuditReader(store, keyring, policies).query(
            who, AuditQuery(args.team, args.flow, since, args.bodies, args.limit)
        )
    if args.team is not None and not found and (problem := unknown_team(args.team, _state(args))) is not None:
        return fail(f"{problem}; the audit log has nothing for it either")  # a typo read as a quiet team
    if args.json:
        print_json(found)
        return 0
    print_table(
        ["seq", "time", "kind", "team", "flow", "status", "provider", "cost $", "class", "redaction"],
        [_row(v) for v in found],
    )
    return 0


def _row(v: dict[str, Any]) -> list[Any]:
    when = datetime.fromtimestamp(v["time"], UTC).strftime("%Y-%m-%d %H:%M:%S")
    if v["kind"] != "request":
        return [v["seq"], when, v["kind"], v.get("team") or "*", v.get("flow") or "", "", "", "", "", ""]
    counts = ",".join(f"{k}:{n}" for k, n in sorted(v["redaction"]["entity_counts"].items()))
    return [
        v["seq"],
        when,
        "request",
        v["team"],
        v["flow"],
        v["status_code"],
        v["provider"] or "-",
        f"{v['cost_usd']:.6f}",
        v["data_class"],
        f"{v['redaction']['mode']} {counts}".strip(),
    ]


def run_erase(args: argparse.Namespace) -> int:
    # Erasure destroys data for good: platform admins only, on any team.
    who = require(args, Action.ERASE_SUBJECT, args.team)
    user = None if args.team_key else args.subject
    with _shared_idempotency(_state(args)) as replays, _store(args) as store, _keyring(args) as keyring:
        record = asyncio.run(erase_subject(store, keyring, args.team, user, erased_by=who.key_id, idempotency=replays))
    if args.json:
        print_json(record.model_dump(mode="json"))
        return 0
    named = subject_of(args.team, user)  # the operator typed it; it is stored nowhere
    if record.key_existed:
        print(f"erased subject {named!r}: its stored bodies can no longer be read")
    else:
        print(f"subject {named!r} had no key (nothing stored, or already erased); recorded anyway")
    print(f"purged {record.replays_purged or 0} stored idempotent answers")
    if record.bodies_removed:
        print(f"deleted the plaintext bodies of {len(record.bodies_removed)} schema-1 records")
    return 0


@contextmanager
def _shared_idempotency(state: Path) -> Iterator[IdempotencyStore]:
    """The idempotency store every gateway replica replays answers from: the state's own
    database (SQLite here, or `SWITCHYARD_DATABASE_URL`), whether or not a platform is up."""
    store = SqlIdempotencyStore.in_state_dir(state)
    try:
        yield store
    finally:
        store.close()


def run_drain(args: argparse.Namespace) -> int:
    require(args, Action.OPERATE, None)
    state = _state(args)
    directory = state / "audit" / "spool"
    report = None
    ledger = BudgetLedger(open_database(ledger_url(state)))
    try:
        # The charges first: a dead replica's cut-off streams are recorded at what they charge.
        charges = _drain_charge_journals(state, ledger)
        if directory.exists():
            with _store(args) as store:
                report = recover_orphans(directory, store, ChargesOnHost(journal_dir(state), ledger.charges_of))
    finally:
        ledger.db.close()
    left = pending_lines(directory) if directory.exists() else 0
    result = {
        "files": report.files if report else 0,
        "records": report.lines if report else 0,
        "new": report.new_entries if report else 0,
        "torn": report.torn_lines if report else 0,
        "stand_ins_kept": report.kept if report else 0,
        "unreadable_kept_aside": report.unreadable if report else 0,
        "still_spooled_by_live_writers": left,
        **charges,
    }
    if args.json:
        print_json(result)
    else:
        print(", ".join(f"{k}: {v}" for k, v in result.items()))
    return 0


def _drain_charge_journals(state: Path, ledger: BudgetLedger) -> dict[str, int]:
    """The budget side of a dead replica: charges it journaled but never sent to the ledger."""
    client = InProcessLedgerClient(LedgerService(ledger))

    async def send(hold_id: str, charges: Sequence[Charge]) -> None:
        await client.settle(hold_id, charges, close=True)

    report = asyncio.run(recover_charges(journal_dir(state), send))
    return {
        "charge_journals": report.journals,
        "charges": report.charges,
        "charge_journals_kept": report.kept,
        "charge_lines_kept_aside": report.unreadable,
    }


def run_purge(args: argparse.Namespace) -> int:
    require(args, Action.OPERATE, None)
    with _store(args) as store:
        removed = store.purge_expired_bodies()
    if args.json:
        print_json({"bodies_removed": removed})
    else:
        print(f"removed {removed} expired bodies")
    return 0


def run_export(args: argparse.Namespace) -> int:
    require(args, Action.OPERATE, None)
    if not args.bucket:
        return fail(f"export: no bucket: pass --bucket or set ${BUCKET_ENV}")
    target = S3Target(args.bucket, args.prefix, args.retention_days)
    with _store(args) as store:
        sealed = store.seal_segments(args.segment_size, include_partial=args.all)
        keys = export_sealed(store, _s3_client(args), target)
    if args.json:
        print_json({"sealed": len(sealed), "exported": keys})
    else:
        print(f"sealed {len(sealed)} segments; exported {len(keys)}: " + ", ".join(keys))
    return 0
