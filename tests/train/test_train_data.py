from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import one_rank_context

from switchyard.train.data import (
    TokenBatches,
    load_tokens,
    read_token_shards,
    synthetic_corpus,
    write_token_shards,
)
from switchyard.train.loop import Trainer
from tests.train._workers import tiny_spec


def test_synthetic_corpus_is_deterministic_and_sized() -> None:
    assert synthetic_corpus(5000, seed=1) == synthetic_corpus(5000, seed=1)
    assert synthetic_corpus(5000, seed=1) != synthetic_corpus(5000, seed=2)
    assert len(synthetic_corpus(5000)) == 5000


def test_shards_round_trip_full_uint16_range(tmp_path: Path) -> None:
    tokens = torch.tensor([0, 1, 255, 256, 40000, 65535] * 7)
    paths = write_token_shards(tokens, tmp_path, shard_tokens=10)
    assert len(paths) == 5
    assert torch.equal(read_token_shards(paths), tokens)
    loaded = load_tokens(str(tmp_path), synthetic_bytes=0, seed=0, cache_dir=tmp_path / "c", vocab_size=None)
    assert torch.equal(loaded, tokens)


def test_bad_source_and_odd_shard_are_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"data\.source 'nowhere'"):
        load_tokens("nowhere", synthetic_bytes=0, seed=0, cache_dir=tmp_path, vocab_size=257)
    odd = tmp_path / "odd.bin"
    odd.write_bytes(b"abc")
    with pytest.raises(ValueError, match=r"odd\.bin"):
        read_token_shards([odd])


def test_a_token_past_the_vocabulary_is_named_before_training(tmp_path: Path) -> None:
    """Shards tokenized for a larger vocabulary trained until a batch sampled the stray id,
    then failed in the embedding with `IndexError: index out of range in self` (on a GPU, a
    device-side assert), naming neither the shard nor the vocabulary."""
    tokens = torch.randint(0, 257, (3000,))
    tokens[2345] = 4000
    paths = write_token_shards(tokens, tmp_path / "data", shard_tokens=1000)
    stray = r"shard-00002\.bin: token 345 is id 4000, outside the model's vocabulary of 257"
    with pytest.raises(ValueError, match=stray):
        load_tokens(str(tmp_path / "data"), synthetic_bytes=0, seed=0, cache_dir=tmp_path / "c", vocab_size=257)
    assert torch.equal(read_token_shards(paths, vocab_size=4001), tokens)
    with pytest.raises(ValueError, match=r"data.source synthetic \(byte tokens\): .* vocabulary of 100 ids"):
        load_tokens("synthetic", synthetic_bytes=5000, seed=0, cache_dir=tmp_path / "c", vocab_size=100)


def test_a_job_on_data_of_another_vocabulary_fails_before_its_first_step(tmp_path: Path, one_rank_group: None) -> None:
    tokens = torch.randint(0, 257, (20000,))
    tokens[::50] = 4000
    write_token_shards(tokens, tmp_path / "data", shard_tokens=5000)
    spec = tiny_spec("vocab", steps=3, num_workers=1, **{"data.source": str(tmp_path / "data")})
    context = one_rank_context(tmp_path, "vocab")
    with pytest.raises(ValueError, match=r"shard-00000\.bin: token 0 is id 4000, outside the model's vocabulary"):
        Trainer(spec, context).run()
    assert not (tmp_path / "ckpt").exists() or not list((tmp_path / "ckpt").iterdir())


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


def _epoch_order_batch(n_windows: int, seed: int, epoch: int, start: int, size: int) -> list[int]:
    """The window ids the documented order puts at `start`: randperm over (seed, epoch)."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(n_windows, generator=g)[start : start + size].tolist()


@pytest.mark.parametrize("corpus_tokens", [1_001, 200_001])
def test_the_corpus_is_permuted_once_per_epoch_not_per_batch(
    corpus_tokens: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One permutation per epoch, however large the corpus: 20 micro-batches of a 100-window
    corpus cross one epoch boundary (two permutations); of a 20,000-window one, none (one).
    Drawing one per micro-batch, as before, made each batch cost O(corpus)."""
    drawn: list[int] = []
    randperm = torch.randperm

    def counting(n: int, **kwargs: object) -> torch.Tensor:
        drawn.append(n)
        return randperm(n, **kwargs)  # type: ignore[call-overload,no-any-return]

    monkeypatch.setattr(torch, "randperm", counting)
    n_windows = (corpus_tokens - 1) // 10
    batches = TokenBatches(torch.arange(corpus_tokens), 10, 3, 0, 2, 0)
    for _ in range(20):
        batches.next_batch()
    assert drawn == [n_windows] * (2 if corpus_tokens == 1_001 else 1)


def test_batches_follow_the_seeded_epoch_order_and_resume_mid_epoch() -> None:
    """The order is unchanged by drawing it once: window ids at each step are randperm's over
    (seed, epoch), sliced by cursor and rank. A run restored at step 19 (epoch 1) from a
    sampler that had drawn epoch 0's order reads the same next batch as the uninterrupted one."""
    a = _batches(1)
    cursor, epoch = 0, 0
    for _ in range(19):  # 99 windows, 6 per step: epoch 0 is steps 0-15
        if cursor + 6 > 99:
            cursor, epoch = 0, epoch + 1
        x, _ = a.next_batch()
        assert [v // 10 for v in x[:, 0].tolist()] == _epoch_order_batch(99, 0, epoch, cursor + 3, 3)
        cursor += 6
    b = _batches(1)
    b.next_batch()  # holds epoch 0's order when the state is loaded
    b.load_state_dict(a.state_dict())
    assert a.epoch == b.epoch == 1
    for _ in range(3):
        assert torch.equal(a.next_batch()[0], b.next_batch()[0])
