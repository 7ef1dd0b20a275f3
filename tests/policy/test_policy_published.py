"""Replicas serve the set the head published, never their own files; the head validates.

The transport here is a direct call into the head's real `PolicyStore` (on a cluster it is the
publisher actor, `tests/platform/test_platform_multinode.py`); everything else is the code a
replica runs.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import replace
from pathlib import Path

import pytest

from switchyard.policy.published import (
    PolicyUnavailable,
    PublishedPolicyStore,
    PublishedSet,
    ReplicaBoard,
    ReplicaReport,
    published,
    save_dir_for,
)
from switchyard.policy.store import PolicyStore


class Head:
    """The head's side of `fetch`: its own policy store, refreshed on each poll."""

    def __init__(self, policies: Path, state: Path) -> None:
        self.store = PolicyStore(policies, state)
        self.board = ReplicaBoard()
        self.reachable = True
        self.tamper = False

    def fetch(self, known: str | None, report: ReplicaReport) -> PublishedSet | None:
        if not self.reachable:
            raise PolicyUnavailable("cannot reach the policy publisher on the head: test cut")
        self.store.refresh()
        self.board.record(report)
        offer = published(self.store.current)
        if self.tamper:  # bytes changed on the way: they no longer hash to the fingerprint
            sources = dict(offer.sources)
            sources["teams/search.yaml"] += b"# edited in transit\n"
            offer = replace(offer, sources=sources)
        return None if known == offer.fingerprint else offer


def _bump_budget(policies: Path, old: str, new: str) -> None:
    team = policies / "teams/search.yaml"
    team.write_text(team.read_text().replace(old, new))


@pytest.fixture
def head(policies_copy: Path, tmp_path: Path) -> Head:
    return Head(policies_copy, tmp_path / "head-state")


def _replica(head: Head, state: Path, name: str = "r1") -> PublishedPolicyStore:
    return PublishedPolicyStore(head.fetch, save_dir_for(state), name, "node-" + name)


def test_a_change_on_the_head_reaches_a_replica_whose_own_files_are_stale(
    head: Head, policies_copy: Path, tmp_path: Path
) -> None:
    stale = tmp_path / "replica-checkout"
    shutil.copytree(policies_copy, stale)  # the replica's node has its own (old) checkout
    replica = _replica(head, tmp_path / "replica-state")
    assert replica.current.fingerprint == head.store.current.fingerprint
    _bump_budget(policies_copy, "month_usd: 6000", "month_usd: 5000")
    assert replica.refresh() is True
    budget = replica.current.teams["search"].budget
    assert budget is not None and budget.month_usd == 5000
    assert replica.current.fingerprint == head.store.current.fingerprint
    assert PolicyStore(stale, tmp_path / "other").current.fingerprint != replica.current.fingerprint
    assert replica.current.root.is_relative_to(tmp_path / "replica-state")  # eval records are read here
    assert replica.refresh() is False  # a poll reports the set served when it asks: one poll behind
    assert head.board.rows()[0]["fingerprint"] == replica.current.fingerprint


def test_an_invalid_change_on_the_head_never_reaches_a_replica(head: Head, policies_copy: Path, tmp_path: Path) -> None:
    replica = _replica(head, tmp_path / "replica-state")
    before = replica.current.fingerprint
    _bump_budget(policies_copy, "month_usd: 6000", "month_usd: 60000")  # over the org's cap
    assert replica.refresh() is False
    assert replica.current.fingerprint == before and not replica.degraded
    assert head.store.degraded  # the head refused it and says so


def test_a_set_that_does_not_hash_to_its_fingerprint_is_refused(
    head: Head, policies_copy: Path, tmp_path: Path
) -> None:
    replica = _replica(head, tmp_path / "replica-state")
    before = replica.current.fingerprint
    head.tamper = True
    _bump_budget(policies_copy, "month_usd: 6000", "month_usd: 5500")
    assert replica.refresh() is False
    assert replica.current.fingerprint == before
    assert replica.degraded and "not the published" in str(replica.last_error)
    assert replica.rejected == 1


