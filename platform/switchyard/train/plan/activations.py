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
from switchyard.train.plan.terms import Term, count, gib
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
) -> Term:
    L = shape.layers
    if mode is CheckpointMode.NONE:
        return Term(L * layer.full, f"L·({layer.dense_formula} + {layer.scores_formula})")
    if mode is CheckpointMode.SELECTIVE:
        return Term(L * layer.dense, f"L·({layer.dense_formula}); attention core recomputed")
    if mode is CheckpointMode.OP:
        # Every block is checkpointed with a save-the-matmuls policy; in backward one block's
        # full activations exist at a time while its element-wise ops are recomputed.
        return Term(
            L * layer.matmul_outputs + layer.full,
            f"L·({layer.matmul_formula}) matmul outputs kept + 1 layer recomputing (layer = {gib(layer.full)})",
        )
    n = checkpointed_blocks(L, mode, every_k)
    stored_input = e * sb * shape.hidden
    # In backward one recomputed block's full activations exist at a time.
    value = n * stored_input + (L - n) * layer.full + layer.full
    return Term(
        value,
        f"{n} checkpointed blocks * {e}·sbh + ({L}-{n}) kept blocks * layer + 1 layer recomputing"
        f" (layer = {gib(layer.full)})",
    )


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
    outside: Term

    @property
    def total(self) -> Term:
        return Term(self.blocks.value + self.outside.value, "blocks + outside blocks")


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
    blocks = blocks_activations(shape, layer, e, sb, mode, every_k)
    head = outside_blocks(shape, e, sb)
    note = f" (s={seq_len}, b={micro_batch}, sb={count(sb)})"
    return Activations(Term(blocks.value, blocks.formula + note), head)
