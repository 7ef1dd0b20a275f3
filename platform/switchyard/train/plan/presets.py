"""Named model shapes: public Llama and GPT-3 sizes, and switchyard's own GPT presets.

`gpt-<name>` is a thin adapter over `switchyard.models.GPTConfig.preset(name)`, so a size in
a job spec and in the planner are the same tensors. That import pulls in torch (the models
package exports the `nn.Module`), so it happens only when a `gpt-*` shape is asked for.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from switchyard.train.plan.errors import PlanError
from switchyard.train.plan.shape import ModelShape, Norm

if TYPE_CHECKING:
    from switchyard.models import GPTConfig

GPT_PREFIX = "gpt-"


def _llama(layers: int, hidden: int, heads: int, kv_heads: int, ffn: int, vocab: int) -> ModelShape:
    return ModelShape(layers, hidden, heads, kv_heads, ffn, vocab)


# Dimensions from each model's published config.json (Meta's Llama 2 and 3.1 model cards);
# GPT-3 175B from Brown et al. 2020, table 2.1, as used by Korthikanti et al. 2022.
EXTERNAL_PRESETS: dict[str, ModelShape] = {
    "llama2-7b": _llama(32, 4096, 32, 32, 11008, 32000),
    "llama2-13b": _llama(40, 5120, 40, 40, 13824, 32000),
    "llama2-70b": _llama(80, 8192, 64, 8, 28672, 32000),
    "llama3-8b": _llama(32, 4096, 32, 8, 14336, 128256),
    "llama3-70b": _llama(80, 8192, 64, 8, 28672, 128256),
    "llama3-405b": _llama(126, 16384, 128, 8, 53248, 128256),
    "gpt3-175b": ModelShape(
        layers=96,
        hidden=12288,
        heads=96,
        kv_heads=96,
        ffn=4 * 12288,
        vocab=50257,
        gated_ffn=False,
        bias=True,
        norm=Norm.LAYERNORM,
        tied_embeddings=True,
        positions=2048,
        dropout=True,
        fused_qkv=True,
    ),
}


def shape_from_gpt_config(config: GPTConfig) -> ModelShape:
    """The planner's view of `switchyard.models.GPT(config)`."""
    return ModelShape(
        layers=config.n_layer,
        hidden=config.d_model,
        heads=config.n_head,
        kv_heads=config.n_head,
        ffn=config.mlp_ratio * config.d_model,
        vocab=config.vocab_size,
        gated_ffn=False,
        bias=True,
        norm=Norm.LAYERNORM,
        tied_embeddings=config.tie_embeddings,
        positions=config.max_seq_len,
        dropout=config.dropout > 0,
        fused_qkv=True,
    )


def gpt_preset_names() -> list[str]:
    from switchyard.models import PRESETS  # torch import: only when gpt-* names are needed

    return [GPT_PREFIX + name for name in PRESETS]


def preset_names() -> list[str]:
    return [*gpt_preset_names(), *EXTERNAL_PRESETS]


def model_preset(name: str) -> ModelShape:
    """A shape by name: `llama3-70b`, `gpt3-175b`, or `gpt-<GPTConfig preset>`."""
    if name in EXTERNAL_PRESETS:
        return EXTERNAL_PRESETS[name]
    if name.startswith(GPT_PREFIX):
        from switchyard.models import GPTConfig  # torch import: only for switchyard's own GPT

        try:
            return shape_from_gpt_config(GPTConfig.preset(name.removeprefix(GPT_PREFIX)))
        except ValueError as exc:
            raise PlanError(f"model preset {name!r}: {exc}") from None
    raise PlanError(
        f"unknown model preset {name!r}; known: {', '.join(EXTERNAL_PRESETS)} and gpt-<name> "
        "for each switchyard.models preset (tiny, small, ...)"
    )
