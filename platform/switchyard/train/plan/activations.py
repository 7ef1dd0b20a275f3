"""Activation memory per GPU, after Korthikanti et al. 2022 ("Reducing Activation
Recomputation in Large Transformer Models", section 4), generalised to GQA and SwiGLU.

For a GPT-3 block (MHA, f = 4h, dropout, 16-bit) the per-layer bytes reduce to the paper's
s·b·h·(34 + 5·a·s/h); tests check that. Terms per layer, with e bytes per activation
element (2 mixed, 4 fp32), s sequence, b micro-batch, h hidden, a heads, kv = kv_heads x
head_dim, f FFN width:
- attention: e·sbh (qkv input) + e·sb(h+2kv) (Q, K, V) + e·sbh (output-projection input)
  [+ sbh dropout mask]
- attention scores, materialised: e·as²b softmax [+ as²b mask + e·as²b dropout output];
  with flash attention instead 4·asb (fp32 log-sum-exp rows), the sxs matrix never exists
- MLP: e·sbh (input) + e·sbf x2 (activation input, down-projection input), or for SwiGLU
  e·sbf x4 (gate and up outputs, SiLU output, their product) [+ sbh dropout mask]
- two norms: 2·e·sbh (their inputs)
"""

from __future__ import annotations

from dataclasses import dataclass

from switchyard.train.plan.shape import ModelShape
from switchyard.train.plan.terms import ZERO, Term, count, gib
from switchyard.train.strategy import CheckpointMode


@dataclass(frozen=True)
class LayerActivations:
    """Bytes one block keeps for backward, split so each checkpointing mode can pick."""

    dense: float
    """Everything but the attention core's scores: kept under selective recompute."""
    scores: float
    """Softmax (and dropout) over axsxs, or flash attention's log-sum-exp rows."""
    dense_formula: str
    scores_formula: str
    matmul_outputs: float = 0.0
    """What op-level recompute keeps: the block input and every matmul's (and the attention
    kernel's) output; the norms, activation functions and products are recomputed."""
    matmul_formula: str = ""

    @property
    def full(self) -> float:
        return self.dense + self.scores


def layer_activations(shape: ModelShape, seq_len: int, micro_batch: int, e: int, flash: bool) -> LayerActivations:
    s, b, h, f, a = seq_len, micro_batch, shape.hidden, shape.ffn, shape.heads
    sb, drop = s * b, shape.dropout
    attn = e * (2 * h + h + 2 * shape.kv_width) + (h if drop else 0)
    mlp = e * h + e * f * (4 if shape.gated_ffn else 2) + (h if drop else 0)
    norms = 2 * e * h
    dense = sb * (attn + mlp + norms)
    mlp_f = f"{e}·sbh+{4 if shape.gated_ffn else 2}·{e}·sbf"
    dense_formula = (
        f"attention {e}·sb(3h+2kv){'+sbh' if drop else ''} + MLP {mlp_f}{'+sbh' if drop else ''} + norms 2·{e}·sbh"
    )
    if flash:
        scores: float = 4 * a * sb
        scores_formula = "flash log-sum-exp 4·asb"
    else:
        per = e + (1 + e if drop else 0)
        scores = per * a * s * sb
        scores_formula = f"scores {per}·as²b"
    # Block input, Q/K/V, attention output, output projection, MLP up (and gate), MLP down;
    # the attention kernel's own saved rows (log-sum-exp, or the scores of the math kernel).
    up = 2 if shape.gated_ffn else 1
    op_scores = 4 * a * sb if flash else e * a * s * sb
    matmul = sb * e * (h + (h + 2 * shape.kv_width) + h + h + up * f + h) + op_scores
    matmul_formula = f"{e}·sb(5h+2kv+{up}f) + {'4·asb' if flash else f'{e}·as²b'}"
    return LayerActivations(dense, scores, dense_formula, scores_formula, matmul, matmul_formula)


