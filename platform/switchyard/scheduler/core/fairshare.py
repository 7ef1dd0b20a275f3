"""Weighted fair share with time-decayed usage.

A team's share is its current GPUs plus its exponentially decayed past usage (expressed in
GPUs, so a steady allocation of `a` GPUs decays to `a`), divided by its weight. Decay means a
team that burst yesterday is not punished forever; counting current GPUs means a team that
floods the queue ranks behind the others as soon as it runs more than its weight.
GPUs are the only resource the scheduler allocates, so the dominant share is the GPU share.
"""

from __future__ import annotations

import math


class DecayedUsage:
    def __init__(self, teams: dict[str, float], half_life_s: float, now: float = 0.0) -> None:
        if half_life_s <= 0:
            raise ValueError(f"usage half-life must be positive, got {half_life_s}")
        self._rate = math.log(2) / half_life_s
        self._weight = {t: max(w, 1e-9) for t, w in teams.items()}
        self._avg = dict.fromkeys(teams, 0.0)  # decayed average GPUs in use
        self._alloc = dict.fromkeys(teams, 0)
        self._at = dict.fromkeys(teams, now)

    def _advance(self, team: str, now: float) -> None:
        dt = now - self._at[team]
        if dt > 0:
            keep = math.exp(-self._rate * dt)
            # Exact integral of a constant allocation over dt under exponential decay.
            self._avg[team] = self._avg[team] * keep + self._alloc[team] * (1.0 - keep)
            self._at[team] = now

    def change(self, team: str, gpus: int, now: float) -> None:
        self._advance(team, now)
        self._alloc[team] += gpus

    def share(self, team: str, now: float) -> float:
        self._advance(team, now)
        return (self._alloc[team] + self._avg[team]) / (2.0 * self._weight[team])

    def decayed_gpus(self, team: str, now: float) -> float:
        self._advance(team, now)
        return self._avg[team]
