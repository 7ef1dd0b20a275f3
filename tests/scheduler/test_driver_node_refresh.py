"""`NodeRefresh`: the actor's per-release check that Ray reports the driver's nodes, answered
from the last report it vetted when the same nodes come again, by value otherwise."""

from __future__ import annotations

from dataclasses import replace

from driver_support import driver
from sched_support import nodes

from switchyard.scheduler.driver.node_refresh import NodeRefresh


def test_the_same_report_again_is_unchanged_and_a_reordered_one_too() -> None:
    d, refresh, report = driver({"a": 8}, node_count=3), NodeRefresh(), nodes(3)
    assert refresh.unchanged(d, report) and refresh.unchanged(d, report)
    assert refresh.unchanged(d, list(reversed(report)))


def test_a_lost_node_or_a_changed_one_is_a_change_until_the_driver_has_it() -> None:
    d, refresh, report = driver({"a": 8}, node_count=3), NodeRefresh(), nodes(3)
    assert refresh.unchanged(d, report)
    assert not refresh.unchanged(d, report[:2])  # a node left
    assert not refresh.unchanged(d, [*report[:2], replace(report[2], gpus=4)])  # same name, other node
    d.nodes_seen(report[:2], 1.0)
    refresh.recorded(report[:2])
    assert refresh.unchanged(d, report[:2])
    assert not refresh.unchanged(d, report)  # the report it vetted before is no answer now


def test_copies_of_the_nodes_compare_by_value() -> None:
    d, refresh = driver({"a": 8}, node_count=2), NodeRefresh()
    assert refresh.unchanged(d, [replace(n) for n in nodes(2)])
    assert not NodeRefresh().unchanged(d, nodes(3))