def checkpointed_blocks(layers: int, mode: CheckpointMode, every_k: int) -> int:
    """Blocks whose inside is recomputed (the trainer's `checkpointed_modules`)."""
    if mode is CheckpointMode.FULL:
        return layers
    if mode is CheckpointMode.EVERY_K:
        return -(-layers // every_k)  # blocks[::k]
    return 0


def blocks_activations(
    shape: ModelShape,
    layer: LayerActivations,
    e: int,
    sb: int,
    mode: CheckpointMode,
    every_k: int,
) -> tuple[Term, Term]:
    """(kept at the end of forward, held while the last checkpointed block recomputes).

    Backward runs the blocks last to first, so when checkpointed block j recomputes, the
    blocks above it have freed theirs and the blocks below still hold what they kept: the
    peak of backward is Σ_{i<j} kept(i) + layer for the highest checkpointed j (its input is
    the recomputed layer's own first saved tensor, so it is not counted twice)."""
    L = shape.layers
    if mode is CheckpointMode.NONE:
        return Term(L * layer.full, f"L·({layer.dense_formula} + {layer.scores_formula})"), ZERO
    if mode is CheckpointMode.SELECTIVE:
        kept, what = layer.dense, f"({layer.dense_formula}); attention core recomputed"
    elif mode is CheckpointMode.OP:
        kept, what = layer.matmul_outputs, f"({layer.matmul_formula}) matmul outputs kept"
    else:
        kept, what = float(e * sb * shape.hidden), f"{e}·sbh block input"
    ckpt = set(range(L)) if mode is not CheckpointMode.EVERY_K else set(range(0, L, every_k))
    per_block = [kept if i in ckpt else layer.full for i in range(L)]
    top = max(ckpt)
    n = len(ckpt)
    forward = Term(
        sum(per_block),
        f"{n} checkpointed blocks · {what} + ({L}-{n}) kept blocks · layer (layer = {gib(layer.full)})",
    )
    recompute = Term(
        sum(per_block[:top]) + layer.full,
        f"blocks below the last checkpointed one ({top}) + 1 layer recomputing ({gib(layer.full)})",
    )
    return forward, recompute


def outside_blocks(shape: ModelShape, e: int, sb: int) -> Term:
    """Final norm and head inputs, and the logits at the loss (the peak of forward)."""
    h, v = shape.hidden, shape.vocab
    # The loss upcasts 16-bit logits to fp32 and log-softmax keeps its fp32 output for
    # backward: e + 4 + 4 bytes per logit at that moment (fp32: logits + output, 8).
    logit_b = e + 8 if e < 4 else 8
    value = sb * (2 * e * h + (h if shape.dropout else 0) + logit_b * v)
    return Term(value, f"final norm + head inputs 2·{e}·sbh + logits {logit_b}·sbV")


@dataclass(frozen=True)
class Activations:
    blocks: Term
    """What the blocks keep at the end of forward."""
    outside: Term
    """Outside the blocks, at the loss: the peak of forward."""
    recompute: Term
    """The peak of backward: what is held while the last checkpointed block recomputes (the
    head's activations are freed by then); 0 without checkpointing."""

    @property
    def total(self) -> Term:
        forward = self.blocks.value + self.outside.value
        return Term(
            max(forward, self.recompute.value),
            f"max(end of forward = blocks + head = {gib(forward)}, recompute = {gib(self.recompute.value)})",
        )


def activations(
    shape: ModelShape,
    seq_len: int,
    micro_batch: int,
    e: int,
    flash: bool,
    mode: CheckpointMode,
    every_k: int,
) -> Activations:
    sb = seq_len * micro_batch
    layer = layer_activations(shape, seq_len, micro_batch, e, flash)
    blocks, recompute = blocks_activations(shape, layer, e, sb, mode, every_k)
    head = outside_blocks(shape, e, sb)
    note = f" (s={seq_len}, b={micro_batch}, sb={count(sb)})"
    return Activations(Term(blocks.value, blocks.formula + note), head, recompute)
