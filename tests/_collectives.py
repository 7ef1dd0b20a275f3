"""Count the bytes each rank sends through torch.distributed collectives.

`CollectiveCounter` is a dispatch mode over the `c10d` operators that every collective
reaches, whoever issues it: Python callers (FSDP2, DeepSpeed, `dist.all_reduce`) and C++
ones (DDP's reducer) alike, so nothing has to be patched before a library keeps references
to `torch.distributed` functions. Shared by the trainer's DeepSpeed traffic test
(`tests/train/_comm_workers.py`) and the planner's calibration (`tests/plan/`).

Bytes sent are the ring costs the planner prices, per call, for a payload of m bytes over a
group of n ranks: all-reduce 2·(n-1)/n·m, reduce-scatter (n-1)/n·m of the full input, an
all-gather (n-1)·m of this rank's shard; in a rooted collective every rank but the root
sends its buffer to it (reduce) or the root sends it (broadcast).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch._C._distributed_c10d import ProcessGroup
from torch.utils._python_dispatch import TorchDispatchMode


@dataclass(frozen=True)
class CollectiveKind:
    """How one `c10d` operator is counted."""

    name: str
    """The torch.distributed name callers know it by."""
    payload: int
    """Index of the argument whose bytes it moves (a gather's: this rank's shard)."""
    group: int
    """Index of the process-group argument."""
    root: int | None = None
    """Index of the root-rank argument, for rooted collectives."""


KINDS = {
    "allreduce_": CollectiveKind("all_reduce", 0, 1),
    "allreduce_coalesced_": CollectiveKind("all_reduce", 0, 1),
    "reduce_": CollectiveKind("reduce", 0, 1, root=3),
    "broadcast_": CollectiveKind("broadcast", 0, 1, root=2),
    "_allgather_base_": CollectiveKind("all_gather_into_tensor", 1, 2),
    "allgather_": CollectiveKind("all_gather", 1, 2),
    "allgather_into_tensor_coalesced_": CollectiveKind("all_gather_into_tensor", 1, 2),
    "_reduce_scatter_base_": CollectiveKind("reduce_scatter_tensor", 1, 2),
    "reduce_scatter_": CollectiveKind("reduce_scatter", 1, 2),
    "reduce_scatter_tensor_coalesced_": CollectiveKind("reduce_scatter_tensor", 1, 2),
}
UNCOUNTED = frozenset({"barrier", "monitored_barrier_"})
"""Synchronisation only: no payload."""


@dataclass(frozen=True)
class CollectiveCall:
    op: str
    dtype: str
    numel: int
    bytes: int
    """Payload bytes (the argument named by `CollectiveKind.payload`)."""
    sent: int
    """Bytes this rank sends for it (module docstring)."""
    ranks: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _tensors(arg: Any) -> list[torch.Tensor]:
    if isinstance(arg, torch.Tensor):
        return [arg]
    return [t for item in arg for t in _tensors(item)]


def sent_bytes(op: str, m: int, ranks: int, is_root: bool) -> int:
    """Bytes a rank sends for collective `op` over an m-byte payload (module docstring)."""
    if op == "all_reduce":
        return 2 * (ranks - 1) * m // ranks
    if op == "reduce":
        return 0 if is_root else m
    if op == "broadcast":
        return m if is_root else 0
    if op in ("all_gather_into_tensor", "all_gather"):
        return (ranks - 1) * m
    return (ranks - 1) * m // ranks  # reduce-scatter


class CollectiveCounter(TorchDispatchMode):
    """While active (`with counter:`), logs every collective this thread issues in `calls`.

    A collective it does not know fails loudly: an unpriced operator would make the count
    silently short.
    """

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[CollectiveCall] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func.namespace == "c10d":
            self._count(func, args)
        return func(*args, **(kwargs or {}))

    def _count(self, func: Any, args: Any) -> None:
        base = func._schema.name.removeprefix("c10d::")
        if base in UNCOUNTED:
            return
        kind = KINDS.get(base)
        if kind is None:
            raise NotImplementedError(f"CollectiveCounter does not price c10d.{base}; add it to KINDS")
        group = ProcessGroup.unbox(args[kind.group])
        tensors = _tensors(args[kind.payload])
        m = sum(t.numel() * t.element_size() for t in tensors)
        is_root = kind.root is not None and args[kind.root] == group.rank()
        self.calls.append(
            CollectiveCall(
                op=kind.name,
                dtype=str(tensors[0].dtype),
                numel=sum(t.numel() for t in tensors),
                bytes=m,
                sent=sent_bytes(kind.name, m, group.size(), is_root),
                ranks=group.size(),
            )
        )

    @property
    def sent(self) -> int:
        return sum(c.sent for c in self.calls)
