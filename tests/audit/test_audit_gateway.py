"""Through the gateway's HTTP app (in-process, two instances as two replicas sharing one state
dir): the Presidio redactor and the SQLite audit sink in place of the interim collaborators.

Checks, under concurrent load: the provider never sees the raw values of a `personal` flow,
the client gets them back (also in a stream, where a placeholder straddles chunks), every
answered request has exactly one record, the chain verifies, the audited cost equals what
the budget gate settled, and no raw value is in any audit file.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Sequence
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import httpx
import pytest
from _audit_helpers import CARD, EMAIL, PHONE

from switchyard.audit.builder import PendingEntry
from switchyard.audit.gateway import gateway_audit_parts
from switchyard.audit.record import RequestRecord
from switchyard.audit.redaction import PresidioRedactor
from switchyard.audit.sink import StoreAuditSink
from switchyard.audit.store import AuditStore
from switchyard.audit.subject_keys import SubjectKeyring
from switchyard.budgets.money import usd_to_nanos
from switchyard.gateway.auth import KeySnapshot
from switchyard.gateway.circuit import CircuitBoard
from switchyard.gateway.http import create_app
from switchyard.gateway.idempotency import InMemoryIdempotencyStore
from switchyard.gateway.interim import InMemoryBudgetGate
from switchyard.gateway.metrics import InMemoryMetrics
from switchyard.gateway.pipeline import ChatPipeline, GatewayParts
from switchyard.gateway.planning import DEADLINE_HEADER
from switchyard.gateway.pool import ProviderPool
from switchyard.gateway.providers.base import Completion, ProviderCall
from switchyard.gateway.providers.inprocess import InProcessProvider
from switchyard.gateway.seams import Usage
from switchyard.paths import repo_root
from switchyard.policy.keys import KeyStore
from switchyard.policy.models import BodyStorage, Role
from switchyard.policy.policy_set import PolicySet
from switchyard.policy.store import PolicyStore

HOLD = "[hold]"  # as _audit_gateway_replica.py: its stream stops after the first piece
MISSHAPEN = "[misshapen]"  # the provider's answer then breaks the flow's output schema
HERE = Path(__file__).parent
CUSTOMER = f"My card {CARD} was charged twice; mail me at {EMAIL} or call {PHONE}."


def _policies(tmp: Path, state: Path) -> PolicyStore:
    state.mkdir(parents=True, exist_ok=True)
    root = tmp / "policies"
    shutil.copytree(repo_root() / "policies", root)
    if not (root / "scheduler.yaml").exists():
        (root / "scheduler.yaml").write_text("")  # another area's file; empty means defaults
    return PolicyStore(root, state)


def _provider(name: str, seen: list[str]) -> InProcessProvider:
    async def answer(call: ProviderCall) -> Completion:
        text = json.dumps(call.messages)
        seen.append(text)
        if "<EMAIL_ADDRESS_1>" in text:  # the redacted support flow: refer to the placeholder
            reply = "We refunded you and wrote to <EMAIL_ADDRESS_1> today."
        elif MISSHAPEN in text:
            reply = json.dumps({"escalate": "perhaps"})
        else:
            reply = json.dumps({"escalate": True, "reason": "card charged twice"})
        await asyncio.sleep(0.001)
        return Completion(reply, Usage(len(text) // 4, 12), "stop", call.model_version)

    # 8-character chunks: the 17-character placeholder always straddles a chunk boundary.
    return InProcessProvider(name, answer, stream_chunk_chars=8)


def _replica(
    ps: PolicySet,
    keys: KeyStore,
    sink: StoreAuditSink,
    redactor: PresidioRedactor,
    seen: list[str],
    metrics: InMemoryMetrics | None = None,
) -> tuple[httpx.AsyncClient, InMemoryBudgetGate]:
    gate = InMemoryBudgetGate(ps)
    metrics = metrics or InMemoryMetrics()
    parts = GatewayParts(
        policies=lambda: ps,
        keys=KeySnapshot(keys.verifier(), keys.version()),
        providers=ProviderPool(
            overrides={n: _provider(n, seen) for n in ("openai", "anthropic", "bedrock", "azure-openai")}
        ),
        budget=gate,
        redactor=redactor,
        audit=sink,
        metrics=metrics,
        idempotency=InMemoryIdempotencyStore(),
        circuits=CircuitBoard(on_change=metrics.circuit_changed),
    )
    pipeline = ChatPipeline(parts)
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=create_app(lambda: pipeline)), base_url="http://gw"
    ), gate


def test_the_factories_need_no_event_loop(tmp_path: Path) -> None:
    """Serve builds a replica's collaborators in its constructor, outside any event loop."""
    state = tmp_path / "state"
    sink, redactor = gateway_audit_parts(_policies(tmp_path, state), state)
    assert sink.spool is not None and not sink.spool.started
    assert redactor.redact([{"role": "user", "content": EMAIL}], "personal").restore == {"<EMAIL_ADDRESS_1>": EMAIL}


