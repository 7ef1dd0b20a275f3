"""Run inside a spawned 2-rank gloo group by test_plan_measured.py (spawned children import
this module by name): one AdamW step of the tiny switchyard GPT per strategy, sharded the way
the trainer shards it, and the bytes each rank then holds."""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.distributed as dist

from switchyard.models import GPT, GPTConfig, next_token_loss
from switchyard.train.memory import grad_bytes, optimizer_state_bytes, param_bytes
from switchyard.train.parallelize import apply_ddp, apply_fsdp
from switchyard.train.strategy import Strategy

STRATEGIES = (Strategy.DDP, Strategy.FSDP_FULL, Strategy.FSDP_GRAD_OP, Strategy.FSDP_NO_SHARD)
PRESET = "tiny"


def _one_step(strategy: Strategy, world_size: int) -> dict[str, int]:
    torch.manual_seed(0)
    config = GPTConfig.preset(PRESET)
    model: torch.nn.Module = GPT(config)
    if strategy is Strategy.DDP:
        model = apply_ddp(model, torch.device("cpu"))  # type: ignore[arg-type]
    else:
        model = apply_fsdp(model, strategy, world_size=world_size, device_type="cpu")  # type: ignore[arg-type]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = torch.randint(0, config.vocab_size, (2, 33))
    loss = next_token_loss(model(tokens[:, :-1]), tokens[:, 1:])
    loss.backward()
    optimizer.step()
    return {
        "parameters": param_bytes(model.parameters()),
        "gradients": grad_bytes(model.parameters()),
        "optimizer": optimizer_state_bytes(optimizer),
    }


def measure_strategies(rank: int, world_size: int, init_file: str, out_dir: str) -> None:
    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size
    )
    try:
        measured = {s.value: _one_step(s, world_size) for s in STRATEGIES}
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(measured))
    finally:
        dist.destroy_process_group()
