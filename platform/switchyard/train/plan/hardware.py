"""The cluster a job would run on: GPUs, their memory and speed, and the links between them."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from switchyard.train.plan.errors import PlanError

GIB = 1024**3
SMALLEST_FIGURE = 1e-6
"""The least a memory size, bandwidth, FLOP rate or MFU may be: products of smaller ones (a
1e-300 TFLOPS at a 1e-300 MFU) underflow to 0, and the planner then divided by zero."""
GB = 1e9


@dataclass(frozen=True)
class ClusterSpec:
    """Defaults describe H100 80GB SXM nodes with 8 GPUs, NVLink and one 400 Gb/s NIC per GPU.

    Bandwidths are what a ring collective achieves per GPU (NCCL's "bus bandwidth"), not the
    link's peak; pass your own measured numbers (`nccl-tests`) where you have them.
    """

    gpus: int = 8
    """Data-parallel ranks (N)."""
    gpus_per_node: int = 8
    gpu_memory_gib: float = 80.0
    intra_node_gbps: float = 360.0
    """NVLink bus bandwidth per GPU in GB/s (about 75% of H100's 450 GB/s one way)."""
    inter_node_gbps: float = 45.0
    """Network bus bandwidth of one NIC in GB/s (400 Gb/s = 50 GB/s, about 90% achieved)."""
    nics_per_node: int = 8
    """NICs per node. With fewer NICs than GPUs the GPUs of a node share them: each GPU's
    ring leaves the node at `nics_per_node / gpus_per_node` of a NIC."""
    intra_node_latency_us: float = 2.0
    """Latency of one ring step inside a node (NVLink), in microseconds."""
    inter_node_latency_us: float = 10.0
    """Latency of one ring step across the network, in microseconds."""
    pcie_gbps: float = 25.0
    """Host-device copy bandwidth per GPU in GB/s, used for offload traffic."""
    peak_tflops: float = 989.0
    """Dense bf16/fp16 tensor-core peak per GPU (H100 SXM)."""
    fp32_peak_tflops: float = 67.0
    """Dense fp32 peak per GPU without TF32 (PyTorch's default for matmuls)."""
    mfu: float = 0.4
    """Fraction of peak the training step achieves (model FLOPs utilisation)."""
    runtime_overhead_gib: float = 1.0
    """Fixed per-GPU memory outside tensors: CUDA context, cuBLAS and NCCL workspaces."""
    fragmentation: float = 0.05
    """Allocator fragmentation, as a fraction of the memory that changes during a step
    (activations and transient buffers)."""

    def __post_init__(self) -> None:
        for name in ("gpus", "gpus_per_node", "nics_per_node"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise PlanError(f"cluster.{name} must be a positive integer, got {value!r}")
        for field in fields(self):  # NaN passes every comparison below, and infinity most
            value = getattr(self, field.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise PlanError(f"cluster.{field.name} must be a finite number, got {value!r}")
        for name in (
            "gpu_memory_gib",
            "intra_node_gbps",
            "inter_node_gbps",
            "pcie_gbps",
            "peak_tflops",
            "fp32_peak_tflops",
        ):
            if getattr(self, name) < SMALLEST_FIGURE:  # below it, rates underflow to 0 (stop 44)
                raise PlanError(f"cluster.{name} must be at least {SMALLEST_FIGURE:g}, got {getattr(self, name)!r}")
        for name in ("intra_node_latency_us", "inter_node_latency_us"):
            if getattr(self, name) < 0:
                raise PlanError(f"cluster.{name} must be >= 0, got {getattr(self, name)!r}")
        if not SMALLEST_FIGURE <= self.mfu <= 1:
            raise PlanError(f"cluster.mfu must be in [{SMALLEST_FIGURE:g}, 1], got {self.mfu!r}")
        if self.runtime_overhead_gib < 0 or not 0 <= self.fragmentation < 1:
            raise PlanError(
                "cluster.runtime_overhead_gib must be >= 0 and cluster.fragmentation in [0, 1), "
                f"got {self.runtime_overhead_gib!r} and {self.fragmentation!r}"
            )

    @property
    def gpu_memory_bytes(self) -> float:
        return self.gpu_memory_gib * GIB

    @property
    def nodes(self) -> int:
        return -(-self.gpus // self.gpus_per_node)

    @property
    def network_gbps_per_gpu(self) -> float:
        """The network bus bandwidth one GPU's ring gets: a NIC each, or a share of one."""
        return self.inter_node_gbps * min(1.0, self.nics_per_node / self.gpus_per_node)

    @property
    def aggregate_network_gbps(self) -> float:
        """All NICs of all nodes the job spans, in GB/s."""
        return self.nodes * self.nics_per_node * self.inter_node_gbps

    def ring_gbps(self, group_size: int) -> float:
        """Bus bandwidth of a ring over `group_size` consecutive ranks: NVLink inside a node,
        the network as soon as the ring leaves it (its slowest hop sets the pace)."""
        return self.intra_node_gbps if group_size <= self.gpus_per_node else self.network_gbps_per_gpu

    def ring_step_seconds(self, group_size: int) -> float:
        """Latency of one step of a ring over `group_size` consecutive ranks."""
        us = self.intra_node_latency_us if group_size <= self.gpus_per_node else self.inter_node_latency_us
        return us * 1e-6