async def test_gateway_with_redaction_and_audit(tmp_path: Path) -> None:
    state = tmp_path / "state"
    policy_store = _policies(tmp_path, state)
    ps = policy_store.current
    keys = KeyStore.in_state_dir(state)
    support = {"authorization": f"Bearer {keys.create('support', Role.MEMBER)[0]}"}
    payments = {"authorization": f"Bearer {keys.create('payments', Role.MEMBER)[0]}"}
    seen: list[str] = []
    backlog: list[int] = []
    built = [gateway_audit_parts(policy_store, state, on_backlog=backlog.append) for _ in range(2)]
    sinks = [sink for sink, _ in built]
    replicas = [_replica(ps, keys, sink, redactor, seen) for sink, redactor in built]

    support_body = {
        "model": "auto",
        "user": "cust-17",
        "messages": [{"role": "user", "content": CUSTOMER}],
        "variables": {"product": "Acme Card"},
    }
    payments_body = {"model": "auto", "messages": [], "variables": {"dispute_id": "D-1", "summary": CUSTOMER}}

    def post(i: int) -> Awaitable[httpx.Response]:
        body, headers = (payments_body, payments) if i % 3 == 0 else (support_body, support)
        return replicas[i % 2][0].post("/v1/chat/completions", json=body, headers=headers)

    responses = await asyncio.gather(*(post(i) for i in range(30)))
    stream = await replicas[0][0].post("/v1/chat/completions", json={**support_body, "stream": True}, headers=support)
    for sink in sinks:
        await sink.close()

    assert backlog and backlog[-1] == 0  # the spooled (medium-risk) records were all drained
    assert [r.status_code for r in responses] == [200] * 30, [r.text for r in responses if r.status_code != 200]
    answers = [r.json()["choices"][0]["message"]["content"] for r in responses]
    assert sum(f"wrote to {EMAIL} today" in a for a in answers) == 20  # restored for the client
    streamed = "".join(
        json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
        for line in stream.text.splitlines()
        if line.startswith("data: {")
    )
    assert f"wrote to {EMAIL} today" in streamed
    support_calls = [s for s in seen if "<EMAIL_ADDRESS_1>" in s]
    assert len(support_calls) == 21 and not any(v in s for s in support_calls for v in (EMAIL, CARD, PHONE))

    store = AuditStore.in_state_dir(state)
    records = [e.entry for e in store.find(limit=10_000)]
    ids = [r.request_id for r in records]
    answered = [r.headers["x-switchyard-request-id"] for r in responses] + [stream.headers["x-switchyard-request-id"]]
    assert sorted(ids) == sorted(answered)  # exactly one record per answered request
    assert store.verify() == []
    requests = [r for r in records if isinstance(r, RequestRecord)]
    by_flow = {r.flow: r for r in requests}
    cust = SubjectKeyring.in_state_dir(state).pseudonym_for("support", "cust-17")
    assert by_flow["reply"].redaction.mode == "reversible" and by_flow["reply"].user == cust  # a pseudonym
    assert by_flow["reply"].redaction.entity_counts["EMAIL_ADDRESS"] == 1
    assert by_flow["dispute-review"].risk_tier == "high" and by_flow["dispute-review"].contract_result == "valid"
    settled = sum(usd for _, gate in replicas for _, usd, _ in gate.settled)
    assert abs(sum(r.cost_usd for r in requests) - settled) < 1e-12
    store.close()
    for path in (state / "audit").rglob("*"):
        if path.is_file():
            blob = path.read_bytes()
            assert not any(v.encode() in blob for v in (EMAIL, CARD, PHONE)), path
    for client, _ in replicas:
        await client.aclose()


