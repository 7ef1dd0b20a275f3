"""Reading `data_policies.yaml` and answering what a data class allows.

The class of a flow comes from the layered flow policy (`EffectiveFlow.data_class`); the org
guardrail `data_class: {min_class: ...}` is what keeps a team from lowering it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from switchyard.config_file import ConfigFileError, read_yaml, validate
from switchyard.policy.models import DataClass, DataPolicies, ProviderCatalog, Role

DATA_POLICIES_FILE = "data_policies.yaml"

# A fixed set, or a getter for the one in force (e.g. `lambda: policy_store.current.data`), so
# a policy reload reaches the redactor and the sink without rebuilding them.
DataPolicySource = DataPolicies | Callable[[], DataPolicies]


def as_getter(source: DataPolicySource) -> Callable[[], DataPolicies]:
    if isinstance(source, DataPolicies):
        return lambda: source
    return source


class DataPolicyError(ConfigFileError):
    """data_policies.yaml is missing or invalid; the message names the file, line and field."""


def load_data_policies(policies: Path) -> DataPolicies:
    path = policies / DATA_POLICIES_FILE
    return validate(read_yaml(path, error=DataPolicyError), DataPolicies, error=DataPolicyError)


def providers_allowed(cls: DataClass, catalog: ProviderCatalog) -> frozenset[str]:
    """Providers that carry every compliance tag the class requires."""
    return frozenset(name for name, p in catalog.providers.items() if cls.requires_compliance <= p.compliance)


def may_read_bodies(cls: DataClass, role: Role) -> bool:
    return role in cls.body_readers
