"""What a request needs from a model, and whether a catalog entry can give it.

A candidate that lacks a feature the request uses is skipped, with the reason in
`x-switchyard-fallback`, the skip metric and the audit record: dropping the tools, or an
image, to let a cheaper model answer would be a silent downgrade. Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from switchyard.gateway.messages import Message, image_parts, is_data_url, uses_tools
from switchyard.policy.models import ModelEntry


@dataclass(frozen=True)
class Needs:
    tools: bool = False  # tool definitions, or tool calls/results in the history
    parallel_tool_calls: bool = False  # the request asks for several calls per answer
    images: int = 0
    image_urls: bool = False  # some image is an https URL, not a data URL
    embedding: bool = False  # the request wants vectors, not an answer
    sampling: frozenset[str] = frozenset()  # the sampling fields the request sets
    temperature: float | None = None

    @property
    def any(self) -> bool:
        return self.tools or self.images > 0 or self.embedding

    def described(self) -> str:
        wanted = [
            name
            for name, on in (
                ("tools", self.tools),
                ("parallel_tool_calls", self.parallel_tool_calls),
                ("images", self.images > 0),
                ("image URLs", self.image_urls),
                *((name, True) for name in sorted(self.sampling)),
            )
            if on
        ]
        return ", ".join(wanted) or "text"


def needs_of(
    messages: list[Message],
    tools: tuple[object, ...],
    parallel_tool_calls: bool | None,
    *,
    fetch_images: bool = False,
    temperature: float | None = None,
    top_p: float | None = None,
    stop: bool = False,
) -> Needs:
    """`fetch_images`: the flow downloads https images itself, so a URL reaches the provider
    as bytes and any vision model will do."""
    images = list(image_parts(messages))
    sampling = {
        name
        for name, used in (("temperature", temperature is not None), ("top_p", top_p is not None), ("stop", stop))
        if used
    }
    return Needs(
        tools=bool(tools) or uses_tools(messages),
        parallel_tool_calls=bool(tools) and parallel_tool_calls is True,
        images=len(images),
        image_urls=not fetch_images and any(not is_data_url(p["image_url"]["url"]) for p in images),
        sampling=frozenset(sampling),
        temperature=temperature,
    )


def lacking(entry: ModelEntry, needs: Needs, input_tokens: int | None = None) -> str | None:
    """Why `entry` cannot serve a request with these needs, as a short reason, or None."""
    caps = entry.capabilities
    if needs.embedding != (entry.task == "embedding"):
        return "not_an_embedding_model" if needs.embedding else "embedding_model"
    if needs.tools and not caps.tools:
        return "lacks_tools"
    if needs.parallel_tool_calls and not caps.parallel_tool_calls:
        return "lacks_parallel_tool_calls"
    if needs.images and not caps.vision:
        return "lacks_vision"
    if needs.images > caps.max_images:
        return "too_many_images"
    if needs.image_urls and not caps.image_urls:
        return "lacks_image_urls"
    missing = needs.sampling - caps.sampling
    if missing:
        return f"lacks_{min(missing)}"
    if needs.temperature is not None and needs.temperature > caps.max_temperature:
        return "temperature_above_max"
    if input_tokens is not None and input_tokens >= entry.context_window:
        return "context_window"
    return None