async def _records_after_a_restart(
    policies: Path, state: Path, headers: dict[str, str]
) -> tuple[AuditStore, list[RequestRecord]]:
    """The request records once a new replica has recovered what the killed one left."""
    await _start_and_stop_a_replica(policies, state, headers)
    store = AuditStore.in_state_dir(state)
    return store, [e.entry for e in store.find(limit=100_000) if isinstance(e.entry, RequestRecord)]


async def _kill_with_streams_open(proc: subprocess.Popen[bytes], streams: list[httpx.Response]) -> None:
    """SIGKILL the replica while its clients' streams are open, then let the clients go."""
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    for r in streams:
        with contextlib.suppress(httpx.TransportError):
            await r.aclose()


async def _until_done(lines: AsyncIterator[str]) -> AsyncIterator[str]:
    async for line in lines:
        yield line
        if line == "data: [DONE]":
            return


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start_replica(
    policies: Path, state: Path, recover_every_s: float | None = None
) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(repo_root() / "platform"), str(HERE)])}
    every = [] if recover_every_s is None else [str(recover_every_s)]
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "_audit_gateway_replica.py"), str(policies), str(state), str(port), *every],
        env=env,
    )
    return proc, f"http://127.0.0.1:{port}"


async def _wait_ready(base: str, headers: dict[str, str], proc: subprocess.Popen[bytes]) -> None:
    async with httpx.AsyncClient(base_url=base) as client:
        for _ in range(300):
            assert proc.poll() is None, "the replica exited"
            try:
                if (await client.get("/v1/models", headers=headers)).status_code == 200:
                    return
            except httpx.TransportError:
                pass  # not listening yet
            await asyncio.sleep(0.1)
    raise AssertionError(f"replica at {base} never became ready")


async def _start_and_stop_a_replica(policies: Path, state: Path, headers: dict[str, str]) -> None:
    """A new replica on the same host: it drains the dead one's spool, stand-ins and charge
    journal before it takes traffic; then it shuts down cleanly."""
    proc, base = _start_replica(policies, state)
    try:
        await _wait_ready(base, headers, proc)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait()


