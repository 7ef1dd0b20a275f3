"""Which AdamW implementation each engine steps with."""

from __future__ import annotations

import torch

from switchyard.train.optimizer import adamw, adamw_implementation
from switchyard.train.spec import OptimSpec


def test_fused_on_a_gpu_the_per_tensor_loop_on_the_host() -> None:
    # Regression: every engine stepped the per-tensor loop (`foreach=False`), torch's slowest
    # AdamW, on GPUs too.
    assert adamw_implementation(torch.device("cuda", 0), offloaded=False) == {"fused": True}
    assert adamw_implementation(torch.device("cuda", 0), offloaded=True) == {"foreach": False}
    assert adamw_implementation(torch.device("cpu"), offloaded=False) == {"foreach": False}


def test_the_host_optimizer_steps_as_before() -> None:
    weights = torch.nn.Parameter(torch.ones(4))
    optimizer = adamw([weights], OptimSpec(), torch.device("cpu"), offloaded=False)
    assert optimizer.defaults["foreach"] is False and not optimizer.defaults.get("fused")
    weights.grad = torch.ones(4)
    optimizer.step()
    assert torch.all(weights < 1)
