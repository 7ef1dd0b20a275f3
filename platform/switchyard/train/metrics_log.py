"""The durable record of a run's metrics lines, written by rank 0 into the run's directory:
`metrics.jsonl` (one JSON object per line, what `switchyard train plot` reads) and
TensorBoard event files under `tensorboard/`.

Under Ray Train the lines are reported to Ray as well, but Train V2 keeps only the metrics
that travel with a checkpoint: these files are the record. A resumed run appends to them, so
steps between the last checkpoint and a crash can appear twice; readers keep the last line
per step. A run killed while writing a line leaves part of it: the resumed run starts on a
line of its own, and readers skip such a line and say so, keeping every whole one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from switchyard.state import state_dir
from switchyard.train.step_metrics import OPTIONAL_SCALARS, SCALARS, MetricsLine
from switchyard.train.storage import is_s3_uri

METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"


def run_output_dir(run_uri: str, job: str, team: str | None = None) -> Path:
    """The run's local directory: its checkpoint folder (`<checkpoint.uri>/[<team>/]<job name>`)
    when that is local; for an `s3://` store, `<state dir>/train/runs/[<team>/]<job name>` on
    rank 0's host."""
    if not is_s3_uri(run_uri):
        return Path(run_uri)
    runs = state_dir() / "train" / "runs"
    return (runs / team if team else runs) / job


class MetricsRecord:
    """Appends metrics lines to `<directory>/metrics.jsonl` and TensorBoard scalars
    (`train/<field>`) to `<directory>/tensorboard/`, flushed after every line."""

    def __init__(self, directory: Path) -> None:
        from tensorboardX import SummaryWriter  # imported here: about a second, and rank 0 only

        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / METRICS_FILE
        self._file: IO[str] = self.path.open("a", encoding="utf-8")
        if _ends_mid_line(self.path):
            self._file.write("\n")  # the last run was killed mid-line: that part stays a line of its own
        self._board = SummaryWriter(logdir=str(directory / TENSORBOARD_DIR))

    def write(self, line: MetricsLine) -> None:
        self._file.write(json.dumps(line.as_dict(), sort_keys=True) + "\n")
        self._file.flush()
        for name in (*SCALARS, *OPTIONAL_SCALARS):
            value = getattr(line, name)
            if value is not None:  # an undeclared peak leaves MFU out rather than at 0
                self._board.add_scalar(f"train/{name}", value, line.step)
        self._board.flush()

    def close(self) -> None:
        self._board.close()
        self._file.close()


class MetricsFileError(ValueError):
    """A metrics file that is missing, empty or unreadable; the message names the path."""


@dataclass(frozen=True)
class Metrics:
    rows: list[dict[str, Any]]
    """The metrics lines in step order, the last one written for each step."""
    skipped: list[str]
    """`line N: why` for each line that is not a metrics line (a run killed mid-write leaves one)."""


def _ends_mid_line(path: Path) -> bool:
    if path.stat().st_size == 0:
        return False
    with path.open("rb") as f:
        f.seek(-1, 2)
        return f.read(1) != b"\n"


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _problem(row: Any) -> str | None:
    """Why a parsed line is not a metrics line, or None."""
    if not isinstance(row, dict):
        return f"a JSON {type(row).__name__}, not an object"
    step = row.get("step")
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        return f"step {step!r} is not a step number"
    missing = [key for key in SCALARS if key not in row]
    if missing:
        return f"missing {', '.join(missing)}"
    for key in (*SCALARS, *OPTIONAL_SCALARS):
        value = row.get(key)
        if value is not None and not _is_number(value):
            return f"{key} {value!r} is not a number"
    return None


def read_metrics(path: Path) -> Metrics:
    """The metrics lines of a file, and the lines that are not one; raises `MetricsFileError`
    when there is no file or no metrics line in it."""
    if not path.is_file():
        raise MetricsFileError(f"{path}: no metrics file (a run writes one at its first log step)")
    by_step: dict[int, dict[str, Any]] = {}
    skipped: list[str] = []
    for number, raw in enumerate(path.read_bytes().split(b"\n"), start=1):
        if not raw.strip():
            continue
        try:
            row = json.loads(raw.decode("utf-8"))
        except ValueError as exc:  # not UTF-8, or not JSON
            skipped.append(f"line {number}: not JSON ({exc})")
            continue
        problem = _problem(row)
        if problem is not None:
            skipped.append(f"line {number}: {problem}")
            continue
        by_step[row["step"]] = row
    if not by_step:
        why = f" ({len(skipped)} line(s) that are not metrics lines: {skipped[0]})" if skipped else ""
        raise MetricsFileError(f"{path}: the metrics file is empty{why}")
    return Metrics([by_step[step] for step in sorted(by_step)], skipped)


def _named(state: Path, run: str, team: str | None) -> list[Path]:
    roots = [state / "train" / "checkpoints", state / "train" / "runs"]
    return [(root / team if team else root) / run / METRICS_FILE for root in roots]


def find_metrics_file(run: str, state: Path, team: str | None = None) -> Path:
    """`run` as `switchyard train plot` takes it: a metrics file, a run directory, or a job
    name (the `name` of `switchyard train list`), looked up where jobs with the default
    checkpoint root keep their run directory (`<state>/train/checkpoints/[<team>/]<name>`),
    then where `s3://` jobs keep their metrics (`<state>/train/runs/[<team>/]<name>`)."""
    path = Path(run)
    if path.is_file():
        return path
    if path.is_dir() or "/" in run:
        return path / METRICS_FILE
    named = _named(state, run, team)
    return next((p for p in named if p.is_file()), named[0])


def _one_component(name: str) -> bool:
    return bool(name) and name not in (".", "..") and not any(c in name for c in "/\\\0")


def team_metrics_file(job: str, team: str, state: Path) -> Path | None:
    """The metrics file of `team`'s platform job `job`, or None: only under the team's own run
    directories, and only for a job name (never a path: a workload's description is free text,
    and another team's job may have the same name)."""
    if not (_one_component(job) and _one_component(team)):
        return None
    return next((p for p in _named(state, job, team) if p.is_file()), None)