async def test_killing_a_gateway_replica_under_load(tmp_path: Path) -> None:
    """SIGKILL a gateway replica (its own process) mid-load; start another on the same state.
    Every high-risk request that got a response has exactly one record, no request has two,
    the medium-risk ones that got a response lose nothing (a process crash is within the
    spool's bound of zero), the chain verifies, and the ledger's charges equal the audited
    costs request by request (the dead replica's unsent charges come from its journal)."""
    state = tmp_path / "state"
    policy_store = _policies(tmp_path, state)
    keys = KeyStore.in_state_dir(state)
    support = {"authorization": f"Bearer {keys.create('support', Role.MEMBER)[0]}"}
    payments = {"authorization": f"Bearer {keys.create('payments', Role.MEMBER)[0]}"}
    bodies = (
        (
            {"model": "auto", "messages": [{"role": "user", "content": CUSTOMER}], "variables": {"product": "X"}},
            support,
        ),
        ({"model": "auto", "messages": [], "variables": {"dispute_id": "D-7", "summary": "charged twice"}}, payments),
    )
    proc, base = _start_replica(policy_store.root, state)
    answered: dict[str, str] = {}  # request id -> flow, for every 200 the clients received
    try:
        await _wait_ready(base, support, proc)
        async with httpx.AsyncClient(base_url=base, timeout=10) as client:

            async def user(n: int) -> None:
                for i in range(10_000):
                    body, headers = bodies[(n + i) % 2]
                    try:
                        r = await client.post("/v1/chat/completions", json=body, headers=headers)
                    except httpx.TransportError:
                        return  # the replica is gone
                    if r.status_code == 200:
                        answered[r.headers["x-switchyard-request-id"]] = "high" if headers is payments else "medium"

            load = [asyncio.create_task(user(n)) for n in range(8)]
            while len(answered) < 120:
                assert proc.poll() is None, "the replica exited under load"
                await asyncio.sleep(0.05)
            proc.send_signal(signal.SIGKILL)
            await asyncio.gather(*load)
    finally:
        proc.kill()
        proc.wait()
    assert (state / "audit" / "spool").is_dir()
    await _start_and_stop_a_replica(policy_store.root, state, support)
    store = AuditStore.in_state_dir(state)
    stored = [e.entry.request_id for e in store.find(limit=100_000)]
    assert len(stored) == len(set(stored)), "a request has two records"
    missing = {rid: tier for rid, tier in answered.items() if rid not in set(stored)}
    assert missing == {}, f"{len(missing)} answered requests have no record"
    assert sum(t == "high" for t in answered.values()) > 20
    assert store.verify() == []
    audited = {
        e.entry.request_id: usd_to_nanos(e.entry.cost_usd)
        for e in store.find(limit=100_000)
        if isinstance(e.entry, RequestRecord) and e.entry.status_code == 200
    }
    with closing(sqlite3.connect(state / "ledger.db")) as db:
        charged = dict(db.execute("SELECT charge_id, nanos FROM charges").fetchall())
        (spent,) = db.execute("SELECT spent_nanos FROM budget_lines WHERE key LIKE 'org:%:day:%'").fetchone()
    unaudited = {rid: n for rid, n in charged.items() if rid not in audited}
    assert {rid: charged.get(rid) for rid in audited} == audited, "an audited request's charge is missing or differs"
    # A charge without a record: a request the kill cut off between settle and audit. It never
    # got a response, and at most one per concurrent client can be in that window.
    assert not set(unaudited) & set(answered)
    assert len(unaudited) <= 8
    assert spent == sum(charged.values()) == sum(audited.values()) + sum(unaudited.values())
    print(
        f"\ngateway kill: {len(answered)} answered, {len(stored)} records (in-flight at the kill may add records),"
        f" ledger {spent} nanos = audited {sum(audited.values())} + {len(unaudited)} cut-off charges"
    )


async def test_streams_open_when_their_replica_is_killed_are_audited_and_charged_once(tmp_path: Path) -> None:
    """Found in CI: a stream whose client had read its first piece when its replica was
    SIGKILLed had no audit record and no charge. Each such stream gets one record (cut off by
    the replica's loss: status 502, `replica_lost`) whose cost is what the ledger charged it,
    its whole reservation; a stream that finished before the kill keeps its own record."""
    state = tmp_path / "state"
    policy_store = _policies(tmp_path, state)
    keys = KeyStore.in_state_dir(state)
    support = {"authorization": f"Bearer {keys.create('support', Role.MEMBER)[0]}"}

    def body(text: str) -> dict[str, object]:
        return {
            "model": "auto",
            "stream": True,
            "messages": [{"role": "user", "content": text}],
            "variables": {"product": "X"},
        }

    proc, base = _start_replica(policy_store.root, state)
    held: list[str] = []
    try:
        await _wait_ready(base, support, proc)
        async with httpx.AsyncClient(base_url=base, timeout=10) as client:
            done = await client.post("/v1/chat/completions", json=body("Where is my order?"), headers=support)
            assert done.status_code == 200 and done.text.rstrip().endswith("data: [DONE]")
            finished = done.headers["x-switchyard-request-id"]
            streams = []
            for n in range(4):
                request = client.build_request(
                    "POST", "/v1/chat/completions", json=body(f"{HOLD} order {n}?"), headers=support
                )
                r = await client.send(request, stream=True)
                assert r.status_code == 200
                pieces = r.aiter_lines()
                while '"content"' not in (line := await anext(pieces)) or '"content":""' in line:
                    pass  # the role piece first, then the provider's first text
                held.append(r.headers["x-switchyard-request-id"])
                streams.append((r, pieces))  # a dropped line iterator would close its stream
            await _kill_with_streams_open(proc, [r for r, _ in streams])
    finally:
        proc.kill()
        proc.wait()
    store, records = await _records_after_a_restart(policy_store.root, state, support)
    ids = [r.request_id for r in records]
    assert len(ids) == len(set(ids)), "a request has two records"
    by_id = {r.request_id: r for r in records}
    assert by_id[finished].status_code == 200 and by_id[finished].error_code is None
    assert set(held) <= set(by_id), f"{len(set(held) - set(by_id))} streams a client was reading have no record"
    with closing(sqlite3.connect(state / "ledger.db")) as db:
        charged = dict(db.execute("SELECT charge_id, nanos FROM charges").fetchall())
    for rid in held:
        record = by_id[rid]
        assert (record.status_code, record.error_code) == (502, "replica_lost")
        assert charged.get(rid) == usd_to_nanos(record.cost_usd) > 0, (
            "a cut-off stream's charge differs from its record"
        )
    assert charged.get(finished) == usd_to_nanos(by_id[finished].cost_usd)
    assert store.verify() == []


