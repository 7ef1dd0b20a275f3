"""Versioned prompt templates: immutable versions identified by number and content hash.

A prompt file `policies/prompts/<id>.yaml` lists versions; each records the sha256 of its
content when published. Editing a published version changes the content but not the recorded
hash, which `policy check` reports. Rendering is sandboxed Jinja2 with strict undefined
variables: templates can substitute and loop, never call arbitrary code.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal

from jinja2 import StrictUndefined
from jinja2.sandbox import ImmutableSandboxedEnvironment
from pydantic import BaseModel, ConfigDict, Field, model_validator


class FixedMessage(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    role: Literal["system", "user", "assistant"]
    content: str


class PromptVersion(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    version: int = Field(gt=0)
    sha256: str | None = None  # recorded at publication; None means "not yet published"
    system: str
    messages: tuple[FixedMessage, ...] = ()

    def content_hash(self) -> str:
        canonical = json.dumps(
            {"system": self.system, "messages": [m.model_dump() for m in self.messages]},
            sort_keys=True,
            separators=(",", ":"),
        )
        return hashlib.sha256(canonical.encode()).hexdigest()


class PromptTemplate(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    versions: tuple[PromptVersion, ...]

    @model_validator(mode="after")
    def _unique_versions(self) -> PromptTemplate:
        numbers = [v.version for v in self.versions]
        if len(set(numbers)) != len(numbers):
            raise ValueError(f"prompt {self.id!r} lists a version number twice: {numbers}")
        return self

    def get(self, version: int) -> PromptVersion | None:
        return next((v for v in self.versions if v.version == version), None)


class RenderedPrompt(BaseModel):
    model_config = ConfigDict(frozen=True)

    ref: str  # "id@version#hash12", recorded with every request
    messages: tuple[dict[str, Any], ...]  # OpenAI chat format (see gateway.messages)


class PromptRenderer:
    """Renders prompt versions; compiled templates are cached per content hash."""

    def __init__(self) -> None:
        self._env = ImmutableSandboxedEnvironment(undefined=StrictUndefined, autoescape=False)
        self._cache: dict[str, Any] = {}

    def render(self, prompt_id: str, version: PromptVersion, variables: dict[str, Any]) -> RenderedPrompt:
        digest = version.content_hash()
        compiled = self._cache.get(digest)
        if compiled is None:
            compiled = (
                self._env.from_string(version.system),
                [(m.role, self._env.from_string(m.content)) for m in version.messages],
            )
            self._cache[digest] = compiled
        system_t, fixed = compiled
        messages = [{"role": "system", "content": system_t.render(**variables)}]
        messages += [{"role": role, "content": t.render(**variables)} for role, t in fixed]
        return RenderedPrompt(ref=prompt_ref(prompt_id, version), messages=tuple(messages))


def prompt_ref(prompt_id: str, version: PromptVersion) -> str:
    return f"{prompt_id}@{version.version}#{version.content_hash()[:12]}"
