"""Training: strategies, the sharded trainer, checkpoints, prefetch and the planner."""

from switchyard.train.strategy import CheckpointMode, Offload, Strategy, WrapGranularity

__all__ = ["CheckpointMode", "Offload", "Strategy", "WrapGranularity"]
