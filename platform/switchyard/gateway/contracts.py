"""Output contracts: a flow's output JSON schema, checked on every answer before it is sent."""

from __future__ import annotations

import json
from typing import Any

from jsonschema import Draft202012Validator

from switchyard.policy.models import EffectiveFlow


class OutputContracts:
    """Compiled validators per flow; `problem` says what is wrong without quoting the answer."""

    def __init__(self) -> None:
        self._validators: dict[tuple[str, str, str], Draft202012Validator] = {}

    def problem(self, flow: EffectiveFlow, text: str) -> str | None:
        schema = flow.output_schema
        if schema is None:
            return None
        key = (flow.team, flow.flow, json.dumps(schema, sort_keys=True))
        validator = self._validators.get(key)
        if validator is None:
            validator = Draft202012Validator(schema)
            self._validators[key] = validator
        try:
            value: Any = json.loads(text)
        except ValueError:
            return "the answer is not JSON"
        error = next(iter(validator.iter_errors(value)), None)
        if error is None:
            return None
        where = "/".join(str(p) for p in error.absolute_path) or "(root)"
        return f"at {where}: fails `{error.validator}`"
