"""Metrics lines, their durable record, fewer host syncs, timed preemption checks and the
non-finite loss stop.

The 2-rank jobs run in one spawned gloo group (`_workers.metrics_jobs`); the host-sync and
NaN tests run one rank in this process, so they can patch torch and the engine in place.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _workers
import pytest
import torch
from _workers import tiny_spec
from conftest import one_rank_context

from switchyard.cli import main
from switchyard.train.checkpoint import CheckpointStore
from switchyard.train.engine import StepOutput, TrainEngine
from switchyard.train.launch import spawn_group
from switchyard.train.loop import RunContext, Trainer, lr_at
from switchyard.train.metrics_log import METRICS_FILE, TENSORBOARD_DIR
from switchyard.train.plan.compute import step_flops
from switchyard.train.plan.from_spec import spec_input
from switchyard.train.step_metrics import SCALARS, StepWindow, step_cost
from switchyard.train.step_sync import NonFiniteLossError

LINE_KEYS = {
    "step",
    "loss",
    "lr",
    "grad_norm",
    "tokens_per_s",
    "step_time_s",
    "mfu",
    "memory_bytes",
    "memory_kind",
    "val_loss",
}


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    out = tmp_path_factory.mktemp("metrics")
    spawn_group(
        _workers.metrics_jobs,
        2,
        str(out),
        finished=lambda: all((out / f"rank{r}.json").is_file() for r in (0, 1)),
    )
    return out, [_workers.read_json(out / f"rank{r}.json") for r in (0, 1)]


# --- the arithmetic -----------------------------------------------------------------------


def test_model_flops_are_the_planners_and_exclude_recomputation() -> None:
    # tiny: L=2, h=64, f=4h=256, V=257; GPT-2 blocks (biases, LayerNorm, fused qkv).
    # block = attention 4h² + 4h (16,640) + MLP 2hf + f + h (33,088) + 2 LayerNorms 4h (256)
    #       = 49,984; Ψ_matmul = L·block + V·h (tied head) = 99,968 + 16,448 = 116,416.
    # per token 6Ψ + 12·L·h·s = 698,496 + 12·2·64·32 = 747,648; 2·32 tokens per rank and step.
    spec = tiny_spec(**{"parallel.activation_checkpointing": "full"})
    cost = step_cost(spec, world_size=2)
    assert cost.model_flops_per_device == 64 * 747_648 == 47_849_472
    planned = spec_input(spec)
    assert step_flops(planned.shape, planned.job).value > cost.model_flops_per_device  # the planner adds recompute
    assert cost.tokens_per_step == 2 * 32 * 2  # micro-batch x seq_len x ranks
    assert cost.peak_flops_per_device is None and cost.mfu(0.1) is None


def test_window_turns_wall_time_into_step_time_tokens_per_s_and_mfu() -> None:
    cost = step_cost(tiny_spec(peak_tflops_per_device=1.0), world_size=2)
    window = StepWindow(cost, started=10.0)
    for _ in range(4):
        window.add_step()
    window.exclude(0.2)  # a checkpoint save inside the window
    line = window.close(10.6, step=4, loss=2.0, lr=1e-3, grad_norm=0.5, memory_bytes=1, memory_kind="peak_rss")
    assert line.step_time_s == pytest.approx(0.1)  # (0.6 s - 0.2 s) / 4 steps
    assert line.tokens_per_s == pytest.approx(128 / 0.1)
    assert line.mfu == pytest.approx(47_849_472 / (0.1 * 1e12))
    with pytest.raises(RuntimeError, match="no step"):
        window.close(11.0, step=4, loss=2.0, lr=1e-3, grad_norm=None, memory_bytes=1, memory_kind="peak_rss")


# --- 2 ranks: lines, files, preemption ------------------------------------------------------


def _event_tags(path: Path) -> set[str]:
    """Scalar tags in a TensorBoard event file (TFRecord framing: length, crc, data, crc)."""
    from tensorboardX.proto.event_pb2 import Event

    tags: set[str] = set()
    data = path.read_bytes()
    offset = 0
    while offset < len(data):
        (length,) = struct.unpack_from("<Q", data, offset)
        event = Event.FromString(data[offset + 12 : offset + 12 + length])
        tags.update(v.tag for v in event.summary.value)
        offset += 12 + length + 4
    return tags


def test_a_line_every_n_steps_with_every_field_and_sane_values(two_ranks: tuple[Path, list[dict[str, Any]]]) -> None:
    out, ranks = two_ranks
    logged = ranks[0]["logged"]
    rows = [json.loads(line) for line in (out / "logged" / METRICS_FILE).read_text().splitlines()]
    assert [r["step"] for r in rows] == [3, 6]  # log_every_steps: 3, steps: 6
    spec = tiny_spec("logged", steps=6)
    for row in rows:
        assert set(row) == LINE_KEYS
        assert row["loss"] == logged["losses"][row["step"] - 1]
        assert row["lr"] == pytest.approx(lr_at(row["step"] - 1, spec.optim, spec.steps))
        assert row["tokens_per_s"] > 0 and row["step_time_s"] > 0
        assert row["tokens_per_s"] == pytest.approx(128 / row["step_time_s"])
        assert 0 < row["grad_norm"] < 100 and row["memory_bytes"] > 10 * 2**20 and row["memory_kind"] == "peak_rss"
        assert row["mfu"] is None  # no peak declared
        assert row["val_loss"] is None  # no validation configured
    texts = ranks[0]["logs"]["logged"]
    assert [t.split()[1] for t in texts] == ["3", "6"]
    for word in ("loss", "lr", "grad_norm", "tokens/s", "step_time", "mfu -", "memory"):
        assert all(word in t for t in texts), (word, texts)
    mfu = [json.loads(line)["mfu"] for line in (out / "mfu" / METRICS_FILE).read_text().splitlines()]
    assert len(mfu) == 2 and all(0 < m < 1 for m in mfu)  # peak declared: 1 TFLOP/s


def test_metrics_files_and_final_line_come_from_rank_0_only(two_ranks: tuple[Path, list[dict[str, Any]]]) -> None:
    out, ranks = two_ranks
    assert ranks[1]["logs"]["logged"] == []  # rank 1 logs no metrics lines
    # Both ranks share the run directory: a second writer would double the lines and files.
    assert len((out / "logged" / METRICS_FILE).read_text().splitlines()) == 2
    events = list((out / "logged" / TENSORBOARD_DIR).iterdir())
    assert len(events) == 1 and events[0].name.startswith("events.out.tfevents")
    assert _event_tags(events[0]) == {f"train/{name}" for name in SCALARS if name != "mfu"}
    final = ranks[0]["logged"]
    last = json.loads((out / "logged" / METRICS_FILE).read_text().splitlines()[-1])
    for key in ("tokens_per_s", "step_time_s", "mfu", "grad_norm", "memory_bytes"):
        assert final[key] == last[key], key
    assert final["metrics_file"] == str(out / "logged" / METRICS_FILE)


def test_preemption_is_checked_on_rank_0s_clock_and_all_ranks_stop_together(
    two_ranks: tuple[Path, list[dict[str, Any]]],
) -> None:
    """Fake clocks: one second per step on rank 0, seven on rank 1. preempt_check_s: 3, so
    rank 0 reads the channel after steps 1, 4 and 7 only; the notice sent during step 5 is
    seen at step 7 by both ranks, although rank 1's clock would have checked every step."""
    _, ranks = two_ranks
    assert [r["timed"]["step"] for r in ranks] == [7, 7]
    assert all(r["timed"]["status"] == "preempted" for r in ranks)
    assert ranks[0]["reads"]["timed"] == [1, 4, 7] and ranks[1]["reads"]["timed"] == []


