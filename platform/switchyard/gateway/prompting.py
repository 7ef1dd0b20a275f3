"""Turning a flow and a request into the messages sent upstream.

The flow's pinned prompt version (or another version the flow allows) renders the system
message and any fixed messages from the request's variables, which must satisfy the flow's
input schema; the client's messages follow, unless the flow forbids free messages.
"""

from __future__ import annotations

from typing import Any

from jinja2 import StrictUndefined, Template, TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jsonschema import Draft202012Validator

from switchyard.gateway.errors import BadRequest, NotAllowed
from switchyard.policy.models import EffectiveFlow
from switchyard.policy.policy_set import PolicySet
from switchyard.policy.prompts import PromptVersion, RenderedPrompt, prompt_ref


class VariableSchemas:
    """Compiled input-schema validators, one per flow (policies are immutable once loaded)."""

    def __init__(self) -> None:
        self._validators: dict[tuple[str, str], Draft202012Validator] = {}

    def validate(self, flow: EffectiveFlow, variables: dict[str, Any]) -> None:
        key = (flow.team, flow.flow)
        validator = self._validators.get(key)
        if validator is None:
            validator = Draft202012Validator(flow.input_schema)
            self._validators[key] = validator
        error = next(iter(validator.iter_errors(variables)), None)
        if error is not None:
            where = ".".join(str(p) for p in error.absolute_path)
            field = f"variables.{where}" if where else "variables"
            # The rule, not the value: jsonschema's own message quotes the value sent.
            raise BadRequest(
                "invalid_variables",
                f"{field} does not satisfy the flow's input schema ({error.validator}: {_rule(error.validator_value)})",
                param=field,
            )


def _rule(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def choose_version(ps: PolicySet, flow: EffectiveFlow, requested: int | None) -> PromptVersion:
    template = ps.prompts[flow.prompt_id]  # `policy check` guarantees the reference resolves
    number = flow.prompt_version if requested is None else requested
    if number != flow.prompt_version and number not in flow.allowed_prompt_versions:
        allowed = sorted({flow.prompt_version, *flow.allowed_prompt_versions})
        raise NotAllowed(
            "prompt_version_not_allowed",
            f"flow {flow.team}/{flow.flow} does not allow prompt version {number} of "
            f"{flow.prompt_id!r} (allowed: {allowed})",
            param="prompt_version",
        )
    version = template.get(number)
    assert version is not None, "policy check verified every allowed version exists"
    return version


class CompiledPrompts:
    """Compiled templates, ref and content hash per prompt version object.

    Same sandbox as `switchyard.policy.prompts.PromptRenderer` (immutable sandbox, strict
    undefined), but keyed by the version object, not its content hash: hashing the content
    on every request cost ~50 us, most of the gateway's per-request budget. A policy reload
    creates new version objects, so the cache follows it (old entries are dropped)."""

    def __init__(self) -> None:
        self._env = ImmutableSandboxedEnvironment(undefined=StrictUndefined, autoescape=False)
        self._compiled: dict[int, tuple[PromptVersion, str, str, Template, list[tuple[str, Template]]]] = {}

    def get(self, prompt_id: str, version: PromptVersion) -> tuple[str, str, Template, list[tuple[str, Template]]]:
        """(ref, sha256, system template, fixed message templates)."""
        entry = self._compiled.get(id(version))
        if entry is None or entry[0] is not version:
            if len(self._compiled) > 4096:
                self._compiled.clear()
            entry = (
                version,
                prompt_ref(prompt_id, version),
                version.content_hash(),
                self._env.from_string(version.system),
                [(m.role, self._env.from_string(m.content)) for m in version.messages],
            )
            self._compiled[id(version)] = entry
        return entry[1], entry[2], entry[3], entry[4]

    def sha256(self, prompt_id: str, version: PromptVersion) -> str:
        return self.get(prompt_id, version)[1]


def render_messages(
    prompts: CompiledPrompts,
    flow: EffectiveFlow,
    version: PromptVersion,
    variables: dict[str, Any],
    client_messages: list[dict[str, Any]],
) -> RenderedPrompt:
    if client_messages and not flow.allow_free_messages:
        raise BadRequest(
            "free_messages_forbidden",
            f"flow {flow.team}/{flow.flow} takes only prompt variables; send `messages: []`",
            param="messages",
        )
    ref, _, system, fixed = prompts.get(flow.prompt_id, version)
    try:
        # The mapping, not **variables: a variable named `self` must not collide with render's.
        messages = [{"role": "system", "content": system.render(variables)}]
        messages += [{"role": role, "content": t.render(variables)} for role, t in fixed]
    except TemplateError as exc:
        # The sandbox refused something, or a variable the template needs is missing.
        raise BadRequest(
            "prompt_render_failed",
            f"prompt {flow.prompt_id}@{version.version} cannot be rendered from the given variables "
            f"({type(exc).__name__})",
            param="variables",
        ) from None
    return RenderedPrompt(ref=ref, messages=(*messages, *client_messages))
