"""A decoder-only transformer (GPT-2 shape) as a plain `nn.Module`.

It knows nothing about sharding or activation checkpointing: the trainer applies those
afterwards to the submodules named here (`blocks[i]`, `blocks[i].attn.core`, the linears).
The attention core is its own parameter-free module so that Megatron-style selective
checkpointing can recompute exactly softmax(QK^T)V and nothing else.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from switchyard.models.config import GPTConfig


@dataclass(frozen=True)
class InitRule:
    """How one parameter starts: drawn from N(0, std) when `std` is set, else the constant `fill`."""

    std: float | None = None
    fill: float = 0.0


class AttentionCore(nn.Module):
    """softmax(QK^T / sqrt(d)) V with a causal mask: no parameters, cheap to recompute."""

    def __init__(self, dropout: float) -> None:
        super().__init__()
        self.dropout = dropout

    def forward(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        p = self.dropout if self.training else 0.0
        return F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model)
        self.core = AttentionCore(config.dropout)
        self.proj = nn.Linear(config.d_model, config.d_model)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: Tensor) -> Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        shape = (b, t, self.n_head, d // self.n_head)
        q, k, v = (z.view(shape).transpose(1, 2) for z in (q, k, v))
        y = self.core(q, k, v).transpose(1, 2).contiguous().view(b, t, d)
        out: Tensor = self.dropout(self.proj(y))
        return out


class MLP(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.up = nn.Linear(config.d_model, config.mlp_ratio * config.d_model)
        self.down = nn.Linear(config.mlp_ratio * config.d_model, config.d_model)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.dropout(self.down(F.gelu(self.up(x))))
        return out


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(config.d_model)
        self.attn = CausalSelfAttention(config)
        self.ln2 = nn.LayerNorm(config.d_model)
        self.mlp = MLP(config)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """Token ids (batch, time) in, next-token logits (batch, time, vocab) out."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, config.d_model)
        self.pos_emb = nn.Embedding(config.max_seq_len, config.d_model)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.d_model)
        self.head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.head.weight = self.tok_emb.weight
        self.init_weights()

    def init_plan(self) -> list[tuple[str, nn.Parameter, InitRule]]:
        """GPT-2 initialisation as data: each parameter's name and how it starts, in the order
        `init_weights` draws them. The trainer fills sharded parameters from the same plan."""
        std = 0.02
        # Residual projections are scaled so the residual stream's variance does not grow
        # with depth (GPT-2, section 2.3).
        residual_std = std / math.sqrt(2 * self.config.n_layer)
        plan: list[tuple[str, nn.Parameter, InitRule]] = []
        for name, module in self.named_modules():
            if isinstance(module, nn.Linear):
                is_residual = name.endswith(("attn.proj", "mlp.down"))
                plan.append((f"{name}.weight", module.weight, InitRule(std=residual_std if is_residual else std)))
                if module.bias is not None:
                    plan.append((f"{name}.bias", module.bias, InitRule(fill=0.0)))
            elif isinstance(module, nn.Embedding):
                plan.append((f"{name}.weight", module.weight, InitRule(std=std)))
            elif isinstance(module, nn.LayerNorm):
                plan.append((f"{name}.weight", module.weight, InitRule(fill=1.0)))
                plan.append((f"{name}.bias", module.bias, InitRule(fill=0.0)))
        return plan

    @torch.no_grad()  # type: ignore[untyped-decorator]
    def init_weights(self) -> None:
        """GPT-2 initialisation from the global RNG (the gateway's seeded model relies on it)."""
        for _, param, rule in self.init_plan():
            if rule.std is None:
                param.fill_(rule.fill)
            else:
                param.normal_(0.0, rule.std)

    def forward(self, idx: Tensor) -> Tensor:
        logits: Tensor = self.head(self.features(idx))
        return logits

    def features(self, idx: Tensor) -> Tensor:
        """The final hidden state (batch, time, d_model): the last block's output after the
        final LayerNorm, i.e. exactly what the LM head reads. The local model's embeddings
        pool it (`LocalChatModel.embed`); `forward` is `head(features(idx))`, so the logits
        are unchanged by having it."""
        t = idx.shape[1]
        if t > self.config.max_seq_len:
            raise ValueError(f"sequence length {t} exceeds max_seq_len {self.config.max_seq_len}")
        pos = torch.arange(t, device=idx.device)
        x = self.drop(self.tok_emb(idx) + self.pos_emb(pos))
        for block in self.blocks:
            x = block(x)
        hidden: Tensor = self.ln_f(x)
        return hidden

    @torch.no_grad()  # type: ignore[untyped-decorator]
    def generate(
        self,
        idx: Tensor,
        max_new_tokens: int,
        *,
        temperature: float = 1.0,
        top_k: int | None = None,
        stop_id: int | None = None,
        generator: torch.Generator | None = None,
    ) -> Tensor:
        """Append up to `max_new_tokens` sampled ids to `idx` (batch, time).

        `temperature == 0` is greedy decoding. Generation stops early once every row has
        produced `stop_id`. The context is cropped to `max_seq_len` (no KV cache: this model
        serves small local requests, not throughput).
        """
        if max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        finished = torch.zeros(idx.shape[0], dtype=torch.bool, device=idx.device)
        for _ in range(max_new_tokens):
            logits = self(idx[:, -self.config.max_seq_len :])[:, -1, :]
            next_id = _sample(logits, temperature, top_k, generator)
            idx = torch.cat([idx, next_id], dim=1)
            if stop_id is not None:
                finished |= next_id.squeeze(1) == stop_id
                if bool(finished.all()):
                    break
        return idx


def _sample(logits: Tensor, temperature: float, top_k: int | None, generator: torch.Generator | None) -> Tensor:
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)
    logits = logits / temperature
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[:, [-1]]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = F.softmax(logits, dim=-1)
    return torch.multinomial(probs, num_samples=1, generator=generator)


def next_token_loss(logits: Tensor, targets: Tensor) -> Tensor:
    """Mean cross-entropy of logits (batch, time, vocab) against targets (batch, time)."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))
