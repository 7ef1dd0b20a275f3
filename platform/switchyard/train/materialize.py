"""Building the model without any rank holding it whole.

The model is constructed on the meta device (shapes only), sharded, and only then given
storage: `to_empty()` allocates each rank's shards and `init_sharded_weights` fills them.
ZeRO-3 constructs inside `deepspeed.zero.Init`, which partitions each module as it is built.

The initialisation is shard-reproducible: every parameter draws from its own generator,
seeded by the job seed and the parameter's name, so an element gets the same value whether
the tensor is whole, an FSDP shard (any mesh) or a ZeRO-3 partition. A rank holds at most
one whole parameter at a time, on the host, while it copies out its slice.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from switchyard.models import GPT, GPTConfig, InitRule


def meta_model(config: GPTConfig) -> GPT:
    """A `GPT` with shapes but no storage."""
    with torch.device("meta"):
        return GPT(config)


def is_meta(model: nn.Module) -> bool:
    return any(p.is_meta for p in model.parameters())


def parameter_generator(seed: int, name: str) -> torch.Generator:
    # crc32, not hash(): Python salts str hashes per process, and every rank must agree.
    return torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))


def full_value(shape: torch.Size, rule: InitRule, generator: torch.Generator) -> Tensor:
    """The whole parameter's initial value, on the host, in fp32."""
    if rule.std is None:
        return torch.full(shape, rule.fill)
    return torch.empty(shape).normal_(0.0, rule.std, generator=generator)


def _fill_local(param: Tensor, name: str, rule: InitRule, seed: int) -> None:
    local = param.to_local() if isinstance(param, DTensor) else param
    if rule.std is None:
        local.fill_(rule.fill)  # a constant needs no whole tensor
        return
    whole = full_value(param.shape, rule, parameter_generator(seed, name))
    if isinstance(param, DTensor):
        shape, offset = compute_local_shape_and_global_offset(param.shape, param.device_mesh, param.placements)
        whole = whole[tuple(slice(o, o + s) for o, s in zip(offset, shape, strict=True))]
    local.copy_(whole)


@torch.no_grad()  # type: ignore[untyped-decorator]
def init_sharded_weights(model: GPT, seed: int) -> None:
    """Fill plain or DTensor parameters (after `to_empty`) from `GPT.init_plan()`."""
    for name, param, rule in model.init_plan():
        _fill_local(param, name, rule, seed)


def _aliases(model: nn.Module) -> list[tuple[nn.Module, str, nn.Module, str]]:
    """(module, name) pairs that share another's parameter (the tied LM head)."""
    first: dict[int, tuple[nn.Module, str]] = {}
    out = []
    for module in model.modules():
        for name, param in module.named_parameters(recurse=False):
            owner = first.setdefault(id(param), (module, name))
            if owner[0] is not module or owner[1] != name:
                out.append((module, name, *owner))
    return out


def materialize(model: GPT, device: torch.device, seed: int) -> None:
    """Allocate this rank's storage for a meta-built (and possibly sharded) model and
    initialise it."""
    aliases = _aliases(model)
    model.to_empty(device=device)
    # A meta tensor cannot be swapped in place for a real one, so `to_empty` gives each
    # module a new Parameter and would untie shared ones (FSDP's own params stay shared).
    for module, name, owner, owner_name in aliases:
        setattr(module, name, getattr(owner, owner_name))
    init_sharded_weights(model, seed)


@torch.no_grad()  # type: ignore[untyped-decorator]
def init_partitioned_weights(model: GPT, seed: int) -> None:
    """ZeRO-3: gather one parameter at a time, fill it, and let DeepSpeed re-partition it."""
    import deepspeed

    for name, param, rule in model.init_plan():
        # modifier_rank=0: rank 0's values are broadcast on exit (all ranks compute the same).
        with deepspeed.zero.GatheredParameters([param], modifier_rank=0):
            shape = getattr(param, "ds_shape", param.shape)  # a partitioned param reports its own size
            param.copy_(full_value(torch.Size(shape), rule, parameter_generator(seed, name)))


@contextmanager
def partitioned_construction(ds_config: dict[str, object]) -> Iterator[None]:
    """Construct modules under `deepspeed.zero.Init`: each is partitioned as it is built."""
    import deepspeed

    with deepspeed.zero.Init(config_dict_or_path=ds_config):
        yield
