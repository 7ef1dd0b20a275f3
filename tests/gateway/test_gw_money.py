"""Money on the paths a happy demo never takes (issue "money and audit", findings 1 and 2):
a fallback to a pricier model stays within the flow's budget, and every attempt a provider
billed is charged, at the price of the model that billed it, even when the chain fails.
The fake upstreams report usage (OpenAI 11 + 7 tokens, Anthropic 13 + 9) on every answer."""

from __future__ import annotations

import shutil
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
import yaml
from gw_fakes import FakeUpstreams, Fault
from gw_harness import Harness, build_harness

from switchyard.budgets.admission import Admissions
from switchyard.budgets.leased_gate import LeasedBudgetGate
from switchyard.budgets.ledger import BudgetLedger
from switchyard.budgets.pricing import price_on
from switchyard.budgets.service import InProcessLedgerClient, LedgerService
from switchyard.db.engine import Database
from switchyard.gateway.http import create_app
from switchyard.gateway.seams import Usage

pytestmark = pytest.mark.asyncio(loop_scope="session")

OPENAI_USAGE, ANTHROPIC_USAGE = Usage(11, 7), Usage(13, 9)
LIMIT_USD = 0.0005


def _client(gw: Harness) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(lambda: gw.pipeline)), base_url="http://gw")


def _nanos(model: str, usage: Usage, gw: Harness) -> int:
    today = datetime.fromtimestamp(gw.parts.clock(), UTC).date()
    return price_on(gw.store.current.providers, model, today).cost_nanos(usage)


async def test_fallback_to_a_pricier_model_never_overspends_the_flow_budget(
    gw_dirs: tuple[Path, Path, dict[str, str]], upstreams: FakeUpstreams, tmp_path: Path, ledger_db: Database
) -> None:
    """Finding 1: gpt-4o-mini fails, claude-haiku (about 5x the price) answers, request after
    request, on a flow limited to $0.0005 a day. The real leased gate on a real ledger."""
    policies = tmp_path / "policies"
    shutil.copytree(gw_dirs[0], policies)
    qa = yaml.safe_load((policies / "teams" / "qa.yaml").read_text())
    qa["flows"]["plain"]["budget"] = {"day_usd": LIMIT_USD}
    (policies / "teams" / "qa.yaml").write_text(yaml.safe_dump(qa))
    gw = build_harness(policies, gw_dirs[1], gw_dirs[2])
    service = LedgerService(BudgetLedger(ledger_db))
    gate = LeasedBudgetGate(Admissions(lambda: gw.store.current), InProcessLedgerClient(service), "test")
    gw.parts.budget = gate
    upstreams.reset()
    upstreams.openai.sticky = Fault("status", status=500)  # every primary attempt fails
    body = {"model": "auto", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
    statuses: list[int] = []
    async with _client(gw) as client:
        for _ in range(60):
            resp = await client.post(
                "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {gw.keys['qa']}"}
            )
            statuses.append(resp.status_code)
            if resp.status_code == 402:
                refusal = resp.json()["error"]["message"]
                break
    await gate.aclose()
    upstreams.reset()
    assert 402 in statuses and 200 in statuses, statuses
    # The 402 names the line, its limit, what is spent and held, what the request needs, the reset.
    for part in ("flow:qa/plain:day:", f"limit ${LIMIT_USD:g}", "spent", "held", "needs $", "resets at"):
        assert part in refusal, f"{part!r} not in the 402: {refusal}"
    line = next(s for s in service.lines() if s.key.startswith("flow:qa/plain:day:"))
    assert line.spent_nanos <= round(LIMIT_USD * 1e9), (
        f"spent {line.spent_nanos / 1e9:.7f} USD on a {LIMIT_USD} USD flow budget "
        f"({line.spent_nanos / (LIMIT_USD * 1e9):.2f}x) after {statuses.count(200)} fallbacks"
    )
    answered = statuses.count(200)
    assert line.spent_nanos == answered * _nanos("claude-haiku", ANTHROPIC_USAGE, gw)
    await gw.aclose()


async def test_an_invalid_answer_and_its_repair_are_both_charged(gw: Harness, upstreams: FakeUpstreams) -> None:
    """Finding 2: the provider billed the answer that broke the output contract too."""
    upstreams.openai.reply = '{"answer": "fine"}'
    upstreams.openai.faults.append(Fault("reply", text="not json at all"))
    async with _client(gw) as client:
        resp = await client.post(
            "/v1/chat/completions",
            json={"model": "auto", "messages": [{"role": "user", "content": "answer in JSON"}]},
            headers={"authorization": f"Bearer {gw.keys['qa']}", "x-switchyard-flow": "strict-json"},
        )
    assert resp.status_code == 200, resp.text
    assert len(upstreams.openai.received) == 2  # the broken answer and the repair
    charged = round(gw.budget.settled[-1][1] * 1e9)
    one = _nanos("gpt-4o-mini", OPENAI_USAGE, gw)
    assert charged == 2 * one, f"charged {charged} n$ for two billed answers of {one} n$ each"


async def test_a_chain_that_fails_after_billed_attempts_is_charged_for_them(
    gw: Harness, upstreams: FakeUpstreams
) -> None:
    """Finding 2: every candidate answered, none matched the contract: 422, and each billed
    answer is charged at its own model's price."""
    upstreams.openai.sticky = Fault("reply", text="still not json")
    upstreams.anthropic.sticky = Fault("reply", text="nor this")
    before = len(gw.budget.settled)
    async with _client(gw) as client:
        resp = await client.post(
            "/v1/chat/completions",
            json={"model": "auto", "messages": [{"role": "user", "content": "answer in JSON"}]},
            headers={"authorization": f"Bearer {gw.keys['qa']}", "x-switchyard-flow": "strict-json"},
        )
    assert resp.status_code == 422, resp.text
    expected = len(upstreams.openai.received) * _nanos("gpt-4o-mini", OPENAI_USAGE, gw) + len(
        upstreams.anthropic.received
    ) * _nanos("claude-haiku", ANTHROPIC_USAGE, gw)
    assert expected > 0
    settled = list(gw.budget.settled)[before:]
    charged = round(sum(s[1] for s in settled) * 1e9)
    assert charged == expected, f"charged {charged} n$ for billed answers worth {expected} n$"
    assert gw.budget.held == {}