async def _stall_streams(
    client: httpx.AsyncClient, headers: dict[str, str], steps: tuple[str, ...], state: Path
) -> tuple[dict[str, str], list[httpx.Response]]:
    """One stream per step, each read to `[DONE]` and left with its settlement stopped at its
    step for good: (request id -> step, the responses, whose bodies end only with the replica)."""
    streamed: dict[str, str] = {}
    responses = []
    for step in steps:
        body = {
            "model": "auto",
            "stream": True,
            "messages": [{"role": "user", "content": f"[stall:{step}] where is my order?"}],
            "variables": {"product": "X"},
        }
        request = client.build_request("POST", "/v1/chat/completions", json=body, headers=headers)
        r = await client.send(request, stream=True)
        assert r.status_code == 200
        lines = [line async for line in _until_done(r.aiter_lines())]
        assert any('"content"' in line for line in lines)  # the whole answer, up to [DONE]
        streamed[r.headers["x-switchyard-request-id"]] = step
        responses.append(r)  # its body ends only once the settlement does
    stalled = state / "stalled"
    for _ in range(200):  # each settlement reaches its step after the client's last byte
        if stalled.is_dir() and set(streamed) <= {p.name for p in stalled.iterdir()}:
            break
        await asyncio.sleep(0.05)
    assert set(streamed) <= {p.name for p in stalled.iterdir()}, "a settlement never reached its step"
    return streamed, responses


def _stream_records(state: Path) -> list[RequestRecord]:
    return [e.entry for e in AuditStore.in_state_dir(state).find(limit=100_000) if isinstance(e.entry, RequestRecord)]


def _assert_recorded_at_the_ledgers_charges(
    state: Path, records: list[RequestRecord], streamed: dict[str, str]
) -> None:
    """Each stream cut off by its replica's death: one record, lost with its replica, whose cost
    and bills are what the ledger charged its request."""
    assert sorted(r.request_id for r in records) == sorted(streamed), "not exactly one record per stream"
    with closing(sqlite3.connect(state / "ledger.db")) as db:
        rows = db.execute("SELECT charge_id, model, nanos FROM charges ORDER BY charge_id").fetchall()
    for record in records:
        step = streamed[record.request_id]
        charges = [(model, nanos) for cid, model, nanos in rows if cid.split(".")[0] == record.request_id]
        assert charges, f"stream stopped at {step}: no charge"
        assert usd_to_nanos(record.cost_usd) == sum(n for _, n in charges), (
            f"stream stopped at {step}: recorded {usd_to_nanos(record.cost_usd)} nanos, charged {charges}"
        )
        assert [(b.model, usd_to_nanos(b.cost_usd)) for b in record.bills] == charges, f"stream stopped at {step}"
        assert (record.status_code, record.error_code) == (502, "replica_lost"), f"stream stopped at {step}"


async def test_a_replica_killed_at_any_step_of_a_streams_settlement_records_what_the_ledger_charged(
    tmp_path: Path,
) -> None:
    """Found in CI (the Serve kill test, twice in three runs): a stream whose replica died after
    its charge was journaled and before its stand-in record was restated got a record costing
    its whole reservation (5,776,900 nanos) while the ledger charged its real cost (5,850). Here
    the replica is killed at each step of a finished stream's settlement in turn (before the
    charge, between the charge and the restated stand-in, before the stream's own record);
    after the next replica's recovery each stream has one record, and its cost and bills are
    what the ledger charged it, whichever store the death left ahead."""
    state = tmp_path / "state"
    policy_store = _policies(tmp_path, state)
    keys = KeyStore.in_state_dir(state)
    support = {"authorization": f"Bearer {keys.create('support', Role.MEMBER)[0]}"}
    proc, base = _start_replica(policy_store.root, state)
    try:
        await _wait_ready(base, support, proc)
        async with httpx.AsyncClient(base_url=base, timeout=10) as client:
            streamed, responses = await _stall_streams(client, support, ("settle", "restate", "record"), state)
            await _kill_with_streams_open(proc, responses)
    finally:
        proc.kill()
        proc.wait()
    store, records = await _records_after_a_restart(policy_store.root, state, support)
    _assert_recorded_at_the_ledgers_charges(state, records, streamed)
    assert store.verify() == []


