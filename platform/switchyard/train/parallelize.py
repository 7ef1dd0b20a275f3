"""Put a plain `GPT` on the data-parallel ranks with DDP or FSDP2 (`fully_shard`).

Order, as in torchtitan: activation checkpointing first, then `torch.compile` per block
(`compile_blocks`, optional), then FSDP. The checkpoint hooks
must sit on the module *inside* the FSDP unit: FSDP's pre-backward hook then all-gathers the
block's parameters once and both the recompute and the gradient computation use that one
gather. Applied the other way round, the recompute runs outside FSDP's hooks and sees
sharded parameters (or triggers a second gather).

Strategy to FSDP2 mapping (FSDP1 name in brackets):
- fsdp-full     [FULL_SHARD]    1-D mesh over all ranks, reshard_after_forward=True
- fsdp-grad-op  [SHARD_GRAD_OP] 1-D mesh, reshard_after_forward=False (full params held
                                from forward to backward; grads and optimizer state sharded)
- fsdp-no-shard [NO_SHARD]      2-D mesh (replicate=world, shard=1): every rank holds all
- fsdp-hybrid   [HYBRID_SHARD]  2-D mesh (replicate=R, shard=world/R): shard inside a group,
                                all-reduce gradients across groups; by default one group per
                                node (`strategy.hybrid_layout`, the planner's rule too)
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel

from switchyard.models import GPT
from switchyard.train.strategy import HybridLayout, Offload, Strategy, WrapGranularity, hybrid_layout


def fsdp_mesh(
    strategy: Strategy, world_size: int, device_type: str, replicate_degree: int | None, ranks_per_node: int
) -> DeviceMesh:
    if strategy is Strategy.FSDP_FULL or strategy is Strategy.FSDP_GRAD_OP:
        return init_device_mesh(device_type, (world_size,), mesh_dim_names=("shard",))
    if strategy is Strategy.FSDP_NO_SHARD:
        layout = HybridLayout(world_size, 1)
    else:
        layout = hybrid_layout(world_size, ranks_per_node, replicate_degree)
    return init_device_mesh(device_type, tuple(layout), mesh_dim_names=("replicate", "shard"))


def fsdp_units(model: GPT, wrap: WrapGranularity) -> list[nn.Module]:
    """Modules that get their own `fully_shard` call, innermost first (the root comes last)."""
    if wrap is WrapGranularity.BLOCK:
        return list(model.blocks)
    if wrap is WrapGranularity.LAYER:
        # Only the linears inside blocks: the tied embedding/head weight must stay in one unit.
        return [m for b in model.blocks for m in b.modules() if isinstance(m, nn.Linear)]
    return []


def apply_fsdp(
    model: GPT,
    strategy: Strategy,
    *,
    world_size: int,
    device_type: str,
    wrap: WrapGranularity = WrapGranularity.BLOCK,
    param_dtype: torch.dtype | None = None,
    offload: Offload = Offload.NONE,
    replicate_degree: int | None = None,
    ranks_per_node: int | None = None,
) -> nn.Module:
    """`ranks_per_node` (default: all ranks on one node) sets fsdp-hybrid's default layout."""
    if not strategy.is_fsdp:
        raise ValueError(f"apply_fsdp got non-FSDP strategy {strategy.value!r}")
    if offload is Offload.NVME:
        raise ValueError("FSDP cannot offload to nvme; use zero3 with offload nvme")
    mesh = fsdp_mesh(strategy, world_size, device_type, replicate_degree, ranks_per_node or world_size)
    # Gradients are reduced in fp32 even when compute is bf16: bf16 sums lose small updates.
    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    offload_policy = CPUOffloadPolicy() if offload is Offload.CPU else None
    reshard = strategy is not Strategy.FSDP_GRAD_OP
    units = fsdp_units(model, wrap)
    for i, unit in enumerate(units):
        # The last unit is not resharded after forward: backward needs it first, so FSDP
        # would all-gather it again straight away.
        last = i == len(units) - 1
        fully_shard(
            unit,
            mesh=mesh,
            reshard_after_forward=reshard and not last,
            mp_policy=mp,
            **({"offload_policy": offload_policy} if offload_policy else {}),
        )
    fully_shard(
        model,
        mesh=mesh,
        # None: FSDP2's own rule, "not resharded after forward" for the root (the embedding and
        # head backward needs first); an explicit True added one exposed all-gather per step.
        reshard_after_forward=None if reshard else False,
        mp_policy=mp,
        **({"offload_policy": offload_policy} if offload_policy else {}),
    )
    return model


def compile_blocks(model: GPT) -> int:
    """`torch.compile` each transformer block in place (`Module.compile`: parameter names, and
    so checkpoints, stay those of the eager model). One block's graph serves them all; its
    activation-checkpointing hooks are compiled with it, FSDP's (added after) are not."""
    for block in model.blocks:
        block.compile()
    return len(model.blocks)


def apply_ddp(model: GPT, device: torch.device) -> nn.Module:
    model.to(device)
    device_ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=device_ids)
