"""A platform job's run directory is its team's: two teams' jobs of one name never share one.

Every run directory was `<checkpoint root>/<job name>`. Researchers copy the shipped configs
(`tiny-ddp`, `demo-fsdp`...), so two teams submitting the same file ran in one directory: the
second resumed from the first's checkpoint (reporting it as its own `resumed_from`), pruned its
checkpoints, and the console showed each team the other's loss curve. A job admitted by the
scheduler now runs in `<root>/<team>/<name>` (the team of its grant), and the console reads
only the team's own runs, by job name, never a path.

No Ray is started: `TorchTrainer` is replaced by one that records what it was given.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from _workers import tiny_spec

import switchyard.train.ray_trainer as ray_trainer
from switchyard.console.sources import PlatformReader
from switchyard.train.metrics_log import METRICS_FILE, run_output_dir


class RecordingTorchTrainer:
    """Keeps the run's directory and storage, and ends as a finished run would."""

    runs: list[dict[str, Any]] = []

    def __init__(self, train_fn: Any, *, train_loop_config: dict[str, Any], run_config: Any, **_: Any) -> None:
        self.config, self.run_config = train_loop_config, run_config

    def fit(self) -> Any:
        run = {"run_uri": self.config["run_uri"], "storage": self.run_config.storage_path}
        RecordingTorchTrainer.runs.append({**run, "name": self.run_config.name, "team": self.config["team"]})
        outcome = {"job": "j", "status": "completed", "step": 1, "loss": 1.0, "checkpoint": None}
        outcome |= {"resumable": False, "resumed_from": None, "reason": None}
        return SimpleNamespace(return_value=None, metrics=outcome, error=None)


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    RecordingTorchTrainer.runs = []
    monkeypatch.setattr(ray_trainer, "TorchTrainer", RecordingTorchTrainer)
    return RecordingTorchTrainer.runs


def test_two_teams_jobs_of_one_name_run_apart(recorded: list[dict[str, Any]], tmp_path: Path) -> None:
    spec = tiny_spec("tiny-ddp", **{"checkpoint.uri": str(tmp_path / "ckpt")})
    for team in ("ads", "search", "ads", None):
        ray_trainer.run_on_ray(spec, team=team)
    uris = [run["run_uri"] for run in recorded]
    root = tmp_path / "ckpt"
    assert uris == [f"{root}/ads/tiny-ddp", f"{root}/search/tiny-ddp", f"{root}/ads/tiny-ddp", f"{root}/tiny-ddp"]
    # Ray Train's own directory for the run is the same one: storage + name.
    assert all(f"{run['storage']}/{run['name']}" == run["run_uri"] for run in recorded)
    assert [run["team"] for run in recorded] == ["ads", "search", "ads", None]


def test_an_s3_runs_metrics_are_kept_under_its_team(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SWITCHYARD_STATE_DIR", str(tmp_path / "state"))
    runs = tmp_path / "state" / "train" / "runs"
    assert run_output_dir("s3://b/ckpt/ads/tiny-ddp", "tiny-ddp", "ads") == runs / "ads" / "tiny-ddp"
    assert run_output_dir("s3://b/ckpt/tiny-ddp", "tiny-ddp") == runs / "tiny-ddp"
    assert run_output_dir(str(tmp_path / "ckpt" / "ads" / "j"), "j", "ads") == tmp_path / "ckpt" / "ads" / "j"


def _write_run(state: Path, *parts: str, loss: float) -> None:
    folder = state.joinpath("train", "checkpoints", *parts)
    folder.mkdir(parents=True)
    line = {"step": 1, "loss": loss, "lr": 1e-3, "grad_norm": None, "tokens_per_s": 1.0, "step_time_s": 1.0}
    line |= {"mfu": None, "memory_bytes": 1, "memory_kind": "peak_rss"}
    (folder / METRICS_FILE).write_text(json.dumps(line) + "\n")


def test_the_console_reads_only_the_teams_own_run_by_name(tmp_path: Path) -> None:
    """It looked the job name up as a path, then under `<state>/train/checkpoints/<name>`:
    another team's run of the same name, or any directory a workload's description named."""
    state = tmp_path / "state"
    _write_run(state, "search", "tiny-ddp", loss=2.0)
    _write_run(state, "tiny-ddp", loss=3.0)  # a run of no team (before runs were per team)
    _write_run(state, "elsewhere", loss=4.0)
    reader = PlatformReader(state, tmp_path / "policies", lambda: None)
    assert reader.run_metrics("ads", "tiny-ddp") == []
    assert [row["loss"] for row in reader.run_metrics("search", "tiny-ddp")] == [2.0]
    for description in (str(state / "train" / "checkpoints" / "elsewhere"), "../elsewhere", "../tiny-ddp", ".."):
        assert reader.run_metrics("search", description) == [], description
