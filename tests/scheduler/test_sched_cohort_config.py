"""scheduler.yaml with GPU types and cohorts: the shipped example loads, and every name that
points elsewhere in the file (a GPU type, a cohort) is checked where it is written."""

from __future__ import annotations

from pathlib import Path

import pytest

from switchyard.scheduler.core.config import PolicyFileError, load_policy_file
from switchyard.scheduler.core.policy import CohortLimits

REPO = Path(__file__).resolve().parents[2]
BEGIN, END = "# --- example: gpu types and cohorts ---", "# --- end of example ---"

TYPED = """\
gpu_types: [h100, a100]
cohorts:
  - {name: org}
  - {name: lab, parent: org, borrowing_limit_gpus: {h100: 4}}
teams:
  - name: a
    cohort: lab
    quotas:
      - {classes: [training], gpu_type: h100, guaranteed_gpus: 8}
      - {classes: [training], gpu_type: a100, guaranteed_gpus: 8}
"""


def test_the_example_in_the_repo_policy_file_loads(tmp_path: Path) -> None:
    text = (REPO / "policies" / "scheduler.yaml").read_text()
    block = text[text.index(BEGIN) + len(BEGIN) : text.index(END)]
    uncommented = "\n".join(line.removeprefix("# ") for line in block.strip().splitlines())
    path = tmp_path / "example.yaml"
    path.write_text(uncommented + "\n")
    policy = load_policy_file(path).to_policy()
    assert policy.gpu_types == ("h100", "a100")
    product = next(c for c in policy.cohorts if c.name == "product")
    assert product.limits_for("h100") == CohortLimits(0, 8)
    assert product.limits_for("a100") == CohortLimits(0, None)
    assert policy.team("vision").cohort == "research"


def test_types_and_cohorts_reach_the_policy(tmp_path: Path) -> None:
    policy = load_policy_file(_write(tmp_path, TYPED)).to_policy()
    assert [q.gpu_type for q in policy.team("a").quotas] == ["h100", "a100"]
    lab = next(c for c in policy.cohorts if c.name == "lab")
    assert (lab.parent, lab.limits_for("h100"), lab.limits_for("a100")) == ("org", CohortLimits(4), CohortLimits())


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("old", "new", "where"),
    [
        (
            "gpu_type: a100, guaranteed",
            "gpu_type: v100, guaranteed",
            r"s\.yaml: teams\.0\.quotas\.1\.gpu_type: team 'a': unknown GPU type 'v100' "
            r"\(declared: h100, a100\) \(line 10\)",
        ),
        (
            "gpu_type: a100, guaranteed",
            "guaranteed",
            r"teams\.0\.quotas\.1\.gpu_type: team 'a': a quota must name its GPU type",
        ),
        ("cohort: lab", "cohort: labs", r"teams\.0\.cohort: team 'a': unknown cohort 'labs' \(line 7\)"),
        ("parent: org", "parent: orgs", r"cohorts\.1\.parent: cohort 'lab': unknown parent cohort 'orgs' \(line 4\)"),
        ("{h100: 4}", "{v100: 4}", r"cohorts\.1\.borrowing_limit_gpus\.v100: cohort 'lab': unknown GPU type 'v100'"),
        ("{h100: 4}", "{h100: -1}", r"cohorts\.1: Value error, cohort 'lab': borrowing_limit_gpus must be at least 0"),
        ("- {name: org}", "- {name: org, parent: lab}", r"cohorts\.0\.parent: cohort 'org': its parents form a cycle"),
        ("[h100, a100]", "[h100, h100]", r"gpu_types: GPU types must be unique"),
        (
            "gpu_type: a100, guaranteed_gpus: 8",
            "gpu_type: h100, guaranteed_gpus: 8",
            r"appears in two quotas of GPU type 'h100'",
        ),
    ],
)
def test_a_bad_reference_names_its_field_and_line(tmp_path: Path, old: str, new: str, where: str) -> None:
    assert old in TYPED
    with pytest.raises(PolicyFileError, match=where):
        load_policy_file(_write(tmp_path, TYPED.replace(old, new, 1)))


def test_a_type_on_an_untyped_file_is_refused(tmp_path: Path) -> None:
    text = "teams:\n  - name: a\n    quotas:\n      - {classes: [training], gpu_type: h100, guaranteed_gpus: 1}\n"
    with pytest.raises(
        PolicyFileError, match=r"teams\.0\.quotas\.0\.gpu_type: .*unknown GPU type 'h100' \(declared: none\)"
    ):
        load_policy_file(_write(tmp_path, text))


@pytest.mark.parametrize(
    ("text", "where"),
    [
        (
            TYPED + "  - name: a\n    quotas:\n      - {classes: [exploratory], gpu_type: h100, guaranteed_gpus: 1}\n",
            r"teams\.1\.name: team 'a' is declared twice \(line 11\)",
        ),
        (
            "priority_classes:\n  - {name: training, value: 100, preemptible: true}\n"
            "  - {name: training, value: 50, preemptible: true}\n",
            r"priority_classes\.1\.name: priority class 'training' is declared twice \(line 3\)",
        ),
    ],
    ids=["team", "priority-class"],
)
def test_a_name_declared_twice_is_refused_at_its_line(tmp_path: Path, text: str, where: str) -> None:
    """Found by the generated policy mutations (stop 44; a draw CI had not hit yet): a team or
    priority class listed twice passed `policy check`, and building the scheduler from the file
    then raised a bare ValueError ("duplicate team names") with no file or line."""
    with pytest.raises(PolicyFileError, match=where):
        load_policy_file(_write(tmp_path, text))
