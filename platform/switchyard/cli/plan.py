"""`switchyard plan`: memory per GPU, communication and time for a training job before it
runs; `--compare` plans every strategy and recommends the cheapest that fits.

The model comes from a preset, explicit dimensions, a job spec file or just `--params`.
Flags given on the command line override what a job spec says.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import fields, replace
from typing import Any

from switchyard.cli._output import fail, print_json, print_table
from switchyard.train.plan import (
    ClusterSpec,
    Comparison,
    ModelShape,
    Norm,
    OptimizerKind,
    Plan,
    PlanError,
    Precision,
    TrainingJob,
    compare,
    model_preset,
    plan,
    preset_names,
)
from switchyard.train.plan.hardware import GIB
from switchyard.train.strategy import CheckpointMode, Offload, Strategy, WrapGranularity

_SHAPE_FLAGS = ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab")
# argparse dest -> TrainingJob field, for flags that override a job spec.
_JOB_FLAGS = {
    "strategy": "strategy",
    "precision": "precision",
    "optimizer": "optimizer",
    "offload": "offload",
    "micro_batch": "micro_batch",
    "seq_len": "seq_len",
    "grad_accum": "grad_accum",
    "checkpointing": "checkpointing",
    "checkpoint_every_k": "checkpoint_every_k",
    "wrap": "wrap",
    "prefetch": "prefetch",
    "shard_group": "shard_group",
    "flash_attention": "flash_attention",
}
_CLUSTER_FLAGS = tuple(f.name for f in fields(ClusterSpec))


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "plan",
        help="predict memory, communication and time per GPU for a training job",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    model = p.add_argument_group("model (one of)")
    model.add_argument("--model", help="a preset name (see --list-presets)")
    model.add_argument("--params", type=float, help="only a parameter count (e.g. 70e9)")
    model.add_argument("--spec", help="a job spec YAML file (as submitted to the trainer)")
    for name in _SHAPE_FLAGS:
        model.add_argument(f"--{name.replace('_', '-')}", type=int, dest=name)
    model.add_argument(
        "--llama-style", action="store_true", help="with explicit dimensions: RMSNorm, no biases, SwiGLU, untied"
    )
    cluster = p.add_argument_group("cluster")
    cluster.add_argument("--gpus", type=int, help="data-parallel GPUs (default 8)")
    cluster.add_argument("--gpus-per-node", type=int)
    cluster.add_argument("--gpu-memory-gib", type=float)
    cluster.add_argument("--intra-node-gbps", type=float, help="NVLink bus bandwidth, GB/s")
    cluster.add_argument("--inter-node-gbps", type=float, help="network bus bandwidth of one NIC, GB/s")
    cluster.add_argument("--nics-per-node", type=int, help="NICs per node (default: one per GPU)")
    cluster.add_argument("--intra-node-latency-us", type=float, help="latency of one NVLink ring step")
    cluster.add_argument("--inter-node-latency-us", type=float, help="latency of one network ring step")
    cluster.add_argument("--pcie-gbps", type=float)
    cluster.add_argument("--peak-tflops", type=float)
    cluster.add_argument("--fp32-peak-tflops", type=float)
    cluster.add_argument("--mfu", type=float)
    cluster.add_argument("--runtime-overhead-gib", type=float)
    cluster.add_argument("--fragmentation", type=float)
    job = p.add_argument_group("job")
    job.add_argument("--strategy", type=Strategy, choices=list(Strategy), help="default zero3")
    job.add_argument("--offload", type=Offload, choices=list(Offload))
    job.add_argument("--precision", type=Precision, choices=list(Precision))
    job.add_argument("--optimizer", type=OptimizerKind, choices=list(OptimizerKind))
    job.add_argument("--micro-batch", type=int, help="sequences per GPU per pass (default 1)")
    job.add_argument("--seq-len", type=int, help="tokens per sequence (default 4096)")
    job.add_argument("--grad-accum", type=int)
    job.add_argument(
        "--checkpointing",
        type=CheckpointMode,
        choices=list(CheckpointMode),
        help="activation recomputation (default none)",
    )
    job.add_argument("--checkpoint-every-k", type=int)
    job.add_argument("--wrap", type=WrapGranularity, choices=list(WrapGranularity))
    job.add_argument("--prefetch", type=int)
    job.add_argument("--shard-group", type=int, help="fsdp-hybrid: GPUs per shard group")
    job.add_argument(
        "--no-flash-attention",
        dest="flash_attention",
        action="store_false",
        default=None,
        help="attention materialises the sxs score matrix",
    )
    p.add_argument("--compare", action="store_true", help="plan every strategy and recommend one")
    p.add_argument(
        "--headroom",
        type=float,
        default=0.10,
        help="fraction of GPU memory a recommendation leaves free (default 0.10)",
    )
    p.add_argument("--list-presets", action="store_true")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=run_plan)


def run_plan(args: argparse.Namespace) -> int:
    if args.list_presets:
        for name in preset_names():
            print(name)
        return 0
    try:
        model, label, cluster, job = _inputs(args)
        if args.compare:
            _show_comparison(compare(model, cluster, job, args.headroom), label, args.json)
        else:
            _show_plan(plan(model, cluster, job), label, args.json)
    except PlanError as exc:
        return fail(str(exc))
    return 0


def _inputs(args: argparse.Namespace) -> tuple[ModelShape | int, str, ClusterSpec, TrainingJob]:
    given = [n for n, v in (("--model", args.model), ("--params", args.params), ("--spec", args.spec)) if v is not None]
    dims = [n for n in _SHAPE_FLAGS if getattr(args, n) is not None]
    if dims:
        given.append("--layers/--hidden/...")
    if len(given) != 1:
        raise PlanError(
            f"give exactly one model source (--model, --params, --spec or dimensions); got {', '.join(given) or 'none'}"
        )
    job, gpus = TrainingJob(), None
    model: ModelShape | int
    if args.spec is not None:
        from switchyard.train.plan.from_spec import load_spec_input  # imports torch

        spec = load_spec_input(args.spec)
        model, label, job, gpus = spec.shape, args.spec, spec.job, spec.gpus
    elif args.model is not None:
        model, label = model_preset(args.model), args.model
    elif args.params is not None:
        if not math.isfinite(args.params) or args.params < 1 or args.params != int(args.params):
            raise PlanError(f"--params must be a positive whole number, got {args.params!r}")
        model, label = int(args.params), f"{args.params:.4g} parameters"
    else:
        model, label = _explicit_shape(args), "explicit dimensions"
    overrides = {f: getattr(args, d) for d, f in _JOB_FLAGS.items() if getattr(args, d) is not None}
    job = replace(job, **overrides)
    cluster_args = {n: getattr(args, n) for n in _CLUSTER_FLAGS if getattr(args, n) is not None}
    cluster_args.setdefault("gpus", gpus or 8)
    return model, label, ClusterSpec(**cluster_args), job


def _explicit_shape(args: argparse.Namespace) -> ModelShape:
    missing = [f"--{n.replace('_', '-')}" for n in _SHAPE_FLAGS if getattr(args, n) is None]
    if missing:
        raise PlanError(f"explicit dimensions need {', '.join(missing)} too")
    dims = {n: getattr(args, n) for n in _SHAPE_FLAGS}
    if args.llama_style:
        return ModelShape(**dims)
    return ModelShape(**dims, gated_ffn=False, bias=True, norm=Norm.LAYERNORM, tied_embeddings=True, fused_qkv=True)


def _value(term_value: float, unit: str) -> str:
    if unit == "seconds":
        return f"{term_value:.3g} s"
    return f"{term_value / GIB:,.2f} GiB"


def _header(p: Plan, label: str) -> str:
    j, c = p.job, p.cluster
    return (
        f"{label}: Ψ = {p.params:,} parameters; {c.gpus} GPUs ({c.gpus_per_node}/node, "
        f"{c.gpu_memory_gib:g} GiB); {j.precision}, {j.optimizer}, micro-batch {j.micro_batch}"
        f" * {j.seq_len} tokens, checkpointing {j.checkpointing}"
    )


def _show_plan(p: Plan, label: str, as_json: bool) -> None:
    if as_json:
        print_json({"model": label, **p.to_json()})
        return
    print(_header(p, label) + f", strategy {p.job.strategy}, offload {p.job.offload}")
    print("N = GPUs sharing a state; U = largest unit gathered at once, U_p = unit prefetched")
    print()
    print_table(
        ["line", "per GPU", "formula"], [(name, _value(t.value, unit), t.formula) for name, t, unit in p.lines()]
    )
    fits = "fits" if p.fits else "does NOT fit"
    print(
        f"\n{fits} in {p.cluster.gpu_memory_gib:g} GiB; step ≈ "
        + ("unknown (only Ψ given)" if p.step_seconds is None else f"{p.step_seconds:.3g} s")
    )


def _show_comparison(c: Comparison, label: str, as_json: bool) -> None:
    if as_json:
        print_json({"model": label, **c.to_json()})
        return
    print(_header(c.plans[0], label))
    print()
    rows = []
    for p in c.plans:
        a, t = p.activation_total, p.transient
        rows.append(
            (
                p.job.strategy.value + ("" if p.job.offload is Offload.NONE else f" +{p.job.offload}"),
                _value(p.states.total.value, "bytes"),
                "-" if a is None else _value(a.value, "bytes"),
                "-" if t is None else _value(t.value, "bytes"),
                _value(p.total.value, "bytes"),
                "yes" if p.fits_with_headroom(c.headroom) else ("tight" if p.fits else "no"),
                _value(p.comm.bytes_per_gpu, "bytes"),
                f"{p.comm.seconds:.3g} s",
                "-" if p.step_seconds is None else f"{p.step_seconds:.3g} s",
            )
        )
    print_table(
        ["strategy", "model states", "activations", "transient", "total", "fits", "comm/step", "comm time", "step"],
        rows,
    )
    name = "none" if c.recommended is None else c.recommended.job.strategy.value
    print(f"\nrecommended: {name}: {c.reason}")
