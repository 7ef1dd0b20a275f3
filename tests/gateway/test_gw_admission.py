"""Admission control: a saturated replica sheds batch flows first and urgent flows last, with
503 `overloaded` + Retry-After, a metric and an audit record; releasing the load lets traffic
through again. Serve's backpressure from an in-cluster model gets the same answer."""

from __future__ import annotations

import asyncio
import gc
import json
import shutil
from pathlib import Path
from typing import Any

import openai
import pytest
import yaml
from gw_fakes import FakeUpstreams
from gw_harness import Harness, build_harness, make_keys

from switchyard.gateway.admission_control import AdmissionController, Shed, Ticket
from switchyard.gateway.providers.base import ChatProvider, Completion, ProviderCall, ProviderOverloaded
from switchyard.gateway.providers.inprocess import InProcessProvider
from switchyard.gateway.results import StreamResult
from switchyard.gateway.seams import Usage
from switchyard.policy.errors import PolicyError
from switchyard.policy.loader import load_policy_set
from switchyard.policy.models import AdmissionSettings, Priority, ShedThresholds

pytestmark = pytest.mark.asyncio(loop_scope="session")

SECRET = "do-not-echo-7731"
ADMISSION = {
    "max_in_flight": 4,
    "shed_at": {"batch": 0.5, "standard": 0.75, "urgent": 1.0},
    "urgent_teams": ["payments", "support", "qa"],
    "max_retry_after_s": 30,
}
FLOWS = {
    "urgent-chat": {"prompt": "assistant@1", "model": "gpt-4o-mini", "priority": "urgent"},
    "std-chat": {"prompt": "assistant@1", "model": "gpt-4o-mini"},
    "batch-chat": {"prompt": "assistant@1", "model": "gpt-4o-mini", "priority": "batch"},
    "local-first": {"prompt": "assistant@1", "model": "local-gpt", "fallback": [{"model": "gpt-4o-mini"}]},
}


@pytest.fixture(scope="module")
def adm_dirs(
    gw_dirs: tuple[Path, Path, dict[str, str]], tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, Path, dict[str, str]]:
    """The gateway tests' policies with a 4-request replica and qa flows of each priority."""
    root = tmp_path_factory.mktemp("admission")
    policies = root / "policies"
    shutil.copytree(gw_dirs[0], policies)
    org = yaml.safe_load((policies / "org.yaml").read_text())
    org["gateway"] = {"admission": ADMISSION}
    (policies / "org.yaml").write_text(yaml.safe_dump(org))
    qa = yaml.safe_load((policies / "teams" / "qa.yaml").read_text())
    qa["flows"].update(FLOWS)
    (policies / "teams" / "qa.yaml").write_text(yaml.safe_dump(qa))
    providers = yaml.safe_load((policies / "providers.yaml").read_text())
    providers["providers"]["openai"]["timeout_s"] = 60  # held calls must not time out
    (policies / "providers.yaml").write_text(yaml.safe_dump(providers))
    state = root / "state"
    state.mkdir()
    return policies, state, make_keys(state)


class Gate:
    """An upstream that holds every call until opened, so N requests are in flight at once."""

    def __init__(self) -> None:
        self.opened = asyncio.Event()
        self.entered = 0
        self._changed = asyncio.Event()

    async def __call__(self, call: ProviderCall) -> Completion:
        self.entered += 1
        self._changed.set()
        await self.opened.wait()
        return Completion("released", Usage(3, 1), "stop", call.model_version)

    async def until_entered(self, n: int) -> None:
        async with asyncio.timeout(10):  # a hang guard, not a speed assertion
            while self.entered < n:
                self._changed.clear()
                await self._changed.wait()


def harness(dirs: tuple[Path, Path, dict[str, str]], **overrides: ChatProvider) -> Harness:
    return build_harness(*dirs, overrides=overrides)


