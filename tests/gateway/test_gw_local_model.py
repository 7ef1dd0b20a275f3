"""The local model: newest complete checkpoint whose files are as saved, else the seeded
initialisation; OpenAI-shaped."""

from __future__ import annotations

import json
import tempfile
import warnings
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from switchyard.gateway.local_model import LocalChatModel, newest_checkpoint
from switchyard.models import GPT, GPTConfig
from switchyard.train.checkpoint import MANIFEST, build_manifest, file_table
from tests.examples import examples
from tests.mutations import mutate

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
    if finished:  # a folder without a manifest is a save that did not finish (written last, as the trainer does)
        manifest = build_manifest(file_table(folder), step=step, fmt="dcp", world_size=1)
        (folder / MANIFEST).write_text(json.dumps(manifest))


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


def _weights_of(model: LocalChatModel, saved: GPT) -> bool:
    return all(
        torch.equal(a, b) for a, b in zip(model.model.state_dict().values(), saved.state_dict().values(), strict=True)
    )


def test_a_torn_or_corrupt_newest_checkpoint_is_passed_over_for_the_one_before(tmp_path: Path) -> None:
    """A `manifest.json` that is not JSON made the replica fail to start (and, once a replica
    ran, every refresh raise into a chat request); a changed byte in a data file was loaded and
    served as that step's weights. Both are passed over: the one before serves, exactly."""
    torch.manual_seed(5)
    old, new = GPT(GPTConfig.preset("tiny")), GPT(GPTConfig.preset("tiny"))
    _save(tmp_path, 1, old)
    _save(tmp_path, 2, new)
    manifest = tmp_path / "step-00000002" / MANIFEST
    good = manifest.read_text()
    manifest.write_text(good[: len(good) // 2])
    model = LocalChatModel(tmp_path)
    assert model.loaded.model_version.endswith("@step-00000001") and _weights_of(model, old)
    assert model.refresh() is False and model.chat(REQUEST)["model"].endswith("@step-00000001")

    manifest.write_text(good)
    data = next((tmp_path / "step-00000002").glob("*.distcp"))
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0x40
    data.write_bytes(bytes(raw))
    fresh = LocalChatModel(tmp_path)
    assert fresh.loaded.model_version.endswith("@step-00000001") and _weights_of(fresh, old)


def test_refresh_never_goes_back_to_an_older_checkpoint(tmp_path: Path) -> None:
    """The serving folder pruned by its job and the newer one damaged: it keeps serving."""
    torch.manual_seed(9)
    served = GPT(GPTConfig.preset("tiny"))
    for step in (5, 10):
        _save(tmp_path, step, served)
    model = LocalChatModel(tmp_path)
    assert model.loaded.model_version.endswith("@step-00000010")
    _save(tmp_path, 20, served)
    (tmp_path / "step-00000020" / MANIFEST).write_text("{}")
    for path in sorted((tmp_path / "step-00000010").iterdir()):
        path.unlink()
    (tmp_path / "step-00000010").rmdir()
    assert model.refresh() is False and model.loaded.model_version.endswith("@step-00000010")


def _damage(folder: Path, data: st.DataObject) -> str:
    """One drawn damage to a finished checkpoint folder: its manifest changed (see
    `tests/mutations.py`), or a byte of one file changed, the file cut short or deleted."""
    files = sorted(p for p in folder.iterdir() if p.is_file())
    target = data.draw(st.sampled_from(files), label="file")
    how = data.draw(st.sampled_from(["mutate", "flip", "cut", "delete"]), label="damage")
    raw = target.read_bytes()
    if how == "mutate" and target.name == MANIFEST:
        doc, change = mutate(json.loads(raw), data.draw)
        target.write_text(json.dumps(doc))
        return change
    if how == "delete":
        target.unlink()
        return f"{target.name} deleted"
    if how == "cut" or not raw:
        target.write_bytes(raw[: data.draw(st.integers(0, max(0, len(raw) - 1)))])
        return f"{target.name} cut short"
    at = data.draw(st.integers(0, len(raw) - 1), label="byte")
    target.write_bytes(raw[:at] + bytes([raw[at] ^ data.draw(st.integers(1, 255))]) + raw[at + 1 :])
    return f"byte {at} of {target.name} changed"


@settings(max_examples=examples(25), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_a_damaged_newest_checkpoint_never_serves_other_weights(data: st.DataObject) -> None:
    """Whatever one damage did to the newest checkpoint, the model starts and serves exactly
    the weights of a checkpoint as saved: the newest when the damage changed nothing it loads
    (a manifest key it does not read), else the one before."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        torch.manual_seed(data.draw(st.integers(0, 1000), label="seed"))
        old, new = GPT(GPTConfig.preset("tiny")), GPT(GPTConfig.preset("tiny"))
        _save(root, 1, old)
        _save(root, 2, new)
        change = _damage(root / "step-00000002", data)
        model = LocalChatModel(root)
        served = model.loaded.model_version.rpartition("@")[2]
        event(f"serves {served}")
        assert served in ("step-00000001", "step-00000002"), f"{change}: serves {served}"
        assert _weights_of(model, new if served == "step-00000002" else old), f"{change}: other weights served"
        assert model.chat(REQUEST)["model"].endswith(served)