async def test_a_live_replica_sends_on_what_a_dead_neighbour_left_without_a_restart(tmp_path: Path) -> None:
    """Found reading the recovery (stop 34): only a replica *starting* on the host recovered a
    dead one's charge journal and audit spool. When Serve restarted the dead replica on another
    host, its journaled charges stayed out of the ledger while its holds expired (150 s) and
    their money was handed out again, and its cut-off streams had no audit record, until some
    replica next started there. Here two replicas share a host; one is killed with streams
    stopped before and after their charges; the other, never restarted, sends the charges to
    the ledger and records the streams at them within a few of its recovery passes."""
    state = tmp_path / "state"
    policy_store = _policies(tmp_path, state)
    keys = KeyStore.in_state_dir(state)
    support = {"authorization": f"Bearer {keys.create('support', Role.MEMBER)[0]}"}
    every_s = 0.5
    survivor, survivor_base = _start_replica(policy_store.root, state, every_s)
    doomed, doomed_base = _start_replica(policy_store.root, state, every_s)
    try:
        await _wait_ready(survivor_base, support, survivor)
        await _wait_ready(doomed_base, support, doomed)
        async with httpx.AsyncClient(base_url=doomed_base, timeout=10) as client:
            streamed, responses = await _stall_streams(client, support, ("settle", "restate"), state)
            await _kill_with_streams_open(doomed, responses)
        records: list[RequestRecord] = []
        for _ in range(int(20 / 0.1)):  # 40 of the survivor's passes
            records = _stream_records(state)
            if len(records) >= len(streamed):
                break
            await asyncio.sleep(0.1)
        assert survivor.poll() is None, "the survivor exited"
        assert records, "the live replica never recovered its dead neighbour's streams"
        _assert_recorded_at_the_ledgers_charges(state, records, streamed)
    finally:
        for proc in (doomed, survivor):
            proc.send_signal(signal.SIGTERM)
            proc.wait()
    assert not list((state / "budgets" / "journal").glob("*.charges")), "a journal was left"
    _assert_recorded_at_the_ledgers_charges(state, _stream_records(state), streamed)  # nothing twice
    assert AuditStore.in_state_dir(state).verify() == []


DISPUTE = {"model": "auto", "messages": [], "variables": {"dispute_id": "D-1", "summary": "charged twice"}}


@dataclass
class _PaymentsReplica:
    """One gateway replica with the SQLite audit sink, and a key of the payments team, whose
    dispute-review flow is high risk (and of the teams named `also`)."""

    payments: dict[str, str]
    also: dict[str, dict[str, str]]  # a team's headers
    sink: StoreAuditSink
    client: httpx.AsyncClient
    gate: InMemoryBudgetGate
    state: Path


def _payments_replica(
    tmp_path: Path, metrics: InMemoryMetrics | None = None, also: tuple[str, ...] = ()
) -> _PaymentsReplica:
    state = tmp_path / "state"
    policy_store = _policies(tmp_path, state)
    keys = KeyStore.in_state_dir(state)
    headers = {team: {"authorization": f"Bearer {keys.create(team, Role.MEMBER)[0]}"} for team in ("payments", *also)}
    sink, redactor = gateway_audit_parts(policy_store, state)
    client, gate = _replica(policy_store.current, keys, sink, redactor, [], metrics)  # the keys made so far
    return _PaymentsReplica(headers.pop("payments"), headers, sink, client, gate, state)


