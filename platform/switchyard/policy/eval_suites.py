"""An eval suite (`policies/evals/suites/<name>.yaml`): the cases a high-risk flow's fallback
candidate is scored on (`switchyard eval run`). Part of the policy set, so `policy check`
refuses a suite that does not parse, and a flow that names a suite that is not there."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

SUITES_FOLDER = "evals/suites"


class EvalCase(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str
    variables: dict[str, Any] = {}
    messages: list[dict[str, str]] = []
    expect_json: dict[str, Any] | None = None  # keys the parsed JSON answer must have, with these values
    expect_contains: str | None = None  # text the answer must contain


class EvalSuite(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    description: str = ""
    cases: tuple[EvalCase, ...] = Field(min_length=1)
