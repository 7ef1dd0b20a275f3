"""The training planner: memory per GPU, communication and time for a job before it runs,
and the cheapest strategy that fits. Pure Python: no torch or Ray needed for the math.

    from switchyard.train.plan import ClusterSpec, TrainingJob, compare, model_preset, plan
    p = plan(model_preset("llama3-70b"), ClusterSpec(gpus=64), TrainingJob(strategy=Strategy.ZERO3))
    p.to_json()["total_bytes_per_gpu"]
"""

from switchyard.train.plan.errors import PlanError
from switchyard.train.plan.hardware import ClusterSpec
from switchyard.train.plan.job import OptimizerKind, Precision, TrainingJob
from switchyard.train.plan.planner import Comparison, Plan, compare, plan
from switchyard.train.plan.presets import EXTERNAL_PRESETS, model_preset, preset_names
from switchyard.train.plan.shape import ModelShape, Norm

__all__ = [
    "EXTERNAL_PRESETS",
    "ClusterSpec",
    "Comparison",
    "ModelShape",
    "Norm",
    "OptimizerKind",
    "Plan",
    "PlanError",
    "Precision",
    "TrainingJob",
    "compare",
    "model_preset",
    "plan",
    "preset_names",
]
