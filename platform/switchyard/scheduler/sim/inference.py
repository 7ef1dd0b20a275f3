"""Inference demand in GPUs, minute by minute.

rps(t)      = peak_rps * diurnal(t) * burst(t)
diurnal(t)  = 0.65 + 0.35 * sin(2*pi*(hour_of_day - 8) / 24)   (peak 14:00, trough 02:00)
burst(t)    = per-minute arrivals of the Azure LLM conversation trace divided by their mean;
              each simulated hour replays that hour from a seeded random starting minute
tokens/s    = rps * mean (context + generated) tokens per request in the Azure trace
replicas    = ceil(tokens/s / replica_tokens_per_s); one replica = one GPU
target(t)   = the largest replica count needed over the last `scale_down_delay_min` minutes
              (scale up at once, scale down only after demand stayed low)
"""

from __future__ import annotations

import csv
import json
import math
import random
from collections import deque
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from switchyard.scheduler.sim.trace_rows import CSV_ENCODING

DEFAULT_REPLICA_TOKENS_PER_S = 10_000.0
"""Stated per-replica capacity: prompt + generated tokens per second one GPU replica serves."""

PACKAGED_PROFILE = "azure_conv_2023_profile.json"
"""The Azure conversation trace's profile, as `load_azure_profile` derives it from
`../shared/traces/azure_llm_inference_conv_2023.csv` (CC-BY 4.0), shipped beside this module:
a replay of an operator's own trace needs no Azure file."""


@dataclass(frozen=True, slots=True)
class AzureProfile:
    burst: tuple[float, ...]
    tokens_per_request: float


def load_azure_profile(path: str | Path) -> AzureProfile:
    path = Path(path)
    per_minute: dict[str, int] = {}
    tokens = 0
    requests = 0
    try:
        with path.open(newline="", encoding=CSV_ENCODING) as handle:
            for line, row in enumerate(csv.DictReader(handle), start=2):
                try:
                    tokens += int(row["ContextTokens"]) + int(row["GeneratedTokens"])
                except (KeyError, ValueError) as err:
                    raise ValueError(f"{path}:{line}: bad token columns: {err}") from None
                per_minute[row["TIMESTAMP"][:16]] = per_minute.get(row["TIMESTAMP"][:16], 0) + 1
                requests += 1
    except OSError as err:
        raise ValueError(f"{path}: cannot read: {err}") from None
    if not requests:
        raise ValueError(f"{path}: no requests")
    counts = [per_minute[m] for m in sorted(per_minute)]
    median = sorted(counts)[len(counts) // 2]
    full = [c for c in counts if c >= median / 2]  # the trace's partial first/last minutes
    mean = sum(full) / len(full)
    return AzureProfile(tuple(c / mean for c in full), tokens / requests)


def packaged_profile() -> AzureProfile:
    """The default burst profile and token mix (`PACKAGED_PROFILE`); `--azure FILE` replaces it."""
    document = json.loads(resources.files(__package__).joinpath(PACKAGED_PROFILE).read_text())
    return AzureProfile(tuple(float(b) for b in document["burst"]), float(document["tokens_per_request"]))


def diurnal(t_s: float) -> float:
    hour = (t_s / 3600.0) % 24.0
    return 0.65 + 0.35 * math.sin(2 * math.pi * (hour - 8.0) / 24.0)


class InferenceDemand:
    """Replica targets per minute; deterministic for a seed."""

    def __init__(
        self,
        profile: AzureProfile,
        peak_rps: float,
        seed: int,
        replica_tokens_per_s: float = DEFAULT_REPLICA_TOKENS_PER_S,
        scale_down_delay_min: int = 10,
    ) -> None:
        self._profile = profile
        self._peak_rps = peak_rps
        self._seed = seed
        self._capacity = replica_tokens_per_s
        self._delay = scale_down_delay_min
        self._hour_start: dict[int, int] = {}

    def needed(self, minute: int) -> int:
        hour, offset = divmod(minute, 60)
        start = self._hour_start.get(hour)
        if start is None:
            start = random.Random(f"{self._seed}:{hour}").randrange(len(self._profile.burst))
            self._hour_start[hour] = start
        burst = self._profile.burst[(start + offset) % len(self._profile.burst)]
        rps = self._peak_rps * diurnal(minute * 60.0) * burst
        # The epsilon keeps float noise (30.000000000000004) from adding a whole replica.
        return math.ceil(rps * self._profile.tokens_per_request / self._capacity - 1e-9)

    def target(self, minute: int) -> int:
        """Replicas to run in `minute`: the most needed over the scale-down delay."""
        return max(self.needed(m) for m in range(minute - self._delay + 1, minute + 1))

    def peak(self, first_minute: int, last_minute: int) -> int:
        return max(self.targets(first_minute, last_minute), default=0)

    def targets(self, first_minute: int, last_minute: int) -> list[int]:
        """Replica target for each minute in [first_minute, last_minute)."""
        window: deque[int] = deque(maxlen=self._delay)
        out = []
        for minute in range(first_minute - self._delay, last_minute):
            window.append(self.needed(minute))
            if minute >= first_minute:
                out.append(max(window))
        return out
