"""Everything decided before any I/O: who calls, which flow, which model chain, which
prompt version, the rendered messages and the deadline. Pure and fast (the hot path's
first microseconds), and the same for streaming and non-streaming requests."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from switchyard.budgets.tokens import EXACT_FAMILIES, count_input_tokens
from switchyard.gateway.auth import KeySnapshot
from switchyard.gateway.capabilities import Needs, needs_of
from switchyard.gateway.contracts import CheckedSchemas, OutputSpec, output_spec
from switchyard.gateway.errors import BadRequest, NotAllowed
from switchyard.gateway.evals import EvalVerdict
from switchyard.gateway.messages import Message, image_parts, text_chars
from switchyard.gateway.prompting import CompiledPrompts, VariableSchemas, choose_version, render_messages
from switchyard.gateway.routing import Route, pick_primary, plan_route
from switchyard.gateway.seams import RequestContext
from switchyard.gateway.stage_timing import StageTimings
from switchyard.gateway.tracing import RequestSpan
from switchyard.gateway.wire import ChatRequest, parse_chat_request
from switchyard.policy.keys import Principal
from switchyard.policy.layering import resolve_flow
from switchyard.policy.models import EffectiveFlow, ModelEntry
from switchyard.policy.policy_set import PolicySet

FLOW_HEADER = "x-switchyard-flow"
DEADLINE_HEADER = "x-switchyard-deadline-ms"
IDEMPOTENCY_HEADER = "idempotency-key"


class EvalBookLike(Protocol):
    """What planning needs from the eval records (see `switchyard.gateway.evalbook`)."""

    def judge(
        self, ps: PolicySet, flow: EffectiveFlow, model: str, entry: ModelEntry, prompt_sha256: str
    ) -> EvalVerdict: ...


@dataclass(frozen=True)
class Plan:
    ctx: RequestContext
    request: ChatRequest
    policy_set: PolicySet
    messages: list[Message]  # rendered prompt + client messages, before redaction
    route: Route
    max_tokens: int
    needs: Needs = field(default_factory=Needs)
    output: OutputSpec | None = None  # the contract answers must keep (flow schema or response_format)
    tools: tuple[dict[str, Any], ...] = ()  # the request's function tools, as sent
    span: RequestSpan | None = None  # the request's trace span, once the pipeline started it
    timings: StageTimings | None = None  # per-stage time, for benchmark runs (`stage_timing`)


class FlowCache:
    """Resolved flows of the current policy set; dropped whole when the set changes."""

    def __init__(self) -> None:
        self._policy_set: PolicySet | None = None
        self._flows: dict[tuple[str, str], EffectiveFlow] = {}

    def for_request(self, ps: PolicySet, team: str, headers: Mapping[str, str]) -> EffectiveFlow:
        """The flow a request runs: the one its header names, else the team's default flow."""
        policy = ps.teams.get(team)
        flow_name = headers.get(FLOW_HEADER) or (policy.default_flow if policy is not None else None)
        if not flow_name:
            raise BadRequest(
                "flow_required",
                f"name the flow in the {FLOW_HEADER} header (team {team!r} has no default flow)",
                param=FLOW_HEADER,
            )
        return self.get(ps, team, flow_name)

    def get(self, ps: PolicySet, team: str, flow: str) -> EffectiveFlow:
        if ps is not self._policy_set:  # identity: a reload always makes a new PolicySet
            self._flows = {}
            self._policy_set = ps
        found = self._flows.get((team, flow))
        if found is None:
            found = _resolve(ps, team, flow)
            self._flows[(team, flow)] = found
        return found


def _resolve(ps: PolicySet, team: str, flow: str) -> EffectiveFlow:
    policy = ps.teams.get(team)
    if policy is None:
        raise NotAllowed("team_has_no_flows", f"team {team!r} has no policy file (teams/{team}.yaml)")
    if flow not in policy.flows:
        raise NotAllowed(
            "flow_not_allowed",
            f"team {team!r} has no flow of the name in {FLOW_HEADER} "
            f"(flows: {', '.join(sorted(policy.flows)) or 'none'})",
            param=FLOW_HEADER,
        )
    resolved = resolve_flow(ps, team, flow)
    assert not isinstance(resolved, list), "a loaded policy set has only resolvable flows"
    return resolved.policy


