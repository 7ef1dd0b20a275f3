"""Where one request's server time goes, stage by stage, for benchmark runs.

With `SWITCHYARD_SERVER_TIMING=stages` in the gateway's environment, every answer's
`server-timing` header carries, beside `gateway` (time in the gateway) and `upstream` (time in
provider calls), one entry per stage the request went through: `plan` (authentication, flow,
prompt, route), `redaction`, `budget.reserve`, `budget.settle` and `audit.record`, each in
milliseconds of wall time (`plan;dur=0.210, redaction;dur=0.031, ...`). What the stages do not
cover (FastAPI and Serve around the pipeline, the output contract, building the answer) is
`gateway` minus their sum. Off by default: a production answer carries `gateway` and
`upstream` only, and the stages cost nothing.

The stages are the tracing's (`GatewayTracing.stage`), so a trace and a timing name the same
spans.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

STAGE_TIMING_ENV = "SWITCHYARD_SERVER_TIMING"


def stage_timing_from_env(environ: Mapping[str, str]) -> bool:
    """Whether `environ` asks for the per-stage breakdown; any other value than `stages` or
    unset is off (named in the error, so a typo does not silently measure nothing)."""
    value = environ.get(STAGE_TIMING_ENV, "").strip()
    if value in ("", "off"):
        return False
    if value == "stages":
        return True
    raise ValueError(f"{STAGE_TIMING_ENV}={value!r}: expected 'stages' or 'off'")


class StageTimings:
    """Milliseconds per stage of one request (a stage entered twice adds up)."""

    __slots__ = ("_ms",)

    def __init__(self) -> None:
        self._ms: dict[str, float] = {}

    def add(self, stage: str, seconds: float) -> None:
        self._ms[stage] = self._ms.get(stage, 0.0) + seconds * 1000

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - started)

    @property
    def ms(self) -> Mapping[str, float]:
        return self._ms

    def header_entries(self) -> str:
        """`name;dur=ms` entries for `server-timing`, in the order the stages ran."""
        return ", ".join(f"{name};dur={ms:.3f}" for name, ms in self._ms.items())
