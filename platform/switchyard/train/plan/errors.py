"""The one error a planner input can raise: the message names the field and the value."""

from __future__ import annotations


class PlanError(ValueError):
    """A model, cluster or job the planner cannot reason about."""
