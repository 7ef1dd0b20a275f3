from __future__ import annotations

from pathlib import Path

import pytest

from switchyard.train import Strategy
from switchyard.train.spec import JobSpec, JobSpecError, load_job_spec

CONFIGS = Path(__file__).resolve().parents[2] / "train_jobs" / "configs"


def test_one_shipped_config_per_strategy_and_all_valid() -> None:
    specs = [load_job_spec(p) for p in sorted(CONFIGS.glob("*.yaml"))]
    assert {s.parallel.strategy for s in specs} == set(Strategy)


def test_error_names_file_and_field(tmp_path: Path) -> None:
    bad = tmp_path / "job.yaml"
    bad.write_text("name: x\nsteps: 3\nparallel:\n  strategy: fsdp-sideways\n")
    with pytest.raises(JobSpecError, match=r"job\.yaml: parallel\.strategy"):
        load_job_spec(bad)


def test_unknown_field_is_rejected(tmp_path: Path) -> None:
    bad = tmp_path / "job.yaml"
    bad.write_text("name: x\nsteps: 3\noptim:\n  learning_rate: 0.1\n")
    with pytest.raises(JobSpecError, match=r"optim\.learning_rate"):
        load_job_spec(bad)


def test_not_yaml_and_missing_file(tmp_path: Path) -> None:
    bad = tmp_path / "job.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(JobSpecError, match="not valid YAML"):
        load_job_spec(bad)
    with pytest.raises(JobSpecError, match="cannot read"):
        load_job_spec(tmp_path / "missing.yaml")


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"parallel": {"strategy": "fsdp-full", "offload": "nvme"}}, "needs strategy 'zero3'"),
        ({"parallel": {"strategy": "ddp", "offload": "cpu"}}, "cannot offload"),
        (
            {"num_workers": 2, "parallel": {"strategy": "fsdp-hybrid", "replicate_degree": 2}},
            r"fsdp-hybrid needs .*parallel\.replicate_degree",
        ),
        ({"parallel": {"strategy": "zero3", "compile": True}}, r"compile: not supported with strategy 'zero3'"),
        (
            {"parallel": {"strategy": "fsdp-full", "compile": True, "activation_checkpointing": "selective"}},
            r"compile: not supported with activation_checkpointing 'selective'",
        ),
        (
            {"num_workers": 2, "data": {"micro_batch_size": 4}, "validation": {"every_steps": 5, "sequences": 12}},
            r"validation\.sequences \(12\) must be a multiple of num_workers x data\.micro_batch_size \(8\)",
        ),
        ({"data": {"seq_len": 4096}}, "exceeds model max_seq_len"),
        ({"model": {"preset": "giant"}}, "unknown model preset"),
    ],
)
def test_inconsistent_specs_are_rejected(changes: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        JobSpec.model_validate({"name": "x", "steps": 1, **changes})


def test_with_changes_sets_dotted_fields() -> None:
    spec = JobSpec(name="x", steps=1).with_changes(**{"parallel.strategy": "zero2", "steps": 5})
    assert spec.parallel.strategy is Strategy.ZERO2 and spec.steps == 5


def test_deepspeed_config_maps_stage_offload_and_accumulation() -> None:
    from switchyard.train.deepspeed_engine import deepspeed_config

    spec = JobSpec.model_validate(
        {
            "name": "x",
            "steps": 1,
            "data": {"grad_accum_steps": 4},
            "parallel": {"strategy": "zero3", "offload": "nvme", "nvme_path": "/nvme"},
        }
    )
    config = deepspeed_config(spec, bf16=True)
    zero = config["zero_optimization"]
    assert zero["stage"] == 3 and config["gradient_accumulation_steps"] == 4
    assert zero["offload_optimizer"] == zero["offload_param"] == {"device": "nvme", "nvme_path": "/nvme"}
    assert config["zero_allow_untested_optimizer"] and config["bf16"] == {"enabled": True}
    with pytest.raises(ValueError, match="nvme_path"):
        spec.with_changes(**{"parallel.nvme_path": None})


def test_a_worker_holds_one_gpu_and_a_job_asks_for_more_with_num_workers(tmp_path: Path) -> None:
    # A worker holding 3 GPUs would train on one of them: the spec refuses it, naming the fix.
    bad = tmp_path / "job.yaml"
    bad.write_text("name: x\nsteps: 1\nnum_workers: 2\ngpus_per_worker: 3\n")
    with pytest.raises(JobSpecError, match=r"job\.yaml: gpus_per_worker: .*must be 1, got 3.*num_workers: N"):
        load_job_spec(bad)
    assert JobSpec.model_validate({"name": "x", "steps": 1, "num_workers": 6}).gpus == 6


def test_workers_holding_several_gpus_ask_for_whole_workers_per_node() -> None:
    from switchyard.cluster.admission import gang_bundles, training_submission

    assert training_submission("x", 6, "research", gpus_per_worker=3).bundles == (6,)
    assert gang_bundles(12) == (8, 4)
    assert gang_bundles(12, gpus_per_worker=3) == (6, 6)  # a worker never spans two nodes
    assert gang_bundles(16, gpus_per_worker=4) == (8, 8)
    with pytest.raises(ValueError, match="not whole workers"):
        gang_bundles(7, gpus_per_worker=3)
    with pytest.raises(ValueError, match="does not fit a node"):
        gang_bundles(16, gpus_per_node=8, gpus_per_worker=16)
    with pytest.raises(ValueError, match="gpus_per_worker"):
        JobSpec.model_validate({"name": "x", "steps": 1, "gpus_per_worker": 0})


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("log_every_steps: 0", r"job\.yaml: log_every_steps: Input should be greater than or equal to 1"),
        ("preempt_check_s: 60", r"job\.yaml: preempt_check_s: .*at most 30 s \(1/4 of the scheduler's default"),
        ("preempt_check_s: -1", r"job\.yaml: preempt_check_s: Input should be greater than or equal to 0"),
        ("peak_tflops_per_device: 0", r"job\.yaml: peak_tflops_per_device: Input should be greater than 0"),
        ("log_every: 5", r"log_every was renamed log_every_steps"),
    ],
)
def test_metrics_and_preemption_fields_are_validated_by_name(tmp_path: Path, line: str, message: str) -> None:
    bad = tmp_path / "job.yaml"
    bad.write_text(f"name: x\nsteps: 3\n{line}\n")
    with pytest.raises(JobSpecError, match=message):
        load_job_spec(bad)


