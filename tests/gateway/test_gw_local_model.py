"""The local model: newest complete checkpoint, else the seeded initialisation; OpenAI-shaped."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp

from switchyard.gateway.local_model import LocalChatModel, newest_checkpoint
from switchyard.models import GPT, GPTConfig

REQUEST = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 8, "temperature": 0}


def test_seeded_init_is_reproducible(tmp_path: Path) -> None:
    a, b = LocalChatModel(tmp_path / "none"), LocalChatModel(None)
    assert a.loaded.source == "seeded-init" and a.loaded.model_version == b.loaded.model_version
    ra, rb = a.chat(REQUEST), b.chat(REQUEST)
    assert ra["choices"][0]["message"]["content"] == rb["choices"][0]["message"]["content"]
    assert 0 < ra["usage"]["completion_tokens"] <= 8 and ra["object"] == "chat.completion"


def _save(root: Path, step: int, model: GPT, finished: bool = True) -> None:
    folder = root / f"step-{step:08d}"
    with warnings.catch_warnings():  # a single-process save, as intended
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.save({"model": model.state_dict()}, checkpoint_id=str(folder), no_dist=True)
    if finished:  # a folder without a manifest is a save that did not finish
        (folder / "manifest.json").write_text(json.dumps({"step": step}))


def test_newest_complete_checkpoint_wins(tmp_path: Path) -> None:
    torch.manual_seed(7)
    trained = GPT(GPTConfig.preset("tiny"))
    for step, finished in ((1, True), (2, True), (3, False)):
        _save(tmp_path, step, trained, finished)
    assert newest_checkpoint(tmp_path) == tmp_path / "step-00000002"
    model = LocalChatModel(tmp_path)
    assert model.loaded.source == "checkpoint" and model.loaded.model_version.endswith("@step-00000002")
    assert torch.equal(model.model.tok_emb.weight, trained.tok_emb.weight)


def test_unloadable_checkpoint_falls_back_to_seeded_init(tmp_path: Path) -> None:
    folder = tmp_path / "step-00000001"
    folder.mkdir()
    (folder / "manifest.json").write_text("{}")
    assert LocalChatModel(tmp_path).loaded.source == "seeded-init"


def test_refresh_serves_a_newer_checkpoint_and_keeps_a_good_one(tmp_path: Path) -> None:
    """A training job's later checkpoint reaches a running replica; a broken one does not
    replace what is serving."""
    model = LocalChatModel(tmp_path)
    assert model.loaded.source == "seeded-init" and model.refresh() is False
    torch.manual_seed(3)
    first = GPT(GPTConfig.preset("tiny"))
    _save(tmp_path, 10, first)
    assert model.refresh() is True and model.loaded.model_version.endswith("@step-00000010")
    assert torch.equal(model.model.tok_emb.weight, first.tok_emb.weight)
    assert model.refresh() is False  # nothing newer
    broken = tmp_path / "step-00000020"
    broken.mkdir()
    (broken / "manifest.json").write_text("{}")
    assert model.refresh() is False and model.loaded.model_version.endswith("@step-00000010")
    assert model.chat(REQUEST)["model"].endswith("@step-00000010")
