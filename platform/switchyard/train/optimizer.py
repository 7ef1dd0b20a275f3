"""The AdamW every engine steps, and which of torch's implementations it uses.

On a GPU, the fused kernel: one launch per step for every parameter instead of a Python loop
over tensors (torch's fastest AdamW; it takes plain tensors and FSDP2's DTensors alike). On the
host (CPU training, or a CPU-offloaded optimizer), the per-tensor loop, so plain tensors and
DTensors take one path with identical numerics: the CPU tests compare FSDP's and ZeRO's losses
with DDP's exactly. Not validated on a GPU here (no device was lent); `bench/gpu_check.sh`, when
it exists, is where to measure it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from switchyard.train.spec import OptimSpec


def adamw_implementation(device: torch.device, offloaded: bool) -> dict[str, Any]:
    """torch.optim.AdamW's implementation flags for parameters stepped on `device`."""
    if device.type == "cuda" and not offloaded:
        return {"fused": True}
    return {"foreach": False}


def adamw(
    params: Iterable[torch.nn.Parameter], optim: OptimSpec, device: torch.device, offloaded: bool
) -> torch.optim.AdamW:
    return torch.optim.AdamW(
        params,
        lr=optim.lr,
        betas=optim.betas,
        weight_decay=optim.weight_decay,
        **adamw_implementation(device, offloaded),
    )
