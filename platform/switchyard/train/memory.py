"""Per-rank bytes of parameters, gradients and optimizer state, as each strategy holds them.

Peak RSS cannot show sharding on CPU (it is dominated by the runtime), so the tests and the
benchmark count the tensors each rank actually owns: for a DTensor, its local shard.
`peak_memory` is the process-level figure the trainer's metrics lines report.
"""

from __future__ import annotations

import resource
import sys
from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.distributed.tensor import DTensor


@dataclass(frozen=True)
class RankMemory:
    params: int
    grads: int
    optimizer_state: int

    def as_dict(self) -> dict[str, int]:
        return {"params": self.params, "grads": self.grads, "optimizer_state": self.optimizer_state}


def local_bytes(t: Tensor) -> int:
    local = t.to_local() if isinstance(t, DTensor) else t
    return int(local.numel() * local.element_size())


def param_bytes(params: Iterable[nn.Parameter]) -> int:
    """Bytes of parameter storage this rank holds (each shared tensor counted once).

    DeepSpeed ZeRO-3 keeps the partition in `ds_tensor` and empties `data` between uses.
    """
    seen: set[int] = set()
    total = 0
    for p in params:
        if id(p) in seen:
            continue
        seen.add(id(p))
        ds_tensor = getattr(p, "ds_tensor", None)
        total += local_bytes(ds_tensor) if ds_tensor is not None else local_bytes(p)
    return total


def grad_bytes(params: Iterable[nn.Parameter]) -> int:
    seen: set[int] = set()
    total = 0
    for p in params:
        if id(p) in seen or p.grad is None:
            continue
        seen.add(id(p))
        total += local_bytes(p.grad)
    return total


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    return sum(
        local_bytes(v)
        for state in optimizer.state.values()
        for v in state.values()
        if isinstance(v, Tensor) and v.dim() > 0  # the scalar step counter is not state size
    )


@dataclass(frozen=True)
class PeakMemory:
    bytes: int
    kind: str
    """`cuda_max_allocated` (tensor storage, the caching allocator's peak) or `peak_rss`
    (the whole process on the host)."""


def peak_memory(device: torch.device) -> PeakMemory:
    """This process's peak memory since it started: on GPU the allocator's peak, on CPU the
    peak resident set size.

    `getrusage`'s peak rather than `/proc/self/statm`'s current RSS: a reading taken at a log
    step would miss the peak inside a step (what runs out of memory), and a peak is what
    `max_memory_allocated` reports too. It cannot be reset, so it covers the whole process.
    """
    if device.type == "cuda":
        return PeakMemory(int(torch.cuda.max_memory_allocated(device)), "cuda_max_allocated")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return PeakMemory(peak if sys.platform == "darwin" else peak * 1024, "peak_rss")  # Linux: KiB


@dataclass
class PeakLiveBytes:
    """Peak bytes of live tensor storage on one device while the block runs, from the
    profiler's allocator events (each allocation and free, with its size), relative to
    what was live when it started. Not RSS: only tensor storage counts."""

    device_type: str = "cpu"
    peak: int = 0

    def __enter__(self) -> PeakLiveBytes:
        self._profile = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True)
        self._profile.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._profile.__exit__(None, None, None)
        events = self._profile.profiler.kineto_results.events()  # type: ignore[union-attr]
        wanted = torch.device(self.device_type).type
        memory = sorted(
            (e.start_ns(), e.nbytes())
            for e in events
            if e.name() == "[memory]" and str(e.device_type()).split(".")[-1].lower() == wanted
        )
        live = 0
        for _, nbytes in memory:
            live += nbytes
            self.peak = max(self.peak, live)


def held_grad_bytes(model: nn.Module) -> int:
    """Gradient bytes this rank holds between micro-batches: `.grad` (a local shard for
    FSDP) plus what FSDP2 keeps aside while a reduction is skipped — the unsharded gradients
    (`set_requires_gradient_sync(False)`) or HSDP's partial shard sums
    (`set_requires_all_reduce(False)`). FSDP2 has no public accessor for those, so this
    reads its param groups."""
    total = grad_bytes(model.parameters())
    for module in model.modules():
        get_state = getattr(module, "_get_fsdp_state", None)
        group = get_state()._fsdp_param_group if get_state is not None else None
        if group is None:
            continue
        partial = group._partial_reduce_output
        total += local_bytes(partial) if partial is not None else 0
        for fsdp_param in group.fsdp_params:
            aside = fsdp_param.unsharded_accumulated_grad
            if aside is None and hasattr(fsdp_param, "_unsharded_param"):
                aside = fsdp_param._unsharded_param.grad
            total += local_bytes(aside) if aside is not None else 0
    return total
