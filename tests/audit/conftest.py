"""Fixtures for the audit tests: the shipped data policies and one shared Presidio scrubber."""

from __future__ import annotations

import pytest

from switchyard.audit.data_policy import load_data_policies
from switchyard.audit.redaction import TextScrubber
from switchyard.paths import repo_root
from switchyard.policy.models import DataPolicies


@pytest.fixture(scope="session")
def data_policies() -> DataPolicies:
    return load_data_policies(repo_root() / "policies")


@pytest.fixture(scope="session")
def scrubber() -> TextScrubber:
    return TextScrubber()
