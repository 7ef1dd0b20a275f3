"""Inputs the scheduler benches share: the trace, and the policy file sized for a cluster.

`bench/philly_scheduler.yaml` names teams sized for 672 GPUs. At another size its knobs and
priority classes still apply, but the guarantees must fit that cluster: `for_size` writes the
file without its `teams:` so the simulator sizes Philly's teams for `--gpus` from their VC
sizes (`sim.teams.philly_teams`), as it does for a file that names none.
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT.parent / "shared" / "traces" / "philly_jobs_sep_oct_2017.csv"
POLICY_FILE = ROOT / "bench" / "philly_scheduler.yaml"


def without_teams(policy_file: Path, directory: Path) -> Path:
    """A copy of `policy_file` without its `teams:` (knobs and priority classes kept)."""
    document = yaml.safe_load(policy_file.read_text())
    document.pop("teams", None)
    copy = directory / f"{policy_file.stem}_sized.yaml"
    copy.write_text(yaml.safe_dump(document, sort_keys=False))
    return copy


@contextmanager
def for_size(policy_file: Path | None, size_teams: bool) -> Iterator[Path | None]:
    """The policy file to simulate: as given, or (`size_teams`) a copy without its teams that
    lives as long as the block."""
    if policy_file is None or not size_teams:
        yield policy_file
        return
    with tempfile.TemporaryDirectory(prefix="switchyard-bench-") as directory:
        yield without_teams(policy_file, Path(directory))


def add_run_arguments(parser: argparse.ArgumentParser, gpus: int, window: str, size_teams: bool) -> None:
    """The options every seeded comparison takes: cluster size, month, policy file, whether to
    size Philly's teams for the cluster, and the seeds."""
    from switchyard.scheduler.sim.run import WINDOWS

    parser.add_argument("--gpus", type=int, default=gpus)
    parser.add_argument("--window", choices=sorted(WINDOWS), default=window)
    parser.add_argument("--policy-file", type=Path, default=POLICY_FILE)
    parser.add_argument(
        "--size-teams",
        action=argparse.BooleanOptionalAction,
        default=size_teams,
        help=f"size Philly's teams for --gpus instead of the file's (default: {'on' if size_teams else 'off'})",
    )
    parser.add_argument("--seeds", default="0,1,2")