async def _records_once_the_store_is_back(gw: _PaymentsReplica) -> dict[str, RequestRecord]:
    """Every request record, by request id, once the replica has shut down and its spool
    drained into the store."""
    await gw.sink.close()
    await gw.client.aclose()
    store = AuditStore.in_state_dir(gw.state)
    try:
        return {e.entry.request_id: e.entry for e in store.find(limit=100) if isinstance(e.entry, RequestRecord)}
    finally:
        store.close()


async def _a_commit_that_hangs(
    client: httpx.AsyncClient, headers: dict[str, str], sink: StoreAuditSink, monkeypatch: pytest.MonkeyPatch
) -> tuple[asyncio.Task[httpx.Response], threading.Event]:
    """A high-risk request whose audit commit hangs, as one behind a lock that another session
    holds and does not let go, until the event returned is set; returns once it is under way."""
    real = sink.store.append
    entered, release = threading.Event(), threading.Event()

    def hung(items: Sequence[PendingEntry]) -> int:
        entered.set()
        release.wait(30)
        return real(items)

    monkeypatch.setattr(sink.store, "append", hung)
    under_way = asyncio.create_task(client.post("/v1/chat/completions", json=DISPUTE, headers=headers))
    assert await asyncio.to_thread(entered.wait, 10)
    return under_way, release


