"""Print the numbers docs/planner.md quotes, from the planner's API, and how fast it plans.

Reproduce: .venv/bin/python bench/plan_seed_question.py
"""

from __future__ import annotations

import time

from switchyard.train.plan import ClusterSpec, TrainingJob, compare, model_preset, plan
from switchyard.train.plan.hardware import GIB
from switchyard.train.strategy import CheckpointMode, Offload, Strategy

SEED_JOB = TrainingJob(strategy=Strategy.ZERO3, checkpointing=CheckpointMode.FULL)


def zero3_per_gpu() -> None:
    shape = model_preset("llama3-70b")
    print("llama3-70b, ZeRO-3, bf16 AdamW, micro-batch 1 x 4096, full recompute (GiB per GPU)")
    print(f"{'GPUs':>5} {'states':>8} {'acts':>6} {'transient':>9} {'total':>7} {'fits':>5}"
          f" {'comm GB':>8} {'comm s':>7} {'compute s':>9}")
    for gpus in (8, 16, 32, 64):
        p = plan(shape, ClusterSpec(gpus=gpus), SEED_JOB)
        acts, trans, comp = p.activation_total, p.transient, p.compute
        assert acts is not None and trans is not None and comp is not None
        print(f"{gpus:>5} {p.states.total.value / GIB:8.2f} {acts.value / GIB:6.2f} "
              f"{trans.value / GIB:9.2f} {p.total.value / GIB:7.2f} {p.fits!s:>5} "
              f"{p.comm.bytes_per_gpu / 1e9:8.1f} {p.comm.seconds:7.2f} {comp.value:9.2f}")


def zero3_vs_zero1() -> None:
    print("\nZeRO-3 vs ZeRO-1 communication per GPU per step, llama3-70b, bf16")
    for gpus in (8, 64):
        cluster = ClusterSpec(gpus=gpus)
        z1 = plan(70_553_706_496, cluster, TrainingJob(strategy=Strategy.ZERO1))
        z3 = plan(70_553_706_496, cluster, TrainingJob(strategy=Strategy.ZERO3))
        print(f"  {gpus} GPUs: zero1 {z1.comm.bytes_per_gpu / 1e9:.1f} GB "
              f"({z1.comm.seconds:.2f} s), zero3 {z3.comm.bytes_per_gpu / 1e9:.1f} GB "
              f"({z3.comm.seconds:.2f} s): {z3.comm.bytes_per_gpu / z1.comm.bytes_per_gpu:.2f}x")


def offload_on_8() -> None:
    job = TrainingJob(strategy=Strategy.ZERO3, offload=Offload.CPU,
                      checkpointing=CheckpointMode.FULL)
    p = plan(model_preset("llama3-70b"), ClusterSpec(gpus=8), job)
    print(f"\n8 GPUs with ZeRO-3 + CPU offload: {p.total.value / GIB:.2f} GiB on the GPU, "
          f"{p.states.host.value / GIB:.2f} GiB per GPU on the host, "
          f"{p.comm.offload.value / 1e9:.1f} GB over PCIe per step "
          f"({p.comm.offload_seconds:.2f} s at {p.cluster.pcie_gbps:g} GB/s)")


def planner_speed() -> None:
    shape, cluster = model_preset("llama3-70b"), ClusterSpec(gpus=64)
    n = 200
    start = time.perf_counter()
    for _ in range(n):
        compare(shape, cluster, SEED_JOB)
    elapsed = time.perf_counter() - start
    print(f"\nplanner speed: compare() over 8 strategies {elapsed / n * 1e3:.2f} ms "
          f"({n} runs, {elapsed:.2f} s)")


if __name__ == "__main__":
    zero3_per_gpu()
    zero3_vs_zero1()
    offload_on_8()
    planner_speed()