def test_a_checkpoint_step_is_always_checked(two_ranks: tuple[Path, list[dict[str, Any]]]) -> None:
    """preempt_check_s: 30 (no timed check after step 1 in 12 one-second steps); SIGTERM on
    rank 1 during step 2 still stops both ranks at the checkpoint step 5, with one save."""
    out, ranks = two_ranks
    assert [r["ckpt"]["step"] for r in ranks] == [5, 5]
    assert ranks[0]["ckpt"]["reason"] == "stop agreed by another rank" and ranks[1]["ckpt"]["reason"] == "SIGTERM"
    assert ranks[0]["reads"]["ckpt"] == [1, 5]
    assert CheckpointStore(str(out / "ckpt"), out / "cache").candidates() == ["step-00000005"]


# --- 1 rank in this process: host syncs, NaN ------------------------------------------------


def _context(tmp_path: Path, on_engine: Callable[[TrainEngine], None], clock: Callable[[], float]) -> RunContext:
    return one_rank_context(tmp_path, on_engine=on_engine, clock=clock)


# The trainer's own reads of tensors on the host. Not switchyard.train.data: its sampler
# indexes a host tensor by design, never a device one.
_SYNCS = ("item", "tolist", "cpu", "numpy", "__float__", "__int__", "__bool__")


