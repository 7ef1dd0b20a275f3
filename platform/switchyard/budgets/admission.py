"""What both gate designs share: estimating a request, finding its budgets and limits,
turning ledger refusals into the seam's errors, and building the charge for a settle."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from switchyard.budgets.ledger import Charge, HoldRefused
from switchyard.budgets.money import nanos_to_usd
from switchyard.budgets.periods import utc, utc_day
from switchyard.budgets.pricing import estimate_call, price_on
from switchyard.budgets.ratelimit import PermitDemand, PermitsRefused
from switchyard.budgets.resolve import BudgetLine, applicable_budgets, applicable_rate_limits
from switchyard.gateway.seams import Bill, CostEstimate, Headroom, OverBudget, RateLimited, RequestContext
from switchyard.policy.models import BudgetLimits
from switchyard.policy.policy_set import PolicySet


@dataclass(frozen=True)
class Admission:
    """One request's view of the ledger: the lines it must fit, the amount, the permits."""

    reservation_id: str
    lines: tuple[BudgetLine, ...]
    amount_nanos: int
    permits: tuple[PermitDemand, ...]
    ctx: RequestContext
    model: str
    user: str | None = None  # the end user as the ledger names it (a pseudonym, see Admissions)
    token_keys: frozenset[str] = frozenset()  # which permits count tokens (the rest count requests)

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(line.key for line in self.lines)

    def provisional_charge(self) -> Charge:
        """What the request is charged if its replica dies before it settles: the whole
        reservation (its upper bound), under the request id its first real charge would take."""
        return Charge(
            charge_id=self.reservation_id,
            team=self.ctx.team,
            flow=self.ctx.flow.flow,
            model=self.model,
            user=self.user,
            day=utc(self.ctx.received_at).strftime("%Y-%m-%d"),
            nanos=self.amount_nanos,
            prompt_tokens=0,  # unknown: the request never reported its usage
            completion_tokens=0,
        )

    def charges(self, bills: Sequence[Bill]) -> list[Charge]:
        """The request's charges, one per billed attempt. The first is named by the
        reservation (the request) id, the others `<id>.2`, `<id>.3`: each is counted at most
        once, and all of them are found by the request id."""
        day = utc(self.ctx.received_at).strftime("%Y-%m-%d")
        return [
            Charge(
                charge_id=self.reservation_id if i == 1 else f"{self.reservation_id}.{i}",
                team=self.ctx.team,
                flow=self.ctx.flow.flow,
                model=b.model,
                user=self.user,
                day=day,
                nanos=b.nanos,
                prompt_tokens=b.usage.prompt_tokens,
                completion_tokens=b.usage.completion_tokens,
                cached_tokens=b.usage.cached_prompt_tokens,
            )
            for i, b in enumerate(bills, start=1)
        ]


class Admissions:
    """Builds admissions from the live policy set (`policy()` is e.g. `PolicyStore.current`)."""

    def __init__(
        self,
        policy: Callable[[], PolicySet],
        per_user: BudgetLimits | None = None,
        clock: Callable[[], float] = time.time,
        pseudonym: Callable[[str, str], str] | None = None,
    ) -> None:
        """`pseudonym(team, user)`: the name the ledger keeps for an end user (the audit
        keyring's, which erasure destroys); without one, the user id as sent."""
        self._policy = policy
        self._per_user = per_user
        self.clock = clock
        self._pseudonym = pseudonym

    def estimate(
        self, ctx: RequestContext, model: str, messages: list[dict[str, Any]], max_tokens: int
    ) -> CostEstimate:
        """Input tokens by the model family's tokenizer estimate, plus `max_tokens` of output;
        a request without `max_tokens` (0 or less) gets the flow's cap, and none gets more."""
        output = ctx.flow.max_tokens if max_tokens <= 0 else min(max_tokens, ctx.flow.max_tokens)
        est = estimate_call(self._policy().providers, model, messages, output, utc_day(ctx.received_at))
        return CostEstimate(model, est.input_tokens, output, nanos_to_usd(est.nanos))

    def admission(self, ctx: RequestContext, estimate: CostEstimate) -> Admission:
        ps = self._policy()
        # The gateway's estimate covers its whole chain (`gateway.billing.chain_bound`); one
        # without nanos is a single call to `estimate.model`.
        amount = estimate.nanos
        if amount is None:
            price = price_on(ps.providers, estimate.model, utc_day(ctx.received_at))
            amount = price.estimate_nanos(estimate.input_tokens, estimate.max_output_tokens)
        user = ctx.user if ctx.user is None or self._pseudonym is None else self._pseudonym(ctx.team, ctx.user)
        # The period is the request's arrival, so its charge lands in the day it reserved on.
        lines = applicable_budgets(ps, ctx.team, ctx.flow.flow, ctx.flow.budget, user, ctx.received_at, self._per_user)
        requests, tokens = applicable_rate_limits(ps, ctx.team, ctx.flow.flow, ctx.flow.rate_limit)
        n_tokens = estimate.input_tokens + estimate.max_output_tokens
        permits = tuple(PermitDemand(r.key, r.per_minute, 1, 1) for r in requests) + tuple(
            PermitDemand(t.key, t.per_minute, n_tokens, n_tokens) for t in tokens
        )
        # The reservation (and so the charge) is named by the request id: the ledger's charges
        # reconcile with the audit log one to one.
        token_keys = frozenset(t.key for t in tokens)
        return Admission(ctx.request_id, lines, amount, permits, ctx, estimate.model, user, token_keys)


def permit_headroom(budget_usd: float | None, a: Admission, left: dict[str, int]) -> Headroom:
    """`Headroom` from the budget left and the permits left per key (the tightest of each kind)."""
    requests = [n for k, n in left.items() if k not in a.token_keys]
    tokens = [n for k, n in left.items() if k in a.token_keys]
    return Headroom(budget_usd, min(requests, default=None), min(tokens, default=None))


def over_budget(refused: HoldRefused) -> OverBudget:
    return OverBudget(
        refused.key,
        nanos_to_usd(refused.committed_nanos),
        nanos_to_usd(refused.limit_nanos),
        refused.resets_at,
        spent_usd=nanos_to_usd(refused.spent_nanos),
        needed_usd=nanos_to_usd(refused.needed_nanos),
    )


def rate_limited(refused: PermitsRefused) -> RateLimited:
    return RateLimited(refused.key, refused.retry_after_s)
