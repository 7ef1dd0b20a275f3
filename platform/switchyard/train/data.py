"""Training tokens and the order they are read in.

Tokens come from a generated corpus (no download), a local directory of uint16 shards, or
an `s3://` prefix of shards (downloaded once into a cache). `TokenBatches` hands each rank
its slice of every global batch and is `Stateful`, so a resumed run reads exactly the
batches an uninterrupted one would.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from switchyard.models import ByteTokenizer
from switchyard.train.engine import Batch
from switchyard.train.job_errors import JobInputError
from switchyard.train.storage import download_prefix, is_s3_uri

_WORDS = [
    "the",
    "a",
    "one",
    "every",
    "some",
    "model",
    "data",
    "token",
    "rank",
    "shard",
    "gradient",
    "step",
    "loss",
    "cluster",
    "node",
    "job",
    "team",
    "queue",
    "budget",
    "train",
    "serve",
    "gather",
    "reduce",
    "scatter",
    "check",
    "point",
    "memory",
    "stream",
    "copy",
    "fast",
    "slow",
    "large",
    "small",
    "first",
    "last",
    "runs",
    "holds",
    "sends",
    "keeps",
    "waits",
    "saves",
    "loads",
    "splits",
]


def synthetic_corpus(n_bytes: int, seed: int = 0) -> str:
    """Deterministic pseudo-English with learnable structure (word choice depends on the
    previous word), so the loss of a tiny model falls within a few steps."""
    rng = random.Random(seed)
    successors = {w: rng.sample(_WORDS, 4) for w in _WORDS}
    word, parts, size = rng.choice(_WORDS), [], 0
    while size < n_bytes:
        sentence = [word]
        for _ in range(rng.randint(4, 10)):
            word = rng.choice(successors[word])
            sentence.append(word)
        text = " ".join(sentence).capitalize() + ". "
        parts.append(text)
        size += len(text)
        word = rng.choice(_WORDS)
    return "".join(parts)[:n_bytes]


def write_token_shards(tokens: Tensor, out_dir: Path, shard_tokens: int) -> list[Path]:
    """Write tokens as little-endian uint16 `shard-NNNNN.bin` files (the pre-tokenized format)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, start in enumerate(range(0, tokens.numel(), shard_tokens)):
        chunk = tokens[start : start + shard_tokens].to(torch.int32).to(torch.int16)
        path = out_dir / f"shard-{i:05d}.bin"
        path.write_bytes(bytes(chunk.untyped_storage()))
        paths.append(path)
    return paths


class DataSourceError(JobInputError, ValueError):
    """`data.source` names nothing, or data that cannot be trained on; the message says which."""


def _check_vocabulary(tokens: Tensor, vocab_size: int | None, where: str) -> Tensor:
    """`tokens`, once every id is one the model embeds. An id past the vocabulary fails deep
    in the first forward that samples it (`IndexError: index out of range in self` on CPU, a
    device-side assert on a GPU), possibly hours into the run: named here, before training."""
    if vocab_size is None or tokens.numel() == 0:
        return tokens
    largest = int(tokens.max())
    if largest >= vocab_size:
        at = int((tokens >= vocab_size).nonzero()[0])
        raise DataSourceError(
            f"{where}: token {at} is id {int(tokens[at])}, outside the model's vocabulary of {vocab_size} "
            f"ids (model.vocab_size; the largest id here is {largest}): tokenized for another model?"
        )
    return tokens


def read_token_shards(paths: list[Path], vocab_size: int | None = None) -> Tensor:
    """Every shard's uint16 tokens, in name order; with `vocab_size`, each id checked against it."""
    if not paths:
        raise DataSourceError("no token shards (*.bin) found")
    parts = []
    for path in sorted(paths):
        raw = bytearray(path.read_bytes())
        if len(raw) % 2:
            raise DataSourceError(f"{path}: size {len(raw)} is not a whole number of uint16 tokens")
        # int16 view then mask: torch has no general uint16 arithmetic on CPU.
        shard = torch.frombuffer(raw, dtype=torch.int16).to(torch.int64) & 0xFFFF
        parts.append(_check_vocabulary(shard, vocab_size, str(path)))
    return torch.cat(parts)


