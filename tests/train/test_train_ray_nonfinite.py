"""A non-finite loss under Ray ends as one line and exit 1, as a local run does; an error in
the job's inputs (data, checkpoints) as one line and exit 2.

No Ray is started: `TorchTrainer` is replaced by one that runs `train_fn` for each rank in
this process (with a fake Train context), and the `Trainer` by one that stops on a NaN.
"""

from __future__ import annotations

import json
import math
import pickle
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import ray
import ray.train
import yaml
from _workers import tiny_spec

import switchyard.cluster.admission as admission
import switchyard.train.ray_trainer as ray_trainer
from switchyard.cli import main as switchyard_main
from switchyard.train.data import DataSourceError
from switchyard.train.step_sync import NonFiniteLossError
from train_jobs.run import main as train_jobs_main

WORLD = 2


class NanTrainer:
    """Every rank stops at step 3 with the checkpoint of step 2 as the last good one."""

    def __init__(self, spec: Any, ctx: Any) -> None:
        self.ctx = ctx

    def run(self) -> Any:
        raise NonFiniteLossError(3, math.nan, f"{self.ctx.store.uri}/step-00000002")


class InProcessTorchTrainer:
    """`fit()` runs `train_fn` once per rank here and returns rank 0's value as Ray does."""

    def __init__(self, train_fn: Any, *, train_loop_config: dict[str, Any], **_: Any) -> None:
        self.train_fn, self.config = train_fn, train_loop_config

    def fit(self) -> Any:
        returns = []
        for rank in range(WORLD):
            context = SimpleNamespace(
                get_world_rank=lambda r=rank: r, get_world_size=lambda: WORLD, get_local_world_size=lambda: WORLD
            )
            ray.train.get_context = lambda c=context: c  # type: ignore[assignment,misc]
            # What Ray sends from a worker to the driver is pickled.
            returns.append(pickle.loads(pickle.dumps(self.train_fn(self.config))))
        return SimpleNamespace(return_value=returns[0], metrics={}, error=None)


@pytest.fixture
def nan_on_ray(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A job config whose Ray run stops on a NaN at step 3; returns the config path."""
    monkeypatch.setattr(ray.train, "get_context", ray.train.get_context)  # restored after
    monkeypatch.setattr(ray_trainer, "TorchTrainer", InProcessTorchTrainer)
    monkeypatch.setattr(ray_trainer, "Trainer", NanTrainer)
    monkeypatch.setattr(ray_trainer.tempfile, "mkdtemp", lambda prefix: str(tmp_path / prefix))
    monkeypatch.setattr(ray, "init", lambda *a, **k: None)
    monkeypatch.setattr(ray, "shutdown", lambda: None)
    config = tmp_path / "job.yaml"
    spec = tiny_spec("nan", **{"checkpoint.uri": str(tmp_path / "ckpt")})
    config.write_text(yaml.safe_dump(spec.model_dump(mode="json")))
    return config


def test_a_non_finite_loss_error_survives_pickling_and_its_dict() -> None:
    """Pickled (Ray's way across processes) and as `to_dict()` (what ranks hand launchers)."""
    original = NonFiniteLossError(3, math.inf, "s3://b/j/step-00000002")
    for error in (
        pickle.loads(pickle.dumps(original)),
        NonFiniteLossError(**json.loads(json.dumps(original.to_dict()))),
    ):
        assert (error.step, error.loss, error.last_checkpoint) == (3, math.inf, "s3://b/j/step-00000002")
        assert str(error) == str(original)


def test_run_on_ray_raises_the_ranks_non_finite_loss(nan_on_ray: Path, tmp_path: Path) -> None:
    spec = tiny_spec("nan", **{"checkpoint.uri": str(tmp_path / "ckpt")})
    with pytest.raises(NonFiniteLossError, match=r"loss is nan at step 3; .*nan/step-00000002\)$"):
        ray_trainer.run_on_ray(spec)
    ray_trainer.raise_non_finite_loss(None)  # a finished run's rank 0 returns nothing


def _one_error_line(err: str, prefix: str, run_dir: Path) -> None:
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith(prefix)]
    checkpoint = f"{run_dir}/step-00000002"
    expected = f"loss is nan at step 3; training stopped without saving (last good checkpoint: {checkpoint})"
    assert lines == [f"{prefix}{expected}"]


def test_switchyard_train_run_ray_prints_one_line_and_exits_1(
    nan_on_ray: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert switchyard_main(["train", "run", str(nan_on_ray), "--ray"]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    _one_error_line(err, "switchyard: error: ", tmp_path / "ckpt" / "nan")


def test_train_jobs_run_on_ray_prints_one_line_and_exits_1(
    nan_on_ray: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_scheduler(*args: Any, **kwargs: Any) -> Any:
        raise admission.NoScheduler("no switchyard scheduler")

    monkeypatch.setattr(admission, "admit", no_scheduler)
    assert train_jobs_main([str(nan_on_ray), "--team", "research"]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    _one_error_line(err, "train_jobs.run: ", tmp_path / "ckpt" / "research" / "nan")  # run for its team


class BadDataTrainer:
    """Every rank finds the same shard unusable, as `load_tokens` does."""

    def __init__(self, spec: Any, ctx: Any) -> None:
        pass

    def run(self) -> Any:
        raise DataSourceError("/data/shard-00001.bin: size 3 is not a whole number of uint16 tokens")


def test_a_job_input_error_under_ray_is_one_line_and_exit_2(
    nan_on_ray: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bad data or no resumable checkpoint reached the driver as every rank's traceback."""
    monkeypatch.setattr(ray_trainer, "Trainer", BadDataTrainer)

    def no_scheduler(*args: Any, **kwargs: Any) -> Any:
        raise admission.NoScheduler("no switchyard scheduler")

    monkeypatch.setattr(admission, "admit", no_scheduler)
    expected = "/data/shard-00001.bin: size 3 is not a whole number of uint16 tokens"
    assert switchyard_main(["train", "run", str(nan_on_ray), "--ray"]) == 2
    assert capsys.readouterr() == ("", f"switchyard: error: {expected}\n")
    assert train_jobs_main([str(nan_on_ray), "--team", "research"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.strip().splitlines()[-1] == f"train_jobs.run: {expected}" and "Traceback" not in err