def test_host_syncs_happen_on_log_and_check_steps_only(
    tmp_path: Path, one_rank_group: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    syncs = [0]
    step_starts: list[int] = []

    def counting(name: str) -> Any:
        original = getattr(torch.Tensor, name)

        def wrapper(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            caller = sys._getframe(1).f_globals.get("__name__", "")
            if caller.startswith("switchyard.") and caller != "switchyard.train.data":
                syncs[0] += 1
            return original(self, *args, **kwargs)

        return wrapper

    for name in _SYNCS:
        monkeypatch.setattr(torch.Tensor, name, counting(name))

    def on_engine(engine: TrainEngine) -> None:
        step = engine.train_step

        def counted(*args: Any) -> StepOutput:
            step_starts.append(syncs[0])
            return step(*args)

        engine.train_step = counted  # type: ignore[method-assign]

    spec = tiny_spec("syncs", steps=10, num_workers=1, log_every_steps=5, preempt_check_s=30)
    trainer = Trainer(spec, _context(tmp_path, on_engine, clock=lambda: float(len(step_starts))))
    result = trainer.run()
    per_step = [b - a for a, b in zip(step_starts, [*step_starts[1:], syncs[0]], strict=True)]
    # Step 1: the first preemption check; 5 and 10: the log lines (the final save needs none:
    # step 10 is synced already). Before this change: 2 per step (loss and preemption flag).
    assert per_step == [1, 0, 0, 0, 1, 0, 0, 0, 0, 1], per_step
    assert len(result.losses) == 10 and all(math.isfinite(x) for x in result.losses)


def test_a_nan_loss_stops_the_run_naming_the_step_and_the_last_good_checkpoint(
    tmp_path: Path, one_rank_group: None
) -> None:
    """NaN at step 9; log lines at 4 and 8, checkpoints due at 5 and 10. The sync before the
    save at 10 finds it: the run stops, and no checkpoint holds the non-finite state."""

    def on_engine(engine: TrainEngine) -> None:
        step = engine.train_step
        calls = [0]

        def poisoned(*args: Any) -> StepOutput:
            calls[0] += 1
            out = step(*args)
            return out._replace(loss=out.loss * math.nan) if calls[0] == 9 else out

        engine.train_step = poisoned  # type: ignore[method-assign]

    spec = tiny_spec("nan", steps=12, num_workers=1, log_every_steps=4, **{"checkpoint.every_steps": 5})
    with pytest.raises(NonFiniteLossError, match=r"loss is nan at step 9; .*step-00000005") as caught:
        Trainer(spec, _context(tmp_path, on_engine, clock=lambda: 0.0)).run()
    assert caught.value.step == 9
    assert CheckpointStore(str(tmp_path / "ckpt"), tmp_path / "cache").candidates() == ["step-00000005"]


# --- switchyard train plot ------------------------------------------------------------------


def test_plot_writes_a_png_from_the_runs_metrics(
    two_ranks: tuple[Path, list[dict[str, Any]]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, _ = two_ranks
    assert main(["train", "plot", str(out / "logged"), "--out", str(tmp_path / "curve.png")]) == 0
    png = (tmp_path / "curve.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 5000
    assert capsys.readouterr().out.strip() == str(tmp_path / "curve.png")


def test_plot_fails_in_one_line_on_a_missing_or_empty_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "plot", str(tmp_path / "run")]) == 2
    missing = tmp_path / "run" / METRICS_FILE
    err = capsys.readouterr().err
    assert err == f"switchyard: error: {missing}: no metrics file (a run writes one at its first log step)\n"
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / METRICS_FILE).write_text("\n")
    assert main(["train", "plot", "run", "--state-dir", str(tmp_path / "state")]) == 2  # a job name: not there
    assert "state/train/checkpoints/run/metrics.jsonl: no metrics file" in capsys.readouterr().err
    assert main(["train", "plot", str(tmp_path / "run")]) == 2
    assert capsys.readouterr().err.strip().endswith("metrics.jsonl: the metrics file is empty")