def test_a_replicas_saved_copy_changed_on_disk_is_replaced_by_the_published_bytes(head: Head, tmp_path: Path) -> None:
    """Found by damaging the state dir (stop 44): a replica saves each published set under its
    fingerprint and loads it from there; a saved copy that existed was never rewritten. Once
    its bytes changed on disk it loaded as another fingerprint on every start, so no replica on
    that host could start on the published set again ("loads as ..., not the published ...").
    Now a copy that is not the offered bytes is replaced."""
    state = tmp_path / "replica-state"
    first = _replica(head, state)
    copy = first.current.root
    team = copy / "teams" / "search.yaml"
    team.write_text(team.read_text().replace("month_usd: 6000", "month_usd: 7000"))
    restarted = _replica(head, state, "r2")
    assert restarted.current.fingerprint == head.store.current.fingerprint and not restarted.degraded
    budget = restarted.current.teams["search"].budget
    assert budget is not None and budget.month_usd == 6000


def test_a_replica_that_cannot_get_a_set_does_not_start(head: Head, tmp_path: Path) -> None:
    head.reachable = False
    with pytest.raises(PolicyUnavailable, match="cannot reach the policy publisher"):
        _replica(head, tmp_path / "replica-state")


def test_a_replica_cut_off_later_keeps_its_set_degraded_then_recovers(
    head: Head, policies_copy: Path, tmp_path: Path
) -> None:
    replica = _replica(head, tmp_path / "replica-state")
    before = replica.current.fingerprint
    head.reachable = False
    assert replica.refresh() is False
    assert replica.degraded and replica.current.fingerprint == before
    assert replica.status()["state"] == "degraded"
    head.reachable = True
    _bump_budget(policies_copy, "month_usd: 6000", "month_usd: 5000")
    assert replica.refresh() is True and not replica.degraded


def test_a_published_path_outside_the_set_is_refused(head: Head, tmp_path: Path) -> None:
    offer = published(head.store.current)
    evil = PublishedSet(offer.fingerprint, {**offer.sources, "../../escaped.yaml": b"x: 1\n"})
    with pytest.raises(ValueError, match="not a path inside the policy directory"):
        PublishedPolicyStore(lambda known, report: evil, save_dir_for(tmp_path / "r"), "r", "n")
    assert not (tmp_path / "escaped.yaml").exists()


def test_the_board_shows_silent_replicas_then_forgets_them() -> None:
    board = ReplicaBoard(stale_after_s=30)
    board.record(ReplicaReport("r1", "n1", "abc", "ok"), now=1000.0)
    board.record(ReplicaReport("r2", "n2", "abc", "degraded", "cut off"), now=1025.0)
    rows = board.rows(now=1040.0)
    assert [(r["replica"], r["state"]) for r in rows] == [("r1", "silent"), ("r2", "degraded")]
    assert [r["replica"] for r in board.rows(now=1310.0)] == ["r2"]


def test_a_replica_is_timed_by_the_heads_clock_not_its_own(head: Head, tmp_path: Path) -> None:
    """Stop 48: a report carried the replica's wall-clock time, which the head compared with
    its own. A replica 10 minutes behind was listed "silent" and then forgotten each time it
    reported; one 10 minutes ahead stayed "ok" for 10 minutes after it stopped asking. Now
    the head times each report when it arrives."""
    replica = PublishedPolicyStore(head.fetch, save_dir_for(tmp_path / "r"), "r-behind", "n1")
    arrived = time.monotonic()
    replica.refresh()
    [row] = head.board.rows(now=arrived + 5.0)
    assert (row["replica"], row["state"]) == ("r-behind", "ok") and 0 < row["seen_s_ago"] <= 5.0
    [row] = head.board.rows(now=arrived + 60.0)
    assert row["state"] == "silent"