def test_metrics_and_preemption_defaults() -> None:
    spec = JobSpec(name="x", steps=1)
    assert (spec.log_every_steps, spec.preempt_check_s, spec.peak_tflops_per_device) == (10, 5.0, None)


def test_fsdp_hybrid_shards_within_a_node_and_replicates_across_nodes_by_default() -> None:
    from switchyard.train.strategy import HybridLayout, hybrid_layout

    assert hybrid_layout(16, ranks_per_node=8) == HybridLayout(replicas=2, shard=8)
    assert hybrid_layout(4, ranks_per_node=8) == HybridLayout(1, 4)  # one node: one shard group
    assert hybrid_layout(16, ranks_per_node=8, replicate_degree=4) == HybridLayout(4, 4)
    with pytest.raises(ValueError, match=r"12 ranks do not fill whole nodes of 8 .*set parallel\.replicate_degree"):
        hybrid_layout(12, ranks_per_node=8)
    with pytest.raises(ValueError, match=r"parallel\.replicate_degree: 16 ranks are not a whole number of 3"):
        hybrid_layout(16, ranks_per_node=8, replicate_degree=3)
    # Without replicate_degree the spec cannot know the nodes: the layout is chosen at launch.
    assert JobSpec.model_validate({"name": "x", "steps": 1, "parallel": {"strategy": "fsdp-hybrid"}})
