"""Hardening of the gateway's HTTP surface and refresh loop (issue "Hardening"): bad policy
files and a broken key database never stop the refresh, bodies are capped before they are
read, malformed input is a 400 naming the field, never a 500 or an echo, one team's large
personal message does not stall the replica, and health tells nothing without a key."""

from __future__ import annotations

import asyncio
import json
import shutil
import sqlite3
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from gw_harness import Harness, build_harness

from switchyard.gateway.http import create_app
from switchyard.gateway.runtime import Refresher, Sources
from switchyard.gateway.seams import Redacted, RedactionSummary
from switchyard.policy.models import Role

pytestmark = pytest.mark.asyncio(loop_scope="session")

CHAT = "/v1/chat/completions"
# The shipped defaults (org.yaml sets none of them); `test_default_limits` pins them.
MAX_BODY_BYTES = 32 * 1024 * 1024
MAX_MESSAGES = 2048
INTERNAL_MAX_TEXT_CHARS = 2_000_000


def _client(h: Harness) -> httpx.AsyncClient:
    return h.raw()


def _auth(h: Harness, team: str = "qa") -> dict[str, str]:
    return {"authorization": f"Bearer {h.keys[team]}"}


def _openai_error(resp: httpx.Response) -> dict[str, Any]:
    body = resp.json()
    assert set(body) == {"error"}, body
    assert set(body["error"]) == {"type", "code", "message", "param"}, body
    error: dict[str, Any] = body["error"]
    return error


# ---------------------------------------------------------------- finding 2: bodies


class _CountingBody:
    """A request body that records how much of it the server pulled."""

    def __init__(self, total: int, chunk: int = 1 << 20) -> None:
        self.total, self.chunk, self.sent = total, chunk, 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while self.sent < self.total:
            n = min(self.chunk, self.total - self.sent)
            self.sent += n
            yield b" " * n


async def test_unauthenticated_huge_body_is_refused_before_it_is_read(gw: Harness) -> None:
    body = _CountingBody(300 * 1024 * 1024)
    resp = await _client(gw).post(CHAT, content=body, headers={"content-type": "application/json"})
    assert resp.status_code == 401
    assert _openai_error(resp)["code"] == "missing_api_key"
    assert body.sent <= 2 * body.chunk, f"the server read {body.sent} bytes of an unauthenticated body"


async def test_declared_length_over_the_cap_is_413_without_reading(gw: Harness) -> None:
    cap = MAX_BODY_BYTES
    body = _CountingBody(cap + 1)
    headers = {**_auth(gw), "content-type": "application/json", "content-length": str(cap + 1)}
    resp = await _client(gw).post(CHAT, content=body, headers=headers)
    assert resp.status_code == 413
    error = _openai_error(resp)
    assert error["code"] == "request_too_large" and str(cap) in error["message"]
    assert body.sent <= body.chunk


async def test_streamed_body_past_the_cap_is_cut_off(gw: Harness) -> None:
    cap = MAX_BODY_BYTES
    body = _CountingBody(cap * 3)  # chunked: no Content-Length to refuse it by
    resp = await _client(gw).post(CHAT, content=body, headers={**_auth(gw), "content-type": "application/json"})
    assert resp.status_code == 413
    assert body.sent <= cap + 2 * body.chunk, f"read {body.sent} bytes past a {cap}-byte cap"


# ---------------------------------------------------------------- finding 5: malformed input


def _nested(depth: int) -> bytes:
    return b'{"model": "auto", "messages": [], "variables": {"x": ' + b"[" * depth + b"]" * depth + b"}}"


