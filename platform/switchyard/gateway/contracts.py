"""Output contracts: the JSON an answer must be, checked on every answer before it is sent.

Where the contract comes from (docs/gateway.md, "Structured output"):
- a flow's `output_schema` is the flow's promise to its callers, so it always applies;
- a request's `response_format` adds a contract where the flow has none: `json_object` (any
  JSON object) or `json_schema` (that schema);
- on a flow with a schema, `json_object` is already implied and a `json_schema` equal to the
  flow's (as canonical JSON) is accepted; a different one is a 400 naming both, since the
  gateway cannot keep two contracts and silently keeping one would break the other.

Natively where the candidate's catalog entry declares `json_schema` (the provider enforces
it); everywhere the answer is validated here, repaired once, then the next candidate is tried.
An answer that calls tools has no text to check: the contract applies to the final answer.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Literal

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from switchyard.gateway import json_text
from switchyard.gateway.errors import BadRequest
from switchyard.gateway.providers.base import OutputFormat
from switchyard.policy.models import EffectiveFlow

ANY_OBJECT: dict[str, Any] = {"type": "object"}


@dataclass(frozen=True)
class OutputSpec:
    """The contract one request's answers must keep."""

    schema: dict[str, Any]
    name: str = "answer"
    strict: bool = False
    source: Literal["flow", "request"] = "flow"

    def as_format(self, native: bool) -> OutputFormat:
        return OutputFormat(schema=self.schema, name=self.name, strict=self.strict, native=native)


class CheckedSchemas:
    """Request schemas already checked against the JSON Schema metaschema (a check costs
    ~0.9 ms, a request's whole pipeline ~0.2 ms; clients send the same schema every time)."""

    def __init__(self, max_schemas: int = 512) -> None:
        self._seen: OrderedDict[str, str | None] = OrderedDict()
        self._max = max_schemas

    def problem(self, schema: dict[str, Any]) -> str | None:
        key = _canonical(schema)
        if key in self._seen:
            self._seen.move_to_end(key)
            return self._seen[key]
        try:
            Draft202012Validator.check_schema(schema)
            found = None
        except SchemaError as exc:
            found = str(exc.validator)
        self._seen[key] = found
        if len(self._seen) > self._max:
            self._seen.popitem(last=False)
        return found


def output_spec(
    flow: EffectiveFlow, response_format: Any | None, checked: CheckedSchemas | None = None
) -> OutputSpec | None:
    """The request's contract: the flow's schema, the request's `response_format`, or none.

    `response_format` is `wire.ResponseFormat` (typed loosely here to keep this module free of
    the wire layer): `.type` and `.json_schema` with `.name`, `.json_schema`, `.strict`."""
    kind = getattr(response_format, "type", "text")
    asked = getattr(response_format, "json_schema", None)
    if flow.output_schema is not None:
        if (
            kind == "json_schema"
            and asked is not None
            and _canonical(asked.json_schema) != _canonical(flow.output_schema)
        ):
            raise BadRequest(
                "response_format_conflict",
                "response_format.json_schema differs from the output_schema of flow "
                f"{flow.team}/{flow.flow}; send that schema, json_object, or no response_format",
                param="response_format.json_schema",
            )
        name = asked.name if asked is not None else "answer"
        strict = bool(asked.strict) if asked is not None else False
        return OutputSpec(flow.output_schema, name, strict, "flow")
    if kind == "json_object":
        return OutputSpec(ANY_OBJECT, source="request")
    if kind == "json_schema" and asked is not None:
        schema = asked.json_schema if asked.json_schema is not None else ANY_OBJECT
        problem = (checked or CheckedSchemas()).problem(schema)
        if problem is not None:
            raise BadRequest(
                "invalid_json_schema",
                f"response_format.json_schema.schema is not a valid JSON Schema ({problem})",
                param="response_format.json_schema.schema",
            )
        return OutputSpec(schema, asked.name, bool(asked.strict), "request")
    return None


def flow_spec(flow: EffectiveFlow) -> OutputSpec | None:
    return None if flow.output_schema is None else OutputSpec(flow.output_schema)


def _canonical(schema: Any) -> str:
    return json.dumps(schema, sort_keys=True, separators=(",", ":"))


class OutputContracts:
    """Compiled validators by schema; `problem` says what is wrong without quoting the answer.

    Bounded: request schemas are client input, so the cache keeps the most recent ones."""

    def __init__(self, max_schemas: int = 512) -> None:
        self._validators: OrderedDict[str, Draft202012Validator] = OrderedDict()
        self._max = max_schemas

    def problem(self, spec: OutputSpec | None, text: str) -> str | None:
        if spec is None:
            return None
        validator = self._validator(spec.schema)
        try:
            value: Any = json_text.loads(text)
        except json_text.TooDeep:
            return "the answer nests JSON too deeply to read"
        except ValueError:
            return "the answer is not JSON"
        try:
            error = next(iter(validator.iter_errors(value)), None)
        except RecursionError:  # a recursive schema walked as deep as the parser went
            return "the answer nests JSON too deeply to check"
        if error is None:
            return None
        where = "/".join(str(p) for p in error.absolute_path) or "(root)"
        return f"at {where}: fails `{error.validator}`"

    def _validator(self, schema: dict[str, Any]) -> Draft202012Validator:
        key = _canonical(schema)
        validator = self._validators.get(key)
        if validator is None:
            validator = Draft202012Validator(schema)
            self._validators[key] = validator
            if len(self._validators) > self._max:
                self._validators.popitem(last=False)
        else:
            self._validators.move_to_end(key)
        return validator
