"""The shape of a GPT-style model: one frozen dataclass, with named presets from tiny to 1B+.

The trainer, the gateway's local model and the planner all read a `GPTConfig`, so a size
named in a job spec means the same tensor shapes everywhere.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any


@dataclass(frozen=True)
class GPTConfig:
    """Hyper-parameters of the decoder-only transformer in `switchyard.models.gpt`."""

    vocab_size: int = 257
    """Token ids are bytes 0..255 plus one end-of-text id (see `ByteTokenizer`)."""
    n_layer: int = 2
    """Number of transformer blocks."""
    n_head: int = 2
    """Attention heads per block; must divide `d_model`."""
    d_model: int = 64
    """Width of the residual stream."""
    max_seq_len: int = 128
    """Longest sequence the learned position embedding covers."""
    mlp_ratio: int = 4
    """Hidden width of the MLP as a multiple of `d_model`."""
    dropout: float = 0.0
    """Dropout after attention and MLP; 0 keeps CPU runs bit-for-bit reproducible."""
    tie_embeddings: bool = True
    """Share the token embedding with the output projection (GPT-2 style)."""

    def __post_init__(self) -> None:
        for name in ("vocab_size", "n_layer", "n_head", "d_model", "max_seq_len", "mlp_ratio"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"GPTConfig.{name} must be a positive integer, got {value!r}")
        if self.d_model % self.n_head != 0:
            raise ValueError(f"GPTConfig.d_model ({self.d_model}) must be divisible by n_head ({self.n_head})")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"GPTConfig.dropout must be in [0, 1), got {self.dropout!r}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head

    def num_parameters(self) -> int:
        """Exact parameter count of `GPT(self)` (the planner uses this without building it)."""
        d, hidden = self.d_model, self.d_model * self.mlp_ratio
        block = (
            2 * 2 * d  # two LayerNorms, weight and bias
            + d * 3 * d
            + 3 * d  # fused q, k, v projection
            + d * d
            + d  # attention output projection
            + d * hidden
            + hidden  # MLP up
            + hidden * d
            + d  # MLP down
        )
        embeddings = self.vocab_size * d + self.max_seq_len * d
        head = 0 if self.tie_embeddings else self.vocab_size * d
        return embeddings + self.n_layer * block + 2 * d + head

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GPTConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"GPTConfig: unknown field(s) {unknown}; known: {sorted(known)}")
        return cls(**data)

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> GPTConfig:
        """A named size; `overrides` replace single fields (e.g. `max_seq_len=64`)."""
        try:
            base = PRESETS[name]
        except KeyError:
            raise ValueError(f"unknown model preset {name!r}; known presets: {', '.join(PRESETS)}") from None
        return cls.from_dict({**base, **overrides})


# Sizes by name. Parameter counts (tied embeddings) are in the comments; `num_parameters()`
# is the source of truth and tests check these against a built model.
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": {"n_layer": 2, "n_head": 2, "d_model": 64, "max_seq_len": 128},  # 0.12M
    "small": {"n_layer": 4, "n_head": 4, "d_model": 256, "max_seq_len": 256},  # 3.3M
    "medium": {"n_layer": 8, "n_head": 8, "d_model": 512, "max_seq_len": 512},  # 25.6M
    "large": {"n_layer": 12, "n_head": 12, "d_model": 768, "max_seq_len": 1024},  # 86M (GPT-2 small shape)
    "xl": {"n_layer": 24, "n_head": 16, "d_model": 1024, "max_seq_len": 1024},  # 304M
    "1b": {"n_layer": 24, "n_head": 16, "d_model": 1856, "max_seq_len": 2048},  # 0.997B
    "3b": {"n_layer": 32, "n_head": 32, "d_model": 2816, "max_seq_len": 2048},  # 3.05B
}
