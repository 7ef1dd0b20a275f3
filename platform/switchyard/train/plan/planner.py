"""`plan()`: one job's memory, communication and time per GPU; `compare()`: every strategy
for the same job, and the cheapest one that fits with headroom."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal

from switchyard.train.plan.activations import Activations, activations
from switchyard.train.plan.comm import Communication, communication
from switchyard.train.plan.compute import compute_seconds, step_flops
from switchyard.train.plan.errors import PlanError
from switchyard.train.plan.hardware import GIB, ClusterSpec
from switchyard.train.plan.job import TrainingJob
from switchyard.train.plan.shape import ModelShape
from switchyard.train.plan.states import ModelStates, model_states, shard_group_size
from switchyard.train.plan.terms import Term, count, gib
from switchyard.train.plan.transient import transient
from switchyard.train.strategy import Offload, Strategy

Unit = Literal["bytes", "seconds"]


@dataclass(frozen=True)
class Plan:
    """Everything predicted for one job on one GPU, each number with its formula."""

    job: TrainingJob
    cluster: ClusterSpec
    params: int
    shard_group: int
    states: ModelStates
    activations: Activations | None
    """None when only the parameter count is known."""
    transient: Term | None
    overhead: Term
    comm: Communication
    compute: Term | None

    @property
    def total(self) -> Term:
        parts = [self.states.total.value, self.overhead.value]
        parts += [t.value for t in (self.activation_total, self.transient) if t is not None]
        known = "model states + activations + transient + overhead"
        if self.activations is None:
            known = "model states + overhead (a lower bound: only Ψ is known)"
        return Term(sum(parts), known)

    @property
    def activation_total(self) -> Term | None:
        return None if self.activations is None else self.activations.total

    @property
    def fits(self) -> bool:
        return self.total.value <= self.cluster.gpu_memory_bytes

    def fits_with_headroom(self, headroom: float) -> bool:
        return self.total.value <= (1 - headroom) * self.cluster.gpu_memory_bytes

    @property
    def step_seconds(self) -> float | None:
        """Compute with communication overlapped (FSDP, ZeRO and DDP all overlap it), except
        the exposed part (the first gather, the last reduction, ZeRO's post-step gathers), plus
        offload copies, which are counted as not overlapped."""
        if self.compute is None:
            return None
        hidden = self.comm.seconds - self.comm.exposed_seconds
        return max(self.compute.value, hidden) + self.comm.exposed_seconds + self.comm.offload_seconds

    def to_json(self) -> dict[str, Any]:
        """Stable keys: tools and dashboards read these names."""
        acts, trans, comp = self.activation_total, self.transient, self.compute
        return {
            "strategy": self.job.strategy.value,
            "params": self.params,
            "gpus": self.cluster.gpus,
            "shard_group": self.shard_group,
            "parameters_bytes_per_gpu": self.states.parameters.value,
            "gradients_bytes_per_gpu": self.states.gradients.value,
            "optimizer_bytes_per_gpu": self.states.optimizer.value,
            "model_states_bytes_per_gpu": self.states.total.value,
            "activations_bytes_per_gpu": None if acts is None else acts.value,
            "transient_bytes_per_gpu": None if trans is None else trans.value,
            "overhead_bytes_per_gpu": self.overhead.value,
            "total_bytes_per_gpu": self.total.value,
            "host_bytes_per_gpu": self.states.host.value,
            "gpu_memory_bytes": self.cluster.gpu_memory_bytes,
            "fits": self.fits,
            "comm_bytes_per_gpu_per_step": self.comm.bytes_per_gpu,
            "comm_seconds_per_step": self.comm.seconds,
            "comm_latency_seconds_per_step": self.comm.latency_seconds,
            "comm_exposed_seconds_per_step": self.comm.exposed_seconds,
            "offload_bytes_per_gpu_per_step": self.comm.offload.value,
            "offload_seconds_per_step": self.comm.offload_seconds,
            "compute_seconds_per_step": None if comp is None else comp.value,
            "step_seconds": self.step_seconds,
            "formulas": {name: term.formula for name, term, _ in self.lines()},
        }

    def lines(self) -> list[tuple[str, Term, Unit]]:
        """(name, term, unit) for each line of the readable table, in order."""
        out: list[tuple[str, Term, Unit]] = [
            ("parameters", self.states.parameters, "bytes"),
            ("gradients", self.states.gradients, "bytes"),
            ("optimizer state", self.states.optimizer, "bytes"),
            ("model states", self.states.total, "bytes"),
        ]
        if self.activations is not None:
            out += [
                ("activations: blocks", self.activations.blocks, "bytes"),
                ("activations: head, logits", self.activations.outside, "bytes"),
            ]
            if self.activations.recompute.value:
                out.append(("activations: recompute", self.activations.recompute, "bytes"))
            out.append(("activations", self.activations.total, "bytes"))
        if self.transient is not None:
            out.append(("transient", self.transient, "bytes"))
        out += [("overhead", self.overhead, "bytes"), ("total", self.total, "bytes")]
        if self.states.host.value:
            out.append(("on host (offloaded)", self.states.host, "bytes"))
        comm = self.comm
        out.append(("communication", Term(comm.bytes_per_gpu, comm.formula()), "bytes"))
        time = Term(comm.seconds, "Σ bytes / bus bandwidth + launches · ring steps · hop latency")
        out.append(("communication time", time, "seconds"))
        out.append(
            (
                "exposed communication",
                Term(comm.exposed_seconds, "first gather + last reduction per pass + post-step gathers"),
                "seconds",
            )
        )
        if comm.offload.value:
            out.append(("offload traffic", comm.offload, "bytes"))
        if self.compute is not None:
            out.append(("compute time", self.compute, "seconds"))
        return out


def plan(model: ModelShape | int, cluster: ClusterSpec, job: TrainingJob) -> Plan:
    """Predict one job. `model` is a shape, or just a parameter count (then only model states
    and communication, which depend on Ψ alone, are computed)."""
    shape = model if isinstance(model, ModelShape) else None
    params = shape.total_params() if shape else model
    if not isinstance(params, int) or params < 1:
        raise PlanError(f"model.params must be a positive integer, got {params!r}")
    group = shard_group_size(job.strategy, cluster.gpus, cluster.gpus_per_node, job.shard_group)
    states = model_states(params, job.strategy, job.precision, job.optimizer, job.offload, group)
    e = job.precision.compute_bytes
    acts = compute = None
    units = None
    if shape is not None:
        acts = activations(
            shape, job.seq_len, job.micro_batch, e, job.flash_attention, job.checkpointing, job.checkpoint_every_k
        )
        compute = compute_seconds(step_flops(shape, job), cluster, job.precision)
        units = shape.deepspeed_units() if job.strategy.is_deepspeed else shape.fsdp_units(job.wrap)
    trans = transient(job.strategy, job.precision, job.offload, params, units, group, job.prefetch)
    dynamic = (acts.total.value if acts else 0.0) + (trans.value if trans else 0.0)
    overhead = Term(
        cluster.runtime_overhead_gib * GIB + cluster.fragmentation * dynamic,
        f"runtime {cluster.runtime_overhead_gib:g} GiB + fragmentation "
        f"{cluster.fragmentation:g}·(activations + transient = {gib(dynamic)})",
    )
    comm = communication(params, cluster, job, group, shape)
    return Plan(job, cluster, params, group, states, acts, trans, overhead, comm, compute)


@dataclass(frozen=True)
class Comparison:
    plans: list[Plan]
    headroom: float
    recommended: Plan | None
    reason: str

    def to_json(self) -> dict[str, Any]:
        best = self.recommended
        return {
            "headroom": self.headroom,
            "recommended": None if best is None else best.job.strategy.value,
            "reason": self.reason,
            "plans": [{**p.to_json(), "fits_with_headroom": p.fits_with_headroom(self.headroom)} for p in self.plans],
        }


def compare(model: ModelShape | int, cluster: ClusterSpec, job: TrainingJob, headroom: float = 0.10) -> Comparison:
    """Plan every strategy for the same job and recommend the cheapest that fits.

    Cheapest: the shortest predicted step, then the least communication, then the least
    memory. The job's offload applies where the strategy supports it (not ddp; nvme only
    with zero3).
    """
    if not 0 <= headroom < 1:
        raise PlanError(f"headroom must be in [0, 1), got {headroom!r}")
    plans = [plan(model, cluster, _for_strategy(job, s)) for s in Strategy]
    fitting = [p for p in plans if p.fits_with_headroom(headroom)]
    if not fitting:
        smallest = min(plans, key=lambda p: p.total.value)
        tight = [p.job.strategy.value for p in plans if p.fits]
        return Comparison(
            plans,
            headroom,
            None,
            (
                f"no strategy fits {cluster.gpu_memory_gib:g} GiB with {headroom:.0%} headroom; the "
                f"smallest is {smallest.job.strategy} at {gib(smallest.total.value)}"
                + (f" ({', '.join(tight)} fit without headroom, at the allocator's mercy)" if tight else "")
                + ". Add GPUs, offload, activation checkpointing or a smaller micro-batch."
            ),
        )
    best = min(fitting, key=_cost)
    return Comparison(plans, headroom, best, _why(best, plans, headroom))


def _for_strategy(job: TrainingJob, strategy: Strategy) -> TrainingJob:
    offload = job.offload
    if strategy is Strategy.DDP or (offload is Offload.NVME and strategy is not Strategy.ZERO3):
        offload = Offload.NONE
    return replace(job, strategy=strategy, offload=offload)


def _cost(p: Plan) -> tuple[float, float, float, int]:
    step = p.step_seconds if p.step_seconds is not None else p.comm.seconds + p.comm.offload_seconds
    order = list(Strategy).index(p.job.strategy)
    return (round(step, 9), round(p.comm.seconds, 9), p.total.value, order)


def _why(best: Plan, plans: list[Plan], headroom: float) -> str:
    limit = (1 - headroom) * best.cluster.gpu_memory_bytes
    parts = [
        f"{best.job.strategy} fits at {gib(best.total.value)} per GPU (limit {gib(limit)} = "
        f"{1 - headroom:.0%} of {best.cluster.gpu_memory_gib:g} GiB)"
    ]
    if best.step_seconds is not None and best.compute is not None:
        parts.append(
            f"its step takes {best.step_seconds:.3g} s (compute {best.compute.value:.3g} s, "
            f"communication {best.comm.seconds:.3g} s for {count(best.comm.bytes_per_gpu)} B)"
        )
    too_big = [p.job.strategy.value for p in plans if not p.fits_with_headroom(headroom)]
    if too_big:
        parts.append(f"too large: {', '.join(too_big)}")
    slower = sorted((p for p in plans if p is not best and p.fits_with_headroom(headroom)), key=_cost)
    if slower:
        runner = slower[0]
        base = best.comm.bytes_per_gpu
        ratio = runner.comm.bytes_per_gpu / base if base else 0.0
        parts.append(f"next best {runner.job.strategy} ({gib(runner.total.value)}, communicates {ratio:.2f}x as much)")
    return "; ".join(parts)
