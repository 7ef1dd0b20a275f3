"""Schemathesis fuzzes the gateway from its own OpenAPI document, over real sockets.

Every operation the document describes (chat completions, models, health, status, the audit
and spend admin endpoints) gets generated requests, valid and not. The promises checked on
each answer: never a 500; every 4xx in OpenAI's error shape, echoing none of the strings
sent; and no request whose audit record shows work past its deadline + 100 ms.

`make test` runs a bounded, derandomized number of cases per operation; the bench run
(`bench/gateway_fuzz.py`) runs 1,000 or more per operation, randomized with a printed seed.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests
import schemathesis
from fastapi import HTTPException, Request
from gw_harness import Harness, build_harness
from gw_server import ThreadedServer
from hypothesis import HealthCheck, settings

from switchyard.audit.gateway import gateway_audit_router
from switchyard.audit.http import audit_router
from switchyard.budgets.http import spend_router
from switchyard.budgets.ledger import BudgetLedger
from switchyard.db.engine import SqliteDatabase
from switchyard.gateway.http import create_app
from switchyard.gateway.planning import DEADLINE_HEADER, FLOW_HEADER, IDEMPOTENCY_HEADER
from switchyard.policy.keys import Principal
from switchyard.policy.policy_set import PolicySet

# A bench run sets the count and gets random cases (pytest --hypothesis-seed=N reproduces
# one); `make test` runs a fixed, derandomized set.
CHAT_EXAMPLES = int(os.environ.get("SWITCHYARD_FUZZ_EXAMPLES", "300"))
DERANDOMIZE = "SWITCHYARD_FUZZ_EXAMPLES" not in os.environ
OTHER_EXAMPLES = 100 if DERANDOMIZE else CHAT_EXAMPLES  # smaller operations: fewer distinct cases
SLACK_MS = 100.0
HEADER_NAMES = frozenset({FLOW_HEADER, DEADLINE_HEADER, IDEMPOTENCY_HEADER, "Authorization", "Content-Length"})
# URL schemes the gateway's own errors name ("an image URL must be https:// or a base64 data:
# URL"): a sent "https://" is not echoed by that sentence (found by CI's fuzz run).
MESSAGE_WORDS = frozenset({"https://", "data:"})
MIN_ECHO_LEN = 8  # shorter strings turn up in any answer by chance ("messages", "model")


@dataclass
class Served:
    url: str
    harness: Harness
    session: requests.Session
    known: frozenset[str]  # names the gateway may state in an error (teams, flows, models...)


def _routers(h: Harness, state: Path) -> list[Any]:
    def authenticate(request: Request) -> Principal:
        scheme, _, key = request.headers.get("authorization", "").partition(" ")
        who = h.parts.keys.verifier.verify(key.strip()) if scheme.lower() == "bearer" else None
        if who is None:
            raise HTTPException(401, "Authorization: Bearer <key> is missing, unknown or revoked")
        return who

    ledger = BudgetLedger(SqliteDatabase(state / "fuzz-ledger.db"))
    return [
        gateway_audit_router(h.store, state, lambda key: h.parts.keys.verifier.verify(key)),
        spend_router(lambda: ledger, authenticate),
    ]


def _known_names(ps: PolicySet) -> frozenset[str]:
    names = set(ps.teams) | set(ps.providers.models) | set(ps.providers.providers) | set(ps.data.classes)
    for team in ps.teams.values():
        names |= set(team.flows)
    return frozenset(names)


def _document() -> dict[str, Any]:
    """The gateway's document, admin routers included. Routers are closures over their stores,
    used only when a request comes, so the document is built here without any."""
    nothing: Any = None
    routers = [audit_router(nothing, nothing, nothing), spend_router(nothing, nothing)]
    return create_app(lambda: nothing, routers=routers).openapi()


def _schema_literals(node: Any) -> set[str]:
    """Field names and the values the schema enumerates (roles, types): an error may name them."""
    found: set[str] = set()
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "enum" and isinstance(value, list):
                found |= {v for v in value if isinstance(v, str)}
            elif key == "properties" and isinstance(value, dict):  # field names, which errors name
                found |= set(value)
                found |= _schema_literals(value)
            elif key == "const" and isinstance(value, str):
                found.add(value)
            else:
                found |= _schema_literals(value)
    elif isinstance(node, list):
        for value in node:
            found |= _schema_literals(value)
    return found


DOCUMENT = _document()
SCHEMA = schemathesis.openapi.from_dict(DOCUMENT)


@pytest.fixture(scope="module")
def served(gw_dirs: tuple[Path, Path, dict[str, str]]) -> Iterator[Served]:
    policies, state, keys = gw_dirs
    harness = build_harness(policies, state, keys)
    app = create_app(lambda: harness.pipeline, routers=_routers(harness, state), policy_state=harness.store.status)
    with ThreadedServer(app) as server, requests.Session() as session:
        known = _known_names(harness.store.current) | _schema_literals(DOCUMENT)
        yield Served(server.url, harness, session, frozenset(known))


def _sent_strings(case: Any) -> set[str]:
    found: set[str] = set()

    def walk(value: Any) -> None:
        if isinstance(value, str):
            found.add(value)
        elif isinstance(value, dict):  # values only: a key is a field name, which errors do name
            for v in value.values():
                walk(v)
        elif isinstance(value, list | tuple):
            for v in value:
                walk(v)

    for part in (case.body, case.query, case.path_parameters):
        walk(part)
    walk({k: v for k, v in (case.headers or {}).items() if k.lower() != "authorization"})
    return {s for s in found if len(s) >= MIN_ECHO_LEN}


def _key_for(served: Served, path: str) -> str:
    # Chat and models as a team member (so the fuzzer reaches the pipeline); the rest as the operator.
    return served.harness.keys["qa" if path in ("/v1/chat/completions", "/v1/models") else "operator"]


def _check(case: Any, served: Served) -> None:
    headers = {"authorization": f"Bearer {_key_for(served, case.path)}"}
    before = len(served.harness.audit.exchanges)
    resp = case.call(base_url=served.url, session=served.session, headers=headers, timeout=30)
    seed = f"{case.method} {case.path} (rerun the test, with the same --hypothesis-seed if one was given)"
    assert resp.status_code != 500, f"{seed}: 500 for {case.body!r:.300}: {resp.text[:300]}"
    if 400 <= resp.status_code < 500:
        body = resp.json()
        assert set(body) == {"error"} and {"type", "code", "message", "param"} <= set(body["error"]), (
            f"{seed}: {resp.status_code} not in OpenAI's error shape: {resp.text[:300]}"
        )
        message = str(body["error"]["message"])  # type and code are fixed vocabulary
        # The gateway's own words (headers, flow and model names, enums) are not echoes, nor
        # is a sent string that happens to be part of one of them.
        own = message
        for word in sorted(served.known | HEADER_NAMES | MESSAGE_WORDS, key=len, reverse=True):
            own = own.replace(word, " ")
        echoed = [s for s in _sent_strings(case) if s in own and s not in served.known]
        assert not echoed, f"{seed}: the error echoes what was sent: {echoed[:3]!r} in {message[:300]}"
    for exchange in list(served.harness.audit.exchanges)[before:]:
        budget_ms = exchange.ctx.deadline_s * 1000
        assert exchange.latency_ms <= budget_ms + SLACK_MS, (
            f"{seed}: request {exchange.ctx.request_id} took {exchange.latency_ms:.0f} ms "
            f"on a {budget_ms:.0f} ms deadline"
        )


_FUZZ = {"deadline": None, "derandomize": DERANDOMIZE, "database": None, "suppress_health_check": list(HealthCheck)}


@SCHEMA.include(path="/v1/chat/completions").parametrize()
@settings(max_examples=CHAT_EXAMPLES, **_FUZZ)
def test_fuzzed_chat_completions(case: Any, served: Served) -> None:
    _check(case, served)


@SCHEMA.exclude(path="/v1/chat/completions").parametrize()
@settings(max_examples=OTHER_EXAMPLES, **_FUZZ)
def test_fuzzed_models_health_status_audit_and_spend(case: Any, served: Served) -> None:
    _check(case, served)
