"""scheduler.yaml: the repo's file loads, and a bad file names the file and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from switchyard.scheduler.core.config import PolicyFileError, load_policy_file
from switchyard.scheduler.core.policy import PreemptionMode

REPO = Path(__file__).resolve().parents[2]


def test_repo_policy_file_loads() -> None:
    policy = load_policy_file(REPO / "policies" / "scheduler.yaml").to_policy()
    assert policy.knobs.preemption is PreemptionMode.CHECKPOINT_AWARE
    assert {p.name for p in policy.priority_classes} >= {"production-inference", "training"}
    assert policy.team("inference").guaranteed_gpus > 0


def test_bad_field_is_named(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text("teams:\n  - name: a\n    quotas:\n      - classes: [training]\n"
                    "        guaranteed_gpus: -1\n")
    with pytest.raises(PolicyFileError, match=r"s\.yaml: teams\.0\.quotas\.0\.guaranteed_gpus"):
        load_policy_file(path)


def test_a_class_in_two_quotas_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text("teams:\n  - name: a\n    quotas:\n      - {classes: [training], guaranteed_gpus: 1}\n"
                    "      - {classes: [training], guaranteed_gpus: 2}\n")
    with pytest.raises(PolicyFileError, match="appears in two quotas"):
        load_policy_file(path)


def test_unknown_key_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text("policy:\n  ordring: fifo\n")
    with pytest.raises(PolicyFileError, match=r"policy\.ordring"):
        load_policy_file(path)
