"""Validation loss on a held-back split: the split (disjoint from training, fixed by the
seed), and on 2 gloo ranks the logged value against a hand computation on the trained weights."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import _workers
import pytest
import torch
from _workers import tiny_spec
from test_train_metrics import _event_tags

from switchyard.train.data import TokenBatches
from switchyard.train.launch import spawn_group
from switchyard.train.metrics_log import METRICS_FILE, read_metrics
from switchyard.train.metrics_plot import plot_metrics
from switchyard.train.validation import HeldBackLoss, split_windows, training_and_held_back

SEQ = 8


def _window_ids(batches: TokenBatches, n: int) -> list[int]:
    """The windows `n` micro-batches read: with tokens = arange, a row's first token is its
    window's index x seq_len."""
    return [int(row[0]) // SEQ for _ in range(n) for row in batches.next_batch()[0]]


def test_training_never_reads_the_held_back_windows_and_the_split_depends_on_the_seed_alone() -> None:
    tokens = torch.arange(100 * SEQ + 1)
    split = split_windows(100, 12, seed=3)
    assert torch.equal(split.held_back, split_windows(100, 12, seed=3).held_back)
    assert not torch.equal(split.held_back, split_windows(100, 12, seed=4).held_back)
    held_back = set(split.held_back.tolist())
    assert len(held_back) == 12 and held_back.isdisjoint(split.train.tolist())
    assert sorted(held_back | set(split.train.tolist())) == list(range(100))
    # What the trainer builds on each of 2 ranks (`training_and_held_back`).
    spec = tiny_spec(seed=3, **{"data.seq_len": SEQ, "validation.every_steps": 2, "validation.sequences": 12})
    read, evaluated = [], []
    for rank in (0, 1):
        batches, validation = training_and_held_back(tokens, spec, rank, 2, torch.device("cpu"))
        assert validation is not None
        read += _window_ids(batches, 44)  # two epochs of the 88 training windows over 2 ranks
        evaluated += [int(x[i, 0]) // SEQ for x, _ in validation.batches for i in range(len(x))]
    assert evaluated == split.held_back.tolist()  # equal contiguous shares, in order
    assert held_back.isdisjoint(read)
    assert sorted(read) == sorted(split.train.tolist() * 2)  # each training window once per epoch
    # Without validation, every window, in the order training always had (the same numbers).
    plain, off = (
        TokenBatches(tokens, SEQ, 2, 0, 2, seed=3),
        training_and_held_back(tokens, spec.with_changes(**{"validation.every_steps": 0}), 0, 2, torch.device("cpu")),
    )
    assert off[1] is None and _window_ids(off[0], 30) == _window_ids(plain, 30)


def test_an_uneven_share_is_refused() -> None:
    tokens = torch.arange(100 * SEQ + 1)
    held_back = split_windows(100, 8, seed=0).held_back
    shares = [HeldBackLoss(tokens, held_back, SEQ, 2, r, 2, torch.device("cpu")) for r in (0, 1)]
    assert [len(s.batches) for s in shares] == [2, 2] and shares[0].tokens == 8 * SEQ
    with pytest.raises(ValueError, match=r"validation\.sequences \(8\) must be a multiple of the ranks \(2\) x"):
        HeldBackLoss(tokens, held_back, SEQ, 3, 0, 2, torch.device("cpu"))
    with pytest.raises(ValueError, match=r"validation\.sequences \(100\) must be fewer than"):
        split_windows(100, 100, seed=0)


@pytest.fixture(scope="module")
def validated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    out = tmp_path_factory.mktemp("validation")
    spec = tiny_spec(
        "val",
        steps=8,
        log_every_steps=3,
        **{"parallel.strategy": "fsdp-full", "validation.every_steps": 4, "validation.sequences": 16},
    )
    spawn_group(_workers.validation_run, 2, spec.model_dump_json(), str(out), finished=(out / "result.json").is_file)
    return out, json.loads((out / "result.json").read_text())


def test_validation_loss_is_the_mean_over_the_held_back_tokens_on_the_trained_weights(
    validated: tuple[Path, dict[str, Any]],
) -> None:
    out, result = validated
    # fsdp-full, 2 ranks, 8 sequences each, all-reduced once: the plain model's mean, to float rounding.
    assert result["val_loss"] == pytest.approx(result["by_hand"], rel=1e-5)
    rows = [json.loads(line) for line in (out / "ckpt" / METRICS_FILE).read_text().splitlines()]
    # A line at every log step (3, 6) and every validation step (4, 8, the last).
    assert [(r["step"], r["val_loss"] is not None) for r in rows] == [(3, False), (4, True), (6, False), (8, True)]
    assert rows[-1]["val_loss"] == result["val_loss"]
    assert rows[-1]["val_loss"] < rows[1]["val_loss"] - 0.1  # it learns what it never trained on
    assert rows[1]["val_loss"] < 5.5  # below the untrained loss (about ln 257 = 5.55)
    events = list((out / "ckpt" / "tensorboard").glob("events.out.tfevents.*"))
    assert "train/val_loss" in _event_tags(events[0])
    figure = plot_metrics(read_metrics(out / "ckpt" / METRICS_FILE).rows, out / "metrics.png", "val")  # draws val_loss
    assert figure.read_bytes().startswith(b"\x89PNG")