MALFORMED: dict[str, tuple[bytes, str | None]] = {
    "json nested 5000 deep": (b'{"model": "auto", "x": ' + b"[" * 5000 + b"]" * 5000 + b"}", None),
    "variables nested 100 deep": (_nested(100), "variables.x"),
    "integer of 4400 digits": (b'{"model": "auto", "max_tokens": ' + b"7" * 4400 + b"}", None),
    "NaN temperature": (b'{"model": "auto", "temperature": NaN}', None),
    "lone surrogate": (b'{"model": "auto", "messages": [{"role": "user", "content": "hi \\ud800 SECRET"}]}', None),
    "variable named self": (b'{"model": "auto", "messages": [], "variables": {"self": 1}}', None),
    "wrong content type": (b'{"model": "auto", "messages": [{"role": "user", "content": 7}]}', None),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
async def test_malformed_request_is_a_400_naming_the_field_never_a_500(gw: Harness, case: str) -> None:
    raw, param = MALFORMED[case]
    resp = await _client(gw).post(CHAT, content=raw, headers={**_auth(gw), "content-type": "application/json"})
    if case == "variable named self":
        # Not malformed at all: a variable may be called anything the template does not need.
        assert resp.status_code == 200, resp.text
        return
    assert resp.status_code == 400, resp.text
    error = _openai_error(resp)
    assert error["type"] == "invalid_request_error"
    if param is not None:
        assert error["param"] == param
    assert "SECRET" not in resp.text and "7777777777" not in resp.text


async def test_lone_surrogate_names_its_json_path(gw: Harness) -> None:
    raw = b'{"model": "auto", "messages": [{"role": "user", "content": "ok"}, {"role": "user", "content": "\\udfff"}]}'
    resp = await _client(gw).post(CHAT, content=raw, headers={**_auth(gw), "content-type": "application/json"})
    assert resp.status_code == 400
    assert _openai_error(resp)["param"] == "messages[1].content"


async def test_too_many_messages_and_too_much_text_per_data_class(gw: Harness) -> None:
    many = {"model": "auto", "messages": [{"role": "user", "content": "x"}] * (MAX_MESSAGES + 1)}
    resp = await _client(gw).post(CHAT, json=many, headers=_auth(gw))
    assert resp.status_code == 400 and _openai_error(resp)["code"] == "too_many_messages"
    big = {"model": "auto", "messages": [{"role": "user", "content": "y" * (INTERNAL_MAX_TEXT_CHARS + 1)}]}
    resp = await _client(gw).post(CHAT, json=big, headers=_auth(gw))
    assert resp.status_code == 400
    error = _openai_error(resp)
    assert error["code"] == "text_too_long" and "internal" in error["message"]


async def test_default_limits(gw: Harness) -> None:
    limits = gw.store.current.org.gateway.limits
    assert (limits.max_body_bytes, limits.max_messages) == (MAX_BODY_BYTES, MAX_MESSAGES)
    assert gw.store.current.data.classes["internal"].max_text_chars == INTERNAL_MAX_TEXT_CHARS


@pytest.mark.parametrize("since", ["9" * 400 + "d", "²d", "1e999", "9" * 30])
async def test_audit_since_is_validated_without_echo(gw: Harness, since: str) -> None:
    from switchyard.audit.query import parse_since

    with pytest.raises(ValueError) as err:
        parse_since(since)
    assert since[:-1] not in str(err.value)


# ---------------------------------------------------------------- finding 6: health


async def test_health_without_a_key_says_only_live_and_ready(gw: Harness) -> None:
    client = _client(gw)
    assert (await client.get("/healthz")).json() == {"live": True, "ready": True}
    assert (await client.get("/healthz", headers=_auth(gw))).json() == {"live": True, "ready": True}
    status = await client.get("/v1/switchyard/status")
    assert status.status_code == 401 and "qa" not in status.text
    member = await client.get("/v1/switchyard/status", headers=_auth(gw))
    assert member.status_code == 403 and _openai_error(member)["code"] == "role_not_allowed"
    detail = await client.get("/healthz", headers=_auth(gw, "operator"))
    assert "circuits" in detail.json() and "policy" in detail.json()


# ---------------------------------------------------------------- finding 3: redaction off the loop


class _SlowForLargeRedactor:
    """Blocks its thread for a while on large input, as Presidio does on 100 KB."""

    def __init__(self, block_s: float) -> None:
        self.block_s = block_s

    def redact(self, messages: list[dict[str, str]], data_class: str) -> Redacted:
        if sum(len(m.get("content", "")) for m in messages) > 50_000:
            time.sleep(self.block_s)
        return Redacted(messages, RedactionSummary("reversible"))

    def restorer(self, redacted: Redacted) -> Any:
        from switchyard.audit.restore import PlaceholderRestorer

        return PlaceholderRestorer({})


async def test_a_large_message_being_redacted_does_not_stall_other_requests(gw: Harness) -> None:
    gw.parts.redactor = _SlowForLargeRedactor(block_s=1.5)
    client = _client(gw)
    large = {"model": "auto", "messages": [{"role": "user", "content": "word " * 20_000}]}
    slow = asyncio.create_task(client.post(CHAT, json=large, headers=_auth(gw)))
    await asyncio.sleep(0.05)  # the large one is in its redaction now
    started = time.monotonic()
    small = await client.post(
        CHAT, json={"model": "auto", "messages": [{"role": "user", "content": "hi"}]}, headers=_auth(gw, "qa")
    )
    small_s = time.monotonic() - started
    assert small.status_code == 200
    assert not slow.done(), "the large request should still be redacting"
    assert small_s < 0.75, f"a small request waited {small_s:.2f} s behind another team's redaction"
    assert (await slow).status_code == 200


# ---------------------------------------------------------------- finding 1: the refresh loop


def _latin1_byte(p: Path) -> None:
    ads = p / "teams" / "ads.yaml"
    ads.write_bytes(ads.read_bytes().replace(b"description:", b"description: caf\xe9 ", 1))


def _duplicate_key(p: Path) -> None:
    ads = p / "teams" / "ads.yaml"
    ads.write_text(ads.read_text() + "description: a second description\n")


def _alias_bomb(p: Path) -> None:
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 10)]
    (p / "teams" / "bomb.yaml").write_text("\n".join(lines) + "\n")


