"""What both gate designs share: estimating a request, finding its budgets and limits,
turning ledger refusals into the seam's errors, and building the charge for a settle."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from switchyard.budgets.ledger import Charge, HoldRefused
from switchyard.budgets.money import nanos_to_usd, usd_to_nanos
from switchyard.budgets.periods import utc
from switchyard.budgets.pricing import model_entry, price_on
from switchyard.budgets.ratelimit import PermitDemand, PermitsRefused
from switchyard.budgets.resolve import BudgetLine, applicable_budgets, applicable_rate_limits
from switchyard.budgets.tokens import count_input_tokens
from switchyard.gateway.seams import CostEstimate, OverBudget, RateLimited, RequestContext, Usage
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

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(line.key for line in self.lines)

    def charge(self, actual_usd: float, usage: Usage) -> Charge:
        """The request's charge; its id is the reservation id, so it is counted at most once."""
        return Charge(
            charge_id=self.reservation_id,
            team=self.ctx.team,
            flow=self.ctx.flow.flow,
            model=self.model,
            user=self.ctx.user,
            day=utc(self.ctx.received_at).strftime("%Y-%m-%d"),
            nanos=usd_to_nanos(actual_usd),
            prompt_tokens=usage.prompt_tokens,
            completion_tokens=usage.completion_tokens,
            cached_tokens=usage.cached_prompt_tokens,
        )


class Admissions:
    """Builds admissions from the live policy set (`policy()` is e.g. `PolicyStore.current`)."""

    def __init__(
        self,
        policy: Callable[[], PolicySet],
        per_user: BudgetLimits | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._policy = policy
        self._per_user = per_user
        self.clock = clock

    def estimate(
        self, ctx: RequestContext, model: str, messages: list[dict[str, str]], max_tokens: int
    ) -> CostEstimate:
        """Input tokens by the model family's tokenizer estimate, plus `max_tokens` of output;
        a request without `max_tokens` (0 or less) gets the flow's cap, and none gets more."""
        catalog = self._policy().providers
        entry = model_entry(catalog, model)
        output = ctx.flow.max_tokens if max_tokens <= 0 else min(max_tokens, ctx.flow.max_tokens)
        tokens = count_input_tokens(entry.family, messages)
        nanos = price_on(catalog, model, utc(ctx.received_at).date()).estimate_nanos(tokens, output)
        return CostEstimate(model, tokens, output, nanos_to_usd(nanos))

    def admission(self, ctx: RequestContext, estimate: CostEstimate) -> Admission:
        ps = self._policy()
        price = price_on(ps.providers, estimate.model, utc(ctx.received_at).date())
        amount = price.estimate_nanos(estimate.input_tokens, estimate.max_output_tokens)
        # The period is the request's arrival, so its charge lands in the day it reserved on.
        lines = applicable_budgets(
            ps, ctx.team, ctx.flow.flow, ctx.flow.budget, ctx.user, ctx.received_at, self._per_user
        )
        requests, tokens = applicable_rate_limits(ps, ctx.team, ctx.flow.flow, ctx.flow.rate_limit)
        n_tokens = estimate.input_tokens + estimate.max_output_tokens
        permits = tuple(PermitDemand(r.key, r.per_minute, 1, 1) for r in requests) + tuple(
            PermitDemand(t.key, t.per_minute, n_tokens, n_tokens) for t in tokens
        )
        # The reservation (and so the charge) is named by the request id: the ledger's charges
        # reconcile with the audit log one to one.
        return Admission(ctx.request_id, lines, amount, permits, ctx, estimate.model)


def over_budget(refused: HoldRefused) -> OverBudget:
    return OverBudget(
        refused.key,
        nanos_to_usd(refused.committed_nanos),
        nanos_to_usd(refused.limit_nanos),
        refused.resets_at,
    )


def rate_limited(refused: PermitsRefused) -> RateLimited:
    return RateLimited(refused.key, refused.retry_after_s)
