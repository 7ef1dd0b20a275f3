"""Placement: best fit for single bundles, STRICT_PACK, node-group gangs, all-or-nothing."""

from __future__ import annotations

import pytest
from sched_support import nodes

from switchyard.scheduler.core.model import PlacementStrategy
from switchyard.scheduler.core.placement import NodePool


def test_single_bundle_takes_the_tightest_node() -> None:
    pool = NodePool(nodes(3))
    pool.allocate("n1", 6)  # n1 has 2 free: the best fit for a 2-GPU bundle
    assert pool.find((2,), PlacementStrategy.PACK) == ("n1",)
    assert pool.find((3,), PlacementStrategy.PACK) in {("n0",), ("n2",)}


def test_strict_pack_needs_one_node_for_all_bundles() -> None:
    pool = NodePool(nodes(2))
    pool.allocate("n0", 4)
    pool.allocate("n1", 4)
    assert pool.find((2, 2), PlacementStrategy.STRICT_PACK) in {("n0", "n0"), ("n1", "n1")}
    assert pool.find((4, 2), PlacementStrategy.STRICT_PACK) is None
    assert pool.find((4, 2), PlacementStrategy.PACK) is not None


def test_same_node_group_is_all_or_nothing() -> None:
    pool = NodePool(nodes(4, per_group=2))  # g0 = n0,n1; g1 = n2,n3
    pool.allocate("n1", 1)
    pool.allocate("n2", 1)
    # 16 GPUs exist free-ish in total, but no group has two whole nodes free.
    assert pool.find((8, 8), PlacementStrategy.PACK, same_node_group=True) is None
    assert pool.find((8, 8), PlacementStrategy.PACK) == ("n0", "n3") or pool.find(
        (8, 8), PlacementStrategy.PACK
    ) == ("n3", "n0")


def test_pack_prefers_nodes_already_in_the_gang() -> None:
    pool = NodePool(nodes(2))
    placed = pool.find((4, 4), PlacementStrategy.PACK)
    assert placed is not None and placed[0] == placed[1]
    spread = pool.find((4, 4), PlacementStrategy.SPREAD)
    assert spread is not None and spread[0] != spread[1]


def test_held_gpus_are_not_offered_and_bonus_gpus_are() -> None:
    pool = NodePool(nodes(1))
    pool.allocate("n0", 4)
    assert pool.find((4,), PlacementStrategy.PACK, held={"n0": 2}) is None
    assert pool.find((6,), PlacementStrategy.PACK, bonus={"n0": 2}) == ("n0",)


def test_over_allocation_and_over_release_fail_loudly() -> None:
    pool = NodePool(nodes(1))
    pool.allocate("n0", 8)
    with pytest.raises(AssertionError):
        pool.allocate("n0", 1)
    pool.release("n0", 8)
    with pytest.raises(AssertionError):
        pool.release("n0", 1)


def test_node_inventory_validation() -> None:
    pool = NodePool(nodes(1))
    with pytest.raises(ValueError, match="already exists"):
        pool.add(nodes(1)[0])
    assert pool.remove("n0").name == "n0"
    assert pool.total_gpus == 0


def test_top_free_lists_the_roomiest_nodes_first() -> None:
    pool = NodePool(nodes(4))
    for name, used in (("n0", 8), ("n1", 3), ("n2", 6)):
        pool.allocate(name, used)
    assert pool.top_free(3) == [8, 5, 2]  # n3, n1, n2
    assert pool.top_free(9) == [8, 5, 2, 0]  # fewer nodes than asked: every node
    assert pool.top_free(0) == []