async def ask(client: openai.AsyncOpenAI, flow: str) -> Any:
    return await client.chat.completions.with_raw_response.create(
        model="auto",
        messages=[{"role": "user", "content": f"hello {SECRET}"}],
        extra_headers={"x-switchyard-flow": flow},
    )


async def shed(client: openai.AsyncOpenAI, flow: str) -> openai.APIStatusError:
    with pytest.raises(openai.APIStatusError) as info:
        await ask(client, flow)
    return info.value


async def test_saturated_replica_sheds_batch_first_and_urgent_last(
    adm_dirs: tuple[Path, Path, dict[str, str]],
) -> None:
    gate = Gate()
    gw = harness(adm_dirs, openai=InProcessProvider("openai", gate))
    client = gw.client("qa")
    try:
        held = [asyncio.create_task(ask(client, "std-chat")) for _ in range(2)]
        await gate.until_entered(2)  # 2 of 4 in flight: batch (shed from 50 %) is refused

        err = await shed(client, "batch-chat")
        assert err.status_code == 503 and int(err.response.headers["retry-after"]) >= 1
        body = err.response.json()["error"]
        assert body["code"] == "overloaded" and body["type"] == "service_unavailable"
        assert "saturated for batch flows (2 of 4" in body["message"]
        assert SECRET not in err.response.text
        assert err.response.headers["x-switchyard-provider"] == "none"

        held.append(asyncio.create_task(ask(client, "std-chat")))  # standard still fits: 2 < 3
        await gate.until_entered(3)
        err = await shed(client, "std-chat")
        assert err.status_code == 503 and "standard flows are shed from 3" in err.response.json()["error"]["message"]

        held.append(asyncio.create_task(ask(client, "urgent-chat")))  # urgent until the replica is full
        await gate.until_entered(4)
        err = await shed(client, "urgent-chat")
        assert err.status_code == 503 and "at capacity (4 of 4" in err.response.json()["error"]["message"]
        assert gate.entered == 4  # no shed request reached the provider

        assert gw.metrics.sheds == {
            ("qa", "batch-chat", "batch", "priority"): 1,
            ("qa", "std-chat", "standard", "priority"): 1,
            ("qa", "urgent-chat", "urgent", "capacity"): 1,
        }
        assert gw.metrics.requests[("qa", "batch-chat", 503, "none")] == 1
        status = await gw.status()
        assert status["admission"]["replica"] == {
            "in_flight": 4,
            "capacity": 4,
            "service_ms": None,
            "completed": 0,
            "shed": 3,
        }
        assert {"team": "qa", "flow": "batch-chat", "priority": "batch", "reason": "priority", "count": 1} in status[
            "counters"
        ]["shed"]
        records = [e for e in gw.audit.exchanges if e.error_code == "overloaded"]
        assert len(records) == 3
        assert {(e.status_code, e.budget_decision, e.cost_usd, e.attempts) for e in records} == {
            (503, "not_reached", 0.0, ())
        }
        assert len(gw.budget.held) == 4  # the admitted ones: a shed request reserved nothing

        gate.opened.set()
        assert {(await t).http_response.status_code for t in held} == {200}
        raw = await ask(client, "batch-chat")  # the load is gone: batch is admitted again
        assert raw.parse().choices[0].message.content == "released"
        status = await gw.status()
        assert status["admission"]["replica"]["in_flight"] == 0
        assert status["admission"]["replica"]["completed"] == 5
    finally:
        gate.opened.set()
        await gw.aclose()


