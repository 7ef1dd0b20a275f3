"""One platform, and so one scheduler, per cluster: whether `up --address` may attach, and
whether `down` of an attached platform may take the cluster's apps and scheduler off.

The scheduler is the one authority over the cluster's GPUs and is one named actor, so a second
platform attached to the same cluster would share the first one's scheduler (started with the
first one's policies and state), replace its Serve apps, and stop both with its `down`.
Pure: what runs on the cluster is read by `deploy.cluster_occupant`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ClusterOccupant:
    """What of a switchyard platform already runs on a cluster."""

    scheduler: bool  # the platform's named scheduler actor is alive
    state_dir: str | None  # the state dir that scheduler was started with; None: it did not say
    serve_apps: frozenset[str]  # every Serve application's name


def another_platform(ours: Path, occupant: ClusterOccupant) -> str | None:
    """The state dir of the platform running on the cluster when it is known not to be `ours`,
    else None (no scheduler, ours, or one that did not say: `down` of an earlier version's
    platform, the documented way to upgrade, must still stop it)."""
    if occupant.scheduler and occupant.state_dir is not None and Path(occupant.state_dir) != ours:
        return occupant.state_dir
    return None


def attach_refusal(ours: Path, occupant: ClusterOccupant, platform_apps: Iterable[str]) -> str | None:
    """Why a platform with state dir `ours` may not attach to the cluster `occupant` describes;
    None when it may: nothing of a platform runs there, or the platform there is this one
    (`up` again after a failed `up`, or after its record was lost)."""
    if occupant.scheduler:
        if occupant.state_dir is not None and Path(occupant.state_dir) == ours:
            return None  # this platform's own
        why = (
            "A cluster has one scheduler, the one authority over its GPUs, so a second platform would share its "
            "scheduler and replace its apps."
        )
        if occupant.state_dir is None:
            return (
                f"this cluster already runs a switchyard platform, whose scheduler did not say its state dir. {why} "
                "Use that platform, or stop it first with `switchyard down --state-dir` and its state dir"
            )
        use = f" --state-dir {occupant.state_dir}"
        return (
            f"this cluster already runs a switchyard platform (state dir {occupant.state_dir}). {why} "
            f"Use that platform (`switchyard status{use}`), or stop it first (`switchyard down{use}`)"
        )
    taken = sorted(occupant.serve_apps.intersection(platform_apps))
    if taken:
        names = ", ".join(repr(name) for name in taken)
        return (
            f"this cluster's Serve already runs applications named {names}, and no switchyard scheduler runs, "
            "so they are not a running platform's: `up` would replace them. Delete them (`serve.delete(name)`), "
            "or attach to another cluster"
        )
    return None
