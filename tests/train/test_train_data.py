from __future__ import annotations

from pathlib import Path

import pytest
import torch

from switchyard.train.data import (
    TokenBatches,
    load_tokens,
    read_token_shards,
    synthetic_corpus,
    write_token_shards,
)


def test_synthetic_corpus_is_deterministic_and_sized() -> None:
    assert synthetic_corpus(5000, seed=1) == synthetic_corpus(5000, seed=1)
    assert synthetic_corpus(5000, seed=1) != synthetic_corpus(5000, seed=2)
    assert len(synthetic_corpus(5000)) == 5000


def test_shards_round_trip_full_uint16_range(tmp_path: Path) -> None:
    tokens = torch.tensor([0, 1, 255, 256, 40000, 65535] * 7)
    paths = write_token_shards(tokens, tmp_path, shard_tokens=10)
    assert len(paths) == 5
    assert torch.equal(read_token_shards(paths), tokens)
    assert torch.equal(load_tokens(str(tmp_path), synthetic_bytes=0, seed=0, cache_dir=tmp_path / "c"), tokens)


def test_bad_source_and_odd_shard_are_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"data\.source 'nowhere'"):
        load_tokens("nowhere", synthetic_bytes=0, seed=0, cache_dir=tmp_path)
    odd = tmp_path / "odd.bin"
    odd.write_bytes(b"abc")
    with pytest.raises(ValueError, match=r"odd\.bin"):
        read_token_shards([odd])


def _batches(rank: int, world: int = 2) -> TokenBatches:
    tokens = torch.arange(1000)
    return TokenBatches(tokens, seq_len=10, micro_batch_size=3, rank=rank, world_size=world, seed=0)


def test_ranks_get_disjoint_windows_and_targets_are_shifted() -> None:
    x0, y0 = _batches(0).next_batch()
    x1, _ = _batches(1).next_batch()
    assert torch.equal(y0[:, :-1], x0[:, 1:])
    assert not set(x0[:, 0].tolist()) & set(x1[:, 0].tolist())


def test_state_dict_resumes_the_exact_sequence_across_epochs() -> None:
    a = _batches(0)
    for _ in range(20):  # 99 windows, 6 per step: crosses an epoch boundary
        a.next_batch()
    b = _batches(0)
    b.load_state_dict(a.state_dict())
    for _ in range(25):
        assert torch.equal(a.next_batch()[0], b.next_batch()[0])
    assert a.epoch >= 1


def test_corpus_too_small_for_one_batch() -> None:
    with pytest.raises(ValueError, match="needs 6"):
        TokenBatches(torch.arange(50), 10, 3, 0, 2, 0)