async def test_a_withheld_high_risk_answer_is_recorded_as_the_503_its_caller_got(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The audit store refuses a high-risk record: the answer is withheld (503) and its record
    is kept for the store's return. That record states what the caller got, not the 200 the
    model's answer would have been."""
    metrics = InMemoryMetrics()
    gw = _payments_replica(tmp_path, metrics)
    sink, payments = gw.sink, gw.payments
    real = sink.store.append

    def full_disk(items: Sequence[PendingEntry]) -> int:
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(sink.store, "append", full_disk)
    r = await gw.client.post("/v1/chat/completions", json=DISPUTE, headers=payments)
    assert r.status_code == 503 and r.json()["error"]["code"] == "audit_unavailable", r.text
    assert metrics.requests == {("payments", "dispute-review", 503, "anthropic"): 1}  # counted as what it got
    # One error logged for one refusal: the owned task that withheld the answer did not fail.
    assert not [r for r in caplog.records if r.name == "switchyard.gateway.owned_tasks"]
    monkeypatch.setattr(sink.store, "append", real)
    [record] = (await _records_once_the_store_is_back(gw)).values()  # the spool drains into it
    assert record.request_id == r.headers["x-switchyard-request-id"]
    assert (record.status_code, record.error_code) == (503, "audit_unavailable")
    assert record.cost_usd == pytest.approx(sum(usd for _, usd, _ in gw.gate.settled)) and record.cost_usd > 0


async def test_a_withheld_answer_is_kept_when_the_database_is_gone_for_the_keyring_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The database goes away between a high-risk record's build and its commit, as a shared
    Postgres does for the audit store and the subject keyring alike. The answer is withheld
    and its record kept for the store's return. The record kept was built again, to say 503,
    and that build read the subject's key from the database that had just gone: it failed, and
    the record of a billed request was lost."""
    gw = _payments_replica(tmp_path)
    real_append, keyring = gw.sink.store.append, gw.sink.builder.keyring
    real_key_for = keyring.key_for

    def unreachable(*_: object) -> NoReturn:
        raise sqlite3.OperationalError("unable to open database file")

    def database_gone(items: Sequence[PendingEntry]) -> NoReturn:
        monkeypatch.setattr(keyring, "key_for", unreachable)  # from now on, for the keyring too
        unreachable()

    monkeypatch.setattr(gw.sink.store, "append", database_gone)
    r = await gw.client.post("/v1/chat/completions", json=DISPUTE, headers=gw.payments)
    assert r.status_code == 503 and r.json()["error"]["code"] == "audit_unavailable", r.text
    monkeypatch.setattr(gw.sink.store, "append", real_append)  # the database is back
    monkeypatch.setattr(keyring, "key_for", real_key_for)
    records = list((await _records_once_the_store_is_back(gw)).values())
    assert [(x.request_id, x.status_code, x.error_code) for x in records] == [
        (r.headers["x-switchyard-request-id"], 503, "audit_unavailable")
    ]
    assert records[0].cost_usd == pytest.approx(sum(usd for _, usd, _ in gw.gate.settled)) and records[0].cost_usd > 0
    assert records[0].output.storage is not BodyStorage.NONE  # its bodies were kept too


async def test_answers_queued_behind_a_hung_audit_commit_are_withheld_at_their_deadline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The audit store hangs in a commit (a session holding the chain's lock that does not go
    on). The high-risk answers queued behind it are withheld at their deadline (503), not held
    for as long as the store hangs; each is recorded as withheld once the store is back. The
    answer whose commit was under way is answered when its commit ends."""
    gw = _payments_replica(tmp_path)
    under_way, release = await _a_commit_that_hangs(gw.client, gw.payments, gw.sink, monkeypatch)
    short = {**gw.payments, DEADLINE_HEADER: "1500"}
    started = time.monotonic()
    try:
        queued = await asyncio.wait_for(
            asyncio.gather(*(gw.client.post("/v1/chat/completions", json=DISPUTE, headers=short) for _ in range(3))), 8
        )
    finally:
        waited = time.monotonic() - started
        release.set()
    assert [r.status_code for r in queued] == [503] * 3 and waited < 4, (waited, [r.text for r in queued])
    assert {r.json()["error"]["code"] for r in queued} == {"audit_unavailable"}
    assert (await under_way).status_code == 200  # its transaction was under way: it committed
    records = await _records_once_the_store_is_back(gw)
    assert {rid: (r.status_code, r.error_code) for rid, r in records.items()} == {
        (await under_way).headers["x-switchyard-request-id"]: (200, None),
        **{r.headers["x-switchyard-request-id"]: (503, "audit_unavailable") for r in queued},
    }


async def test_a_high_risk_stream_ends_by_its_deadline_behind_a_hung_audit_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stream's bytes are out before its record is stored, but its response ends only once
    the record is: a client that reads the response to its end (here httpx, as curl and
    `requests` do) was held behind a hung audit commit for as long as the store hung. Now the
    record waits until the deadline, then is kept for the store's return."""
    gw = _payments_replica(tmp_path, also=("legal",))
    legal = {**gw.also["legal"], DEADLINE_HEADER: "1500"}
    under_way, release = await _a_commit_that_hangs(gw.client, gw.payments, gw.sink, monkeypatch)
    review = {"model": "auto", "messages": [], "variables": {"jurisdiction": "EU"}, "stream": True}
    started = time.monotonic()
    try:
        stream = await asyncio.wait_for(gw.client.post("/v1/chat/completions", json=review, headers=legal), 8)
    finally:
        waited = time.monotonic() - started
        release.set()
    assert stream.status_code == 200 and stream.text.rstrip().endswith("data: [DONE]") and waited < 4, waited
    assert (await under_way).status_code == 200
    record = (await _records_once_the_store_is_back(gw))[stream.headers["x-switchyard-request-id"]]
    assert record.status_code == 200  # its kept record drained into the store


async def test_a_high_risk_error_ends_by_its_deadline_behind_a_hung_audit_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An error is the answer, so it is not withheld, but it was sent only once its record was
    stored: behind a hung audit commit, a high-risk error (here the model's answer breaks the
    flow's output schema) held its caller for as long as the store hung. Now its record waits
    until the deadline, then is kept for the store's return."""
    gw = _payments_replica(tmp_path)
    under_way, release = await _a_commit_that_hangs(gw.client, gw.payments, gw.sink, monkeypatch)
    broken = {**DISPUTE, "variables": {"dispute_id": "D-2", "summary": f"charged twice {MISSHAPEN}"}}
    started = time.monotonic()
    try:
        r = await asyncio.wait_for(
            gw.client.post("/v1/chat/completions", json=broken, headers={**gw.payments, DEADLINE_HEADER: "1500"}), 8
        )
    finally:
        waited = time.monotonic() - started
        release.set()
    assert r.status_code == 422 and waited < 4, (waited, r.text)
    assert r.json()["error"]["code"] == "output_contract_violated"
    assert (await under_way).status_code == 200
    record = (await _records_once_the_store_is_back(gw))[r.headers["x-switchyard-request-id"]]
    assert (record.status_code, record.error_code) == (422, "output_contract_violated")  # kept, then drained
