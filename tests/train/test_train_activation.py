from __future__ import annotations

from collections import Counter

import pytest
import torch
from torch import nn

from switchyard.models import GPT, GPTConfig, next_token_loss
from switchyard.train.activation import apply_activation_checkpointing, checkpointed_modules
from switchyard.train.strategy import CheckpointMode


def _forward_calls(mode: CheckpointMode, every_k: int = 2) -> Counter[str]:
    """How often each block / MLP / attention core runs forward in one training step."""
    torch.manual_seed(0)
    model = GPT(GPTConfig.preset("tiny", n_layer=4))
    apply_activation_checkpointing(model, mode, every_k)
    calls: Counter[str] = Counter()
    for name, module in model.named_modules():
        if name.startswith("blocks") and (name.endswith(("attn.core", "mlp")) or name.count(".") == 1):

            def hook(m: nn.Module, args: object, name: str = name) -> None:
                calls[name] += 1

            module.register_forward_pre_hook(hook)
    x = torch.randint(0, 256, (2, 16))
    next_token_loss(model(x[:, :-1]), x[:, 1:]).backward()
    return calls


def test_none_runs_everything_once() -> None:
    assert set(_forward_calls(CheckpointMode.NONE).values()) == {1}


def test_full_recomputes_every_block() -> None:
    calls = _forward_calls(CheckpointMode.FULL)
    assert all(calls[f"blocks.{i}"] == 2 and calls[f"blocks.{i}.mlp"] == 2 for i in range(4))


def test_every_k_recomputes_every_kth_block() -> None:
    calls = _forward_calls(CheckpointMode.EVERY_K, every_k=2)
    assert [calls[f"blocks.{i}"] for i in range(4)] == [2, 1, 2, 1]


def test_selective_recomputes_only_the_attention_core() -> None:
    calls = _forward_calls(CheckpointMode.SELECTIVE)
    assert all(calls[f"blocks.{i}.attn.core"] == 2 for i in range(4))
    assert all(calls[f"blocks.{i}"] == 1 and calls[f"blocks.{i}.mlp"] == 1 for i in range(4))


def test_checkpointing_keeps_parameter_names_and_gradients() -> None:
    torch.manual_seed(0)
    plain = GPT(GPTConfig.preset("tiny"))
    ckpt = GPT(GPTConfig.preset("tiny"))
    ckpt.load_state_dict(plain.state_dict())
    apply_activation_checkpointing(ckpt, CheckpointMode.FULL)
    assert list(ckpt.state_dict()) == list(plain.state_dict())
    x = torch.randint(0, 256, (2, 16))
    for m in (plain, ckpt):
        next_token_loss(m(x[:, :-1]), x[:, 1:]).backward()
    for a, b in zip(plain.parameters(), ckpt.parameters(), strict=True):
        assert a.grad is not None and b.grad is not None
        torch.testing.assert_close(a.grad, b.grad)


def test_every_k_rejects_zero() -> None:
    with pytest.raises(ValueError, match="k >= 1"):
        checkpointed_modules(GPT(GPTConfig.preset("tiny")), CheckpointMode.EVERY_K, 0)