def load_tokens(source: str, *, synthetic_bytes: int, seed: int, cache_dir: Path, vocab_size: int | None) -> Tensor:
    """All training tokens as one int64 tensor, every id below `vocab_size` (None: unchecked)."""
    if source == "synthetic":
        text = synthetic_corpus(synthetic_bytes, seed)
        ids = torch.tensor(ByteTokenizer().encode(text), dtype=torch.int64)
        return _check_vocabulary(ids, vocab_size, "data.source synthetic (byte tokens)")
    path = Path(source)
    if is_s3_uri(source):
        try:
            path = download_prefix(source, cache_dir / "data")
        except FileNotFoundError as exc:
            raise DataSourceError(f"data.source: {exc}") from None
    elif path.is_file():
        return read_token_shards([path], vocab_size)
    elif not path.is_dir():
        raise DataSourceError(f"data.source {source!r}: not 'synthetic', an s3:// URI or an existing path")
    shards = sorted(path.rglob("*.bin"))
    if not shards:
        raise DataSourceError(f"data.source {source!r}: no token shards (*.bin) in it")
    return read_token_shards(shards, vocab_size)


def window_count(tokens: Tensor, seq_len: int) -> int:
    """Windows of `seq_len + 1` tokens (inputs and shifted targets) the corpus holds."""
    return int(tokens.numel() - 1) // seq_len


def window_rows(tokens: Tensor, ids: Tensor, seq_len: int) -> Batch:
    """(inputs, targets) of the windows `ids`, each (len(ids), seq_len)."""
    offsets = ids * seq_len
    rows = torch.stack([tokens[o : o + seq_len + 1] for o in offsets.tolist()])
    return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()


@dataclass
class TokenBatches:
    """Windows of `seq_len + 1` tokens, shuffled per epoch, split over ranks and micro-steps.

    Every rank computes the same permutation from (seed, epoch) and takes its own slice, so
    no rank needs to talk to another to agree on the data. The permutation is drawn once per
    epoch and kept: a micro-batch costs O(micro_batch x seq_len), whatever the corpus size.
    """

    tokens: Tensor
    seq_len: int
    micro_batch_size: int
    rank: int
    world_size: int
    seed: int
    epoch: int = 0
    cursor: int = 0  # windows of the global order already consumed
    windows: Tensor | None = field(default=None, repr=False, compare=False)
    """The window indices to read (the rest are held back for validation); None: all."""
    _order_of: tuple[tuple[int, int], Tensor] | None = field(default=None, init=False, repr=False, compare=False)
    """The last permutation drawn and the (seed, epoch) it was drawn for."""

    def __post_init__(self) -> None:
        self.n_windows = window_count(self.tokens, self.seq_len) if self.windows is None else self.windows.numel()
        per_step = self.micro_batch_size * self.world_size
        if self.n_windows < per_step:
            raise DataSourceError(
                f"corpus of {self.tokens.numel()} tokens has {self.n_windows} windows of "
                f"{self.seq_len}; one batch over {self.world_size} ranks needs {per_step}"
            )

    def _order(self) -> Tensor:
        key = (self.seed, self.epoch)
        if self._order_of is None or self._order_of[0] != key:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
            order = torch.randperm(self.n_windows, generator=g)
            self._order_of = (key, order if self.windows is None else self.windows[order])
        return self._order_of[1]

    def next_batch(self) -> Batch:
        """This rank's (inputs, targets) for the next micro-batch, each (micro_batch, seq_len)."""
        per_step = self.micro_batch_size * self.world_size
        if self.cursor + per_step > self.n_windows:
            self.epoch, self.cursor = self.epoch + 1, 0
        order = self._order()
        start = self.cursor + self.rank * self.micro_batch_size
        ids = order[start : start + self.micro_batch_size]
        self.cursor += per_step
        return window_rows(self.tokens, ids, self.seq_len)

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "cursor": self.cursor}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.cursor = int(state["epoch"]), int(state["cursor"])
