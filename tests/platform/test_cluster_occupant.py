"""`attach_refusal`: one platform, and so one scheduler, per cluster (pure; no Ray)."""

from __future__ import annotations

from pathlib import Path

from switchyard.cluster.occupant import ClusterOccupant, another_platform, attach_refusal
from switchyard.cluster.serve_configs import PLATFORM_APPS

OURS = Path("/shared/switchyard/team-a")


def occupant(scheduler: bool = False, state_dir: str | None = None, apps: tuple[str, ...] = ()) -> ClusterOccupant:
    return ClusterOccupant(scheduler=scheduler, state_dir=state_dir, serve_apps=frozenset(apps))


def test_an_empty_cluster_or_one_running_only_teams_apps_may_be_attached_to() -> None:
    assert attach_refusal(OURS, occupant(), PLATFORM_APPS) is None
    assert attach_refusal(OURS, occupant(apps=("search:ranker", "default")), PLATFORM_APPS) is None


def test_the_same_platform_may_attach_again() -> None:
    """`up` again after a failed `up`, or after its record was lost: its own scheduler and apps."""
    mine = occupant(scheduler=True, state_dir=str(OURS), apps=("gateway", "console"))
    assert attach_refusal(OURS, mine, PLATFORM_APPS) is None


def test_another_platform_is_named_with_the_commands_that_use_or_stop_it() -> None:
    theirs = occupant(scheduler=True, state_dir="/shared/switchyard/team-b", apps=("gateway", "console"))
    refusal = attach_refusal(OURS, theirs, PLATFORM_APPS)
    assert refusal is not None
    assert "already runs a switchyard platform (state dir /shared/switchyard/team-b)" in refusal
    assert "`switchyard status --state-dir /shared/switchyard/team-b`" in refusal
    assert "`switchyard down --state-dir /shared/switchyard/team-b`" in refusal


def test_a_scheduler_that_does_not_say_whose_it_is_is_refused_too() -> None:
    """An earlier version's scheduler, or one that did not answer: it may be another platform's."""
    refusal = attach_refusal(OURS, occupant(scheduler=True, state_dir=None), PLATFORM_APPS)
    assert refusal is not None and "whose scheduler did not say its state dir" in refusal
    assert "stop it first with `switchyard down --state-dir` and its state dir" in refusal
    assert "None" not in refusal


def test_apps_named_like_the_platforms_without_a_scheduler_are_named() -> None:
    refusal = attach_refusal(OURS, occupant(apps=("console", "gateway", "search:ranker")), PLATFORM_APPS)
    assert refusal is not None
    assert "already runs applications named 'console', 'gateway', and no switchyard scheduler runs" in refusal
    assert "search:ranker" not in refusal


def test_down_leaves_only_a_platform_known_to_be_another_alone() -> None:
    """A stale record's `down` must not stop another platform; a scheduler that does not say
    whose it is (an earlier version's, being stopped to upgrade) is still stopped."""
    assert another_platform(OURS, occupant(scheduler=True, state_dir="/shared/switchyard/team-b")) == (
        "/shared/switchyard/team-b"
    )
    assert another_platform(OURS, occupant(scheduler=True, state_dir=str(OURS))) is None
    assert another_platform(OURS, occupant(scheduler=True, state_dir=None)) is None
    assert another_platform(OURS, occupant(apps=("gateway",))) is None