async def test_a_stream_holds_its_slot_until_its_last_byte(adm_dirs: tuple[Path, Path, dict[str, str]]) -> None:
    gate = Gate()
    gate.opened.set()
    gw = harness(adm_dirs, openai=InProcessProvider("openai", gate))
    body = json.dumps({"model": "auto", "stream": True, "messages": [{"role": "user", "content": "hi"}]}).encode()
    headers = {"authorization": f"Bearer {adm_dirs[2]['qa']}", "x-switchyard-flow": "std-chat"}
    admission = gw.parts.admission
    settings = gw.store.current.org.gateway.admission

    def in_flight() -> int:
        return int(admission.snapshot(settings)["replica"]["in_flight"])

    try:
        result = await gw.pipeline.handle(body, headers)
        assert isinstance(result, StreamResult) and in_flight() == 1
        chunks = [c async for c in result.body]
        assert chunks[-1] == b"data: [DONE]\n\n" and in_flight() == 0
        # A stream the server never starts (the client went away) still gives its slot back.
        result = await gw.pipeline.handle(body, headers)
        assert in_flight() == 1
        del result
        gc.collect()
        assert in_flight() == 0
    finally:
        await gw.aclose()


async def overloaded_model(call: ProviderCall) -> Completion:
    raise ProviderOverloaded("local's request queue is full", queued=32, max_queued=32)


async def test_in_cluster_backpressure_is_a_503_with_retry_after(
    adm_dirs: tuple[Path, Path, dict[str, str]], upstreams: FakeUpstreams
) -> None:
    upstreams.reset()
    local = InProcessProvider("local", overloaded_model)
    gw = harness(adm_dirs, local=local)
    try:
        with pytest.raises(openai.APIStatusError) as info:
            await gw.client("demo").chat.completions.create(
                model="auto", messages=[{"role": "user", "content": f"hi {SECRET}"}]
            )
        err = info.value
        assert err.status_code == 503 and int(err.response.headers["retry-after"]) >= 1
        assert err.response.json()["error"]["code"] == "overloaded" and SECRET not in err.response.text
        assert local.calls == 1  # not retried against a full queue
        assert gw.parts.circuits.breaker("local").failure_rate() == 0.0  # busy is not broken
        assert gw.metrics.sheds == {("demo", "chat", "standard", "backpressure"): 1}

        # A flow with a fallback rule for rate_limited moves on instead.
        upstreams.openai.reply = "answered elsewhere"
        raw = await ask(gw.client("qa"), "local-first")
        assert raw.parse().choices[0].message.content == "answered elsewhere"
        assert raw.headers["x-switchyard-fallback"] == "local-gpt:rate_limited"
        assert len(gw.metrics.sheds) == 1  # answered: not shed
    finally:
        await gw.aclose()


# ---------------------------------------------------------------- the controller alone


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def settings(**kw: Any) -> AdmissionSettings:
    return AdmissionSettings(max_in_flight=4, shed_at=ShedThresholds(batch=0.5, standard=0.75, urgent=1.0), **kw)


def admitted(result: Ticket | Shed) -> Ticket:
    assert isinstance(result, Ticket), result
    return result


def refused(result: Ticket | Shed) -> Shed:
    assert isinstance(result, Shed), result
    return result


async def test_retry_after_follows_service_time_and_depth() -> None:
    clock = Clock()
    ctl = AdmissionController(clock)
    s = settings()
    first = admitted(ctl.admit(s, "a", Priority.URGENT, "openai"))
    clock.now += 8
    first.release()
    first.release()  # idempotent
    tickets = [admitted(ctl.admit(s, "a", Priority.URGENT, "openai")) for _ in range(4)]
    # S = 8 s, 4 in flight: one completion every 2 s. Batch needs 3 to finish (4 - 2 + 1).
    assert refused(ctl.admit(s, "a", Priority.BATCH, "openai")).retry_after_s == 6
    assert refused(ctl.admit(s, "a", Priority.STANDARD, "openai")).retry_after_s == 4
    full = refused(ctl.admit(s, "a", Priority.URGENT, "openai"))
    assert (full.reason, full.retry_after_s, full.provider) == ("capacity", 2, None)
    assert refused(ctl.admit(settings(max_retry_after_s=5), "a", Priority.BATCH, "openai")).retry_after_s == 5
    for t in tickets:
        t.release()
    snap = ctl.snapshot(s)
    assert snap["replica"]["in_flight"] == 0 and snap["replica"]["shed"] == 4
    assert snap["providers"]["openai"]["in_flight"] == 0