class Planner:
    def __init__(self, keys: KeySnapshot, evals: EvalBookLike) -> None:
        self.keys = keys
        self.evals = evals
        self.flows = FlowCache()
        self.prompts = CompiledPrompts()
        self.schemas = VariableSchemas()
        self.checked_schemas = CheckedSchemas()

    def plan(
        self,
        ps: PolicySet,
        raw: bytes,
        headers: Mapping[str, str],
        request_id: str,
        now: float,
        started: float,
        principal: Principal | None = None,
    ) -> Plan:
        """`now`: the wall clock at receipt; `started`: the gateway's monotonic timer then.
        `principal`: the caller, when the HTTP layer authenticated before reading the body."""
        principal = principal or self.keys.authenticate(headers)
        request = parse_chat_request(raw, ps.org.gateway.limits)
        flow = self.flows.for_request(ps, principal.team, headers)
        primary = pick_primary(ps, flow, request.model)
        version = choose_version(ps, flow, request.prompt_version)
        self.schemas.validate(flow, request.variables)
        rendered = render_messages(
            self.prompts, flow, version, request.variables, [m.as_message() for m in request.messages]
        )
        data_class = ps.data.classes[flow.data_class]
        check_text_size(rendered.messages, flow.data_class, data_class.max_text_chars)
        if not data_class.images_allowed() and next(image_parts(rendered.messages), None) is not None:
            raise BadRequest(
                "images_not_allowed",
                f"messages: data class {flow.data_class!r} does not allow images (its text is redacted "
                "before it leaves the platform, and the redactor cannot read an image)",
                param="messages",
            )
        output = output_spec(flow, request.response_format, self.checked_schemas)
        tools = request.tool_dicts()
        needs = needs_of(
            list(rendered.messages),
            tools,
            request.parallel_tool_calls,
            fetch_images=flow.image_fetch is not None,
            temperature=request.temperature,
            top_p=request.top_p,
            stop=bool(request.stop_sequences()),
        )
        prompt_sha = self.prompts.sha256(flow.prompt_id, version)

        def judge(f: EffectiveFlow, model: str, entry: ModelEntry) -> EvalVerdict:
            return self.evals.judge(ps, f, model, entry, prompt_sha)

        def exact_input(entry: ModelEntry) -> int | None:
            # Only an exact count may skip a model for its context window (see plan_route).
            if entry.family not in EXACT_FAMILIES or needs.images or tools:
                return None
            return count_input_tokens(entry.family, rendered.messages)

        route = plan_route(ps, flow, primary, judge, needs, exact_input)
        max_tokens = min(request.requested_max_tokens() or flow.max_tokens, flow.max_tokens)
        ctx = RequestContext(
            request_id=request_id,
            received_at=now,
            started=started,
            team=principal.team,
            key_id=principal.key_id,
            user=request.user,
            flow=flow,
            requested_model=request.model,
            prompt_ref=rendered.ref,
            idempotency_key=headers.get(IDEMPOTENCY_HEADER),
            deadline=started + deadline_ms(flow, headers) / 1000,
            stream=request.stream,
        )
        return Plan(ctx, request, ps, list(rendered.messages), route, max_tokens, needs, output, tools)


def check_text_size(messages: Sequence[Message], data_class: str, limit: int) -> None:
    """The data class's cap on message text (tool arguments and results included), which also
    bounds the redactor's work."""
    total = text_chars(messages)
    if total > limit:
        raise BadRequest(
            "text_too_long",
            f"messages: {total} characters of text (prompt included) exceed the {limit} allowed "
            f"for data class {data_class!r}",
            param="messages",
        )


def deadline_ms(flow: EffectiveFlow, headers: Mapping[str, str]) -> int:
    """The flow's deadline, shortened (never extended) by the client's header."""
    value = headers.get(DEADLINE_HEADER)
    if value is None:
        return flow.deadline_ms
    try:
        asked = int(value)
    except ValueError:
        raise BadRequest(
            "invalid_deadline", f"{DEADLINE_HEADER} must be an integer number of milliseconds", param=DEADLINE_HEADER
        ) from None
    if asked <= 0:
        raise BadRequest("invalid_deadline", f"{DEADLINE_HEADER} must be positive", param=DEADLINE_HEADER)
    return min(asked, flow.deadline_ms)


def body_digest(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()
