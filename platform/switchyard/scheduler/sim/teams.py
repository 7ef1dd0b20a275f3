"""Team quotas for a simulation: Philly virtual-cluster sizes scaled to the simulated capacity,
plus the inference team whose guarantee covers its peak demand."""

from __future__ import annotations

import csv
from pathlib import Path

from switchyard.scheduler.core.model import WorkloadClass
from switchyard.scheduler.core.policy import Quota, Team
from switchyard.scheduler.sim.trace_rows import CSV_ENCODING

INFERENCE_TEAM = "inference"
RESEARCH_CLASSES = frozenset({WorkloadClass.TRAINING, WorkloadClass.BATCH_FINE_TUNE, WorkloadClass.EXPLORATORY})


class TeamsFileError(ValueError):
    pass


def read_vc_nodes(path: str | Path) -> dict[str, int]:
    path = Path(path)
    try:
        with path.open(newline="", encoding=CSV_ENCODING) as handle:
            rows = list(csv.DictReader(handle))
    except OSError as err:
        raise TeamsFileError(f"{path}: cannot read: {err}") from None
    sizes: dict[str, int] = {}
    for line, row in enumerate(rows, start=2):
        try:
            sizes[row["vc"]] = int(row["node num"])
        except (KeyError, ValueError) as err:
            raise TeamsFileError(f"{path}:{line}: need columns 'vc' and 'node num': {err}") from None
        if sizes[row["vc"]] <= 0:
            raise TeamsFileError(f"{path}:{line}: node num must be positive")
    return sizes


def split_by_share(total: int, weights: dict[str, int]) -> dict[str, int]:
    """Largest-remainder split of `total` GPUs in proportion to `weights` (sums exactly)."""
    whole = sum(weights.values())
    exact = {k: total * w / whole for k, w in weights.items()}
    out = {k: int(v) for k, v in exact.items()}
    left = total - sum(out.values())
    for k in sorted(exact, key=lambda k: (-(exact[k] - out[k]), k))[:left]:
        out[k] += 1
    return out


def philly_teams(
    vc_nodes: dict[str, int], trace_teams: set[str], research_gpus: int, inference_gpus: int
) -> tuple[Team, ...]:
    """Teams whose research guarantees split `research_gpus` by Philly size; a trace team with
    no size entry gets the smallest size (the trace README's rule for `23dbec`)."""
    smallest = min(vc_nodes.values())
    sizes = {t: vc_nodes.get(t, smallest) for t in sorted(trace_teams | set(vc_nodes))}
    guarantees = split_by_share(research_gpus, sizes)
    teams = [
        Team(name, (Quota(RESEARCH_CLASSES, gpus),), weight=float(max(1, gpus))) for name, gpus in guarantees.items()
    ]
    teams.append(
        Team(
            INFERENCE_TEAM,
            (Quota(frozenset({WorkloadClass.INFERENCE}), inference_gpus, borrowing_limit_gpus=0),),
            weight=float(max(1, inference_gpus)),
        )
    )
    return tuple(teams)
