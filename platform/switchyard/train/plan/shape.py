"""The shape of a transformer as the planner sees it: dimensions in, parameter counts out.

One dataclass covers both families the platform meets: GPT-2 style (LayerNorm with bias,
fused biased projections, learned positions, a GELU MLP, tied embeddings) and Llama style
(RMSNorm, no biases, rotary positions, grouped-query attention, a SwiGLU MLP).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from switchyard.train.plan.errors import PlanError
from switchyard.train.strategy import WrapGranularity


class Norm(StrEnum):
    LAYERNORM = "layernorm"  # weight and bias: 2h parameters
    RMSNORM = "rmsnorm"  # weight only: h parameters


MAX_LAYERS = 10_000
"""The deepest model the planner takes: it traces each layer's modules as DeepSpeed gathers them
(`zero3.module_trace`), and the deepest transformers have a few hundred layers. Before stop 44,
`switchyard plan --layers 1000000000` used all the machine's memory (24 GB) until it was killed."""


@dataclass(frozen=True)
class ModelShape:
    """Dimensions of a decoder-only transformer."""

    layers: int
    """Transformer blocks (L)."""
    hidden: int
    """Width of the residual stream (h)."""
    heads: int
    """Query heads (a)."""
    kv_heads: int
    """Key/value heads; fewer than `heads` is grouped-query attention."""
    ffn: int
    """Inner width of the MLP (f)."""
    vocab: int
    """Vocabulary size (V)."""
    gated_ffn: bool = True
    """SwiGLU: three hxf matrices (gate, up, down); otherwise two (up, down)."""
    bias: bool = False
    """Linear layers carry biases (GPT-2) or not (Llama)."""
    norm: Norm = Norm.RMSNORM
    tied_embeddings: bool = False
    """The output projection reuses the token embedding matrix."""
    positions: int = 0
    """Rows of a learned position embedding; 0 for rotary embeddings (no parameters)."""
    dropout: bool = False
    """Dropout layers are active, so their 1-byte masks are kept for backward."""
    fused_qkv: bool = False
    """q, k and v come from one linear layer (GPT-2), which is then one FSDP unit under
    `layer` wrapping and one module to DeepSpeed."""

    def __post_init__(self) -> None:
        for name in ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise PlanError(f"model.{name} must be a positive integer, got {value!r}")
        if self.layers > MAX_LAYERS:
            raise PlanError(f"model.layers must be at most {MAX_LAYERS:,}, got {self.layers:,}")
        if self.positions < 0:
            raise PlanError(f"model.positions must be >= 0, got {self.positions!r}")
        if self.hidden % self.heads:
            raise PlanError(f"model.hidden ({self.hidden}) must be divisible by model.heads ({self.heads})")
        if self.heads % self.kv_heads:
            raise PlanError(f"model.heads ({self.heads}) must be divisible by model.kv_heads ({self.kv_heads})")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_width(self) -> int:
        """Output width of the k (and of the v) projection: kv_heads * head_dim."""
        return self.kv_heads * self.head_dim

    @property
    def norm_params(self) -> int:
        return 2 * self.hidden if self.norm is Norm.LAYERNORM else self.hidden

    def attention_params(self) -> int:
        h, kv = self.hidden, self.kv_width
        weights = h * h + 2 * h * kv + h * h  # q, k, v (GQA: kv wide), output projection
        biases = (h + 2 * kv + h) if self.bias else 0
        return weights + biases

    def ffn_params(self) -> int:
        h, f = self.hidden, self.ffn
        if self.gated_ffn:
            return 3 * h * f + ((2 * f + h) if self.bias else 0)
        return 2 * h * f + ((f + h) if self.bias else 0)

    def block_params(self) -> int:
        return self.attention_params() + self.ffn_params() + 2 * self.norm_params

    def embedding_params(self) -> int:
        return self.vocab * self.hidden + self.positions * self.hidden

    def head_params(self) -> int:
        """Final norm plus the output projection (none of its own when tied)."""
        return self.norm_params + (0 if self.tied_embeddings else self.vocab * self.hidden)

    def total_params(self) -> int:
        return self.embedding_params() + self.layers * self.block_params() + self.head_params()

    def matmul_params(self) -> int:
        """Parameters that take part in a matmul per token (6·Ψ FLOPs): all but lookups."""
        lm_head = self.vocab * self.hidden
        return self.layers * self.block_params() + lm_head

    def linear_params(self) -> list[int]:
        """Parameters of each distinct linear layer inside one block."""
        h, f, kv = self.hidden, self.ffn, self.kv_width
        b = self.bias
        qkv = (
            [h * (h + 2 * kv) + ((h + 2 * kv) if b else 0)]
            if self.fused_qkv
            else [h * h + (h if b else 0), h * kv + (kv if b else 0)]
        )
        return [*qkv, h * h + (h if b else 0), h * f + (f if b else 0), f * h + (h if b else 0)]

    def largest_module_params(self) -> int:
        """The largest single leaf module (DeepSpeed's `largest_layer_params`)."""
        return max(self.vocab * self.hidden, *self.linear_params())

    def fsdp_units(self, wrap: WrapGranularity) -> Units:
        """FSDP units as switchyard's trainer wraps them: each block (or each linear inside
        blocks) is a unit, and the root owns whatever they do not (embeddings, norms, head)."""
        root = self.fsdp_root_params(wrap)
        if wrap is WrapGranularity.ROOT:
            return Units(largest=root, prefetched=0)
        inner = self.block_params() if wrap is WrapGranularity.BLOCK else max(self.linear_params())
        return Units(largest=max(root, inner), prefetched=inner)

    def fsdp_root_params(self, wrap: WrapGranularity) -> int:
        """What the root unit owns: everything no inner unit does (embeddings, norms, head)."""
        total = self.total_params()
        if wrap is WrapGranularity.ROOT:
            return total
        if wrap is WrapGranularity.BLOCK:
            return total - self.layers * self.block_params()
        return total - self.layers * (self.attention_params() + self.ffn_params())

    def fsdp_backward_gather(self, wrap: WrapGranularity) -> int:
        """Parameters FULL_SHARD gathers again in backward, as the trainer wraps them: every
        inner unit but the last, which is not resharded after forward (backward needs it
        first), and not the root, which FSDP2 never reshards after forward."""
        if wrap is WrapGranularity.ROOT:
            return 0
        if wrap is WrapGranularity.BLOCK:
            return (self.layers - 1) * self.block_params()
        per_block = self.attention_params() + self.ffn_params()
        return self.layers * per_block - self.linear_params()[-1]  # the last block's down projection

    def fsdp_unit_count(self, wrap: WrapGranularity) -> int:
        """FSDP units, the root included: one collective each per gather or reduction."""
        if wrap is WrapGranularity.ROOT:
            return 1
        linears = (1 if self.fused_qkv else 3) + 1 + (3 if self.gated_ffn else 2)  # q/k/v, output, MLP
        per_block = 1 if wrap is WrapGranularity.BLOCK else linears
        return self.layers * per_block + 1

    def deepspeed_units(self) -> Units:
        """ZeRO-3 gathers module by module, so its unit is the largest module."""
        largest = self.largest_module_params()
        return Units(largest=largest, prefetched=largest)


@dataclass(frozen=True)
class Units:
    """The parameters gathered at once by FSDP or ZeRO-3."""

    largest: int
    """The largest unit (U)."""
    prefetched: int
    """The largest unit that can be gathered ahead while another computes (U_p); 0 when the
    root is the only unit."""