def _huge_file(p: Path) -> None:
    with (p / "teams" / "huge.yaml").open("wb") as f:
        f.truncate(50 * 1024 * 1024)


def _missing_file(p: Path) -> None:
    (p / "providers.yaml").unlink()


def _half_written(p: Path) -> None:
    qa = p / "teams" / "qa.yaml"  # a writer that is not atomic, caught half-way through
    raw = qa.read_bytes()
    qa.write_bytes(raw[: len(raw) // 2])


BAD_DIRECTORIES = {
    "invalid UTF-8": (_latin1_byte, "teams/ads.yaml"),
    "duplicate key": (_duplicate_key, "teams/ads.yaml"),
    "alias bomb": (_alias_bomb, "teams/bomb.yaml"),
    "50 MB file": (_huge_file, "teams/huge.yaml"),
    "missing file": (_missing_file, "providers.yaml"),
    "file half written": (_half_written, "teams/qa.yaml"),
}


@pytest.mark.parametrize("case", list(BAD_DIRECTORIES))
async def test_bad_policy_directory_keeps_serving_and_revocation_working(
    gw_dirs: tuple[Path, Path, dict[str, str]], tmp_path: Path, case: str
) -> None:
    """Finding 1: the refresh loop survives every kind of bad file; the last good set stays
    in force, health says degraded, and a key revoked meanwhile stops working."""
    spoil, culprit = BAD_DIRECTORIES[case]
    policies = tmp_path / "policies"
    shutil.copytree(gw_dirs[0], policies)
    state = tmp_path / "state"
    state.mkdir()
    sources = Sources.open(policies, state)
    harness = build_harness(policies, state, {})
    harness.parts.policies = lambda: sources.policies.current
    snapshot = harness.parts.keys
    refresher = Refresher(sources, snapshot, refresh_s=0.02)
    key, record = sources.keys.create("qa", Role.MEMBER)
    operator, _ = sources.keys.create("platform", Role.PLATFORM_ADMIN)
    app = create_app(lambda: harness.pipeline, policy_state=sources.policies.status)
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway")
    loop = asyncio.create_task(refresher.run())
    chat = {"model": "auto", "messages": [{"role": "user", "content": "hi"}]}
    try:
        await _until(lambda: snapshot.verifier.verify(key) is not None)
        in_force = sources.policies.current
        spoil(policies)
        await _until(lambda: sources.policies.last_error is not None)
        assert culprit in (sources.policies.last_error or "")
        resp = await client.post(CHAT, json=chat, headers={"authorization": f"Bearer {key}"})
        assert resp.status_code == 200, "the gateway must keep serving on the last good set"
        sources.keys.revoke(record.key_id)
        started = time.monotonic()
        await _until(lambda: snapshot.verifier.verify(key) is None)
        assert time.monotonic() - started < 1.0, "revocation must take effect within the refresh interval"
        assert not loop.done() and sources.policies.current is in_force
        resp = await client.post(CHAT, json=chat, headers={"authorization": f"Bearer {key}"})
        assert resp.status_code == 401
        detail = (await client.get("/v1/switchyard/status", headers={"authorization": f"Bearer {operator}"})).json()
        assert detail["policy"]["state"] == "degraded" and culprit in detail["policy"]["last_error"]
        journal = [json.loads(line) for line in (state / "policy_changes.jsonl").read_text().splitlines()]
        assert journal[-1]["applied"] is False and culprit in journal[-1]["error"]
    finally:
        loop.cancel()
        await client.aclose()
        await harness.aclose()


async def test_refresh_outcomes_reach_the_metrics(gw_dirs: tuple[Path, Path, dict[str, str]], tmp_path: Path) -> None:
    policies = tmp_path / "policies"
    shutil.copytree(gw_dirs[0], policies)
    state = tmp_path / "state"
    state.mkdir()
    sources = Sources.open(policies, state)
    observed: list[tuple[str, bool]] = []
    refresher = Refresher(sources, sources.key_snapshot(), observe=lambda s, ok: observed.append((s, ok)))
    refresher.refresh_once()
    assert observed == [("keys", True), ("policies", True)]
    _latin1_byte(policies)
    refresher.refresh_once()
    assert observed[-1] == ("policies", False) and refresher.state()["state"] == "degraded"


async def test_key_database_errors_do_not_hold_back_policy_refresh(
    gw_dirs: tuple[Path, Path, dict[str, str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    policies = tmp_path / "policies"
    shutil.copytree(gw_dirs[0], policies)
    state = tmp_path / "state"
    state.mkdir()
    sources = Sources.open(policies, state)
    snapshot = sources.key_snapshot()
    refresher = Refresher(sources, snapshot, refresh_s=0.02)

    def locked() -> int:
        raise sqlite3.OperationalError("database is locked")

    monkeypatch.setattr(sources.keys, "version", locked)
    loop = asyncio.create_task(refresher.run())
    try:
        before = sources.policies.current
        qa = policies / "teams" / "qa.yaml"
        qa.write_text(qa.read_text().replace("Test team", "Test team, edited"))
        await _until(lambda: sources.policies.current is not before)
        await asyncio.sleep(0.1)  # several more ticks, each failing to read keys.db
        assert not loop.done(), f"the refresh loop ended: {loop.exception() if loop.done() else ''}"
        assert refresher.state()["keys"]["state"] == "degraded"
    finally:
        loop.cancel()


async def test_replica_starts_on_the_last_good_set_when_the_files_are_bad(
    gw_dirs: tuple[Path, Path, dict[str, str]], tmp_path: Path
) -> None:
    from switchyard.policy.errors import PolicyError
    from switchyard.policy.store import PolicyStore

    policies = tmp_path / "policies"
    shutil.copytree(gw_dirs[0], policies)
    state = tmp_path / "state"
    state.mkdir()
    good = PolicyStore(policies, state).current
    (policies / "org.yaml").write_bytes(b"org: acme\n\xff\n")
    restarted = PolicyStore(policies, state)
    assert restarted.degraded and restarted.current.fingerprint == good.fingerprint
    assert "org.yaml" in (restarted.last_error or "")
    (policies / "org.yaml").write_bytes((gw_dirs[0] / "org.yaml").read_bytes())
    assert restarted.refresh() and not restarted.degraded
    # With nothing good ever saved, a bad directory still refuses to start.
    fresh = tmp_path / "fresh-state"
    fresh.mkdir()
    (policies / "org.yaml").write_bytes(b"\xff")
    with pytest.raises(PolicyError):
        PolicyStore(policies, fresh)


async def test_a_last_good_copy_changed_on_disk_is_refused_not_served(
    gw_dirs: tuple[Path, Path, dict[str, str]], tmp_path: Path
) -> None:
    """Found by damaging the state dir (stop 44): a replica starting while the policy files
    were bad loaded the last good copy without checking it was the set saved there. A copy
    changed on disk that still loaded (here a team's monthly budget, 6000 -> 7000) was served,
    and the status said only "degraded"; a copy that no longer loaded raised its own error with
    no word of the live files'. Now both refuse, naming the copy and the live files."""
    from switchyard.policy.errors import PolicyError
    from switchyard.policy.store import PolicyStore

    policies = tmp_path / "policies"
    shutil.copytree(gw_dirs[0], policies)
    state = tmp_path / "state"
    state.mkdir()
    PolicyStore(policies, state)
    (policies / "org.yaml").write_bytes(b"org: acme\n\xff\n")
    saved = PolicyStore(policies, state)._last_good
    copy = saved.path() if saved is not None else None
    assert copy is not None
    team = copy / "teams" / "search.yaml"
    assert "month_usd: 6000" in team.read_text()
    team.write_text(team.read_text().replace("month_usd: 6000", "month_usd: 7000"))
    with pytest.raises(PolicyError) as refused:
        PolicyStore(policies, state)
    said = str(refused.value)
    assert "org.yaml" in said and str(copy) in said and "changed after it was saved" in said, said
    team.write_text("teams: [")
    with pytest.raises(PolicyError) as refused:
        PolicyStore(policies, state)
    said = str(refused.value)
    assert "org.yaml" in said and "the last good copy does not load either" in said, said


async def _until(condition: Any, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.01)