async def test_team_share() -> None:
    ctl = AdmissionController(Clock())
    s = settings(team_max_share=0.5)
    admitted(ctl.admit(s, "a", Priority.STANDARD, "openai"))
    admitted(ctl.admit(s, "a", Priority.BATCH, "openai"))
    share = refused(ctl.admit(s, "a", Priority.STANDARD, "openai"))
    assert (share.reason, share.in_flight, share.limit) == ("team_share", 2, 2)
    assert "the team already has 2 requests in flight" in share.message()
    admitted(ctl.admit(s, "b", Priority.STANDARD, "openai"))  # another team is not held back
    admitted(ctl.admit(s, "a", Priority.URGENT, "openai"))  # nor are urgent flows


async def test_provider_lane() -> None:
    ctl = AdmissionController(Clock())
    s = settings(provider_max_in_flight={"local": 2})
    admitted(ctl.admit(s, "a", Priority.URGENT, "local"))
    admitted(ctl.admit(s, "b", Priority.URGENT, "local"))
    pool = refused(ctl.admit(s, "c", Priority.URGENT, "local"))  # the replica has room (2 of 4)
    assert (pool.provider, pool.reason, pool.capacity) == ("local", "capacity", 2)
    assert "provider 'local' (from this gateway replica) is at capacity (2 of 2" in pool.message()
    admitted(ctl.admit(s, "c", Priority.URGENT, "openai"))  # other providers are not held back


# ---------------------------------------------------------------- policy validation


def violations(root: Path) -> list[str]:
    with pytest.raises(PolicyError) as info:
        load_policy_set(root)
    return [str(v) for v in info.value.violations]


@pytest.fixture
def policies(repo: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "policies"
    shutil.copytree(repo / "policies", dst)
    return dst


def set_admission(root: Path, **values: Any) -> None:
    org = yaml.safe_load((root / "org.yaml").read_text())
    org["gateway"]["admission"].update(values)
    (root / "org.yaml").write_text(yaml.safe_dump(org))


async def test_bad_admission_settings_are_named(policies: Path) -> None:
    set_admission(policies, shed_at={"batch": 0.9, "standard": 0.5}, max_in_flight=0)
    found = violations(policies)
    assert any(
        v.startswith("org.yaml: gateway.admission.shed_at: Value error, thresholds must rise with priority")
        and "got batch 0.9, standard 0.5, urgent 1.0" in v
        for v in found
    ), found
    assert any(v.startswith("org.yaml: gateway.admission.max_in_flight: Input should be greater than 0") for v in found)


async def test_unknown_provider_lane_and_team_are_named(policies: Path) -> None:
    set_admission(policies, provider_max_in_flight={"gpu": 4}, urgent_teams=["payments", "support", "nobody"])
    assert violations(policies) == [
        "org.yaml: gateway.admission.provider_max_in_flight.gpu: unknown provider 'gpu' (known: anthropic, "
        "azure-openai, bedrock, local, local-cpu, openai)",
        "org.yaml: gateway.admission.urgent_teams: unknown team 'nobody' (no teams/nobody.yaml)",
    ]


async def test_priority_is_validated_and_urgent_is_reserved(policies: Path) -> None:
    team = policies / "teams" / "analytics.yaml"
    team.write_text(team.read_text().replace("priority: batch", "priority: critical"))
    found = violations(policies)
    assert len(found) == 1 and found[0].startswith("teams/analytics.yaml: flows.summarise.priority: Input should be")
    team.write_text(team.read_text().replace("priority: critical", "priority: urgent"))
    assert violations(policies) == [
        "teams/analytics.yaml: flows.summarise.priority: flow analytics/summarise is urgent, but org.yaml "
        "gateway.admission.urgent_teams (payments, support) does not include team 'analytics'"
    ]
