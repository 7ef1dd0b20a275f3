"""Which parameters ZeRO-3 gathers, per micro-batch and per step, as DeepSpeed 0.19 decides it
with the trainer's config (its defaults for these two settings):

- a parameter of at most `stage3_param_persistence_threshold` (1e5) elements is persistent:
  gathered once and kept; only the optimizer step changes it, after which DeepSpeed
  all-gathers the persistent parameters again, once per step;
- any other parameter is gathered when its module runs, and released afterwards unless
  the module trace (forward, then backward in reverse) uses it again within
  `stage3_max_reuse_distance` (1e9) elements of parameters
  (`PartitionedParameterCoordinator.__params_to_release`). Everything is released at the
  end of backward, so every micro-batch gathers again.

For a large model every block's parameters are released after forward and gathered again in
backward (2Ψ per micro-batch); for a small one the backward gather never happens and the
persistent parameters are gathered once per step. The module trace comes from the shape.
"""

from __future__ import annotations

from dataclasses import dataclass

from switchyard.train.plan.shape import ModelShape, Norm

PERSISTENCE_THRESHOLD = 100_000
"""DeepSpeed's `stage3_param_persistence_threshold` default (elements)."""
MAX_REUSE_DISTANCE = 1_000_000_000
"""DeepSpeed's `stage3_max_reuse_distance` default (elements)."""

Module = tuple[tuple[str, int], ...]
"""One leaf module: its own parameters as (name, elements)."""


def module_trace(shape: ModelShape) -> list[Module]:
    """Leaf modules with parameters, in forward order (the switchyard GPT's, or a Llama's)."""
    h, f, kv, V = shape.hidden, shape.ffn, shape.kv_width, shape.vocab

    def linear(name: str, n_in: int, n_out: int) -> Module:
        weight = ((f"{name}.w", n_in * n_out),)
        return weight + (((f"{name}.b", n_out),) if shape.bias else ())

    def norm(name: str) -> Module:
        return ((f"{name}.w", h),) + (((f"{name}.b", h),) if shape.norm is Norm.LAYERNORM else ())

    trace: list[Module] = [(("tok", V * h),)]
    if shape.positions:
        trace.append((("pos", shape.positions * h),))
    for i in range(shape.layers):
        qkv = (
            [linear(f"{i}.qkv", h, h + 2 * kv)]
            if shape.fused_qkv
            else [linear(f"{i}.q", h, h), linear(f"{i}.k", h, kv), linear(f"{i}.v", h, kv)]
        )
        gate = [linear(f"{i}.gate", h, f)] if shape.gated_ffn else []
        trace += [norm(f"{i}.n1"), *qkv, linear(f"{i}.o", h, h), norm(f"{i}.n2"), *gate]
        trace += [linear(f"{i}.up", h, f), linear(f"{i}.down", f, h)]
    trace.append(norm("final"))
    trace.append((("tok", V * h),) if shape.tied_embeddings else linear("head", h, V))
    return trace


@dataclass(frozen=True)
class Zero3Gathers:
    per_micro_batch: int
    """Elements of non-persistent parameters all-gathered in one forward and backward."""
    calls_per_micro_batch: int
    """Modules whose gather launches a collective."""
    persistent: int
    """Elements of persistent parameters, all-gathered once per step after the optimizer step."""
    first_module: int
    """Elements the first gather of a micro-batch moves: nothing overlaps it."""


def zero3_gathers(shape: ModelShape) -> Zero3Gathers:
    forward = module_trace(shape)
    trace = forward + forward[::-1]
    sizes = dict(p for module in forward for p in module)
    persistent = {name for name, n in sizes.items() if n <= PERSISTENCE_THRESHOLD}
    # prefix[t] = elements of the modules before trace position t.
    prefix = [0]
    for module in trace:
        prefix.append(prefix[-1] + sum(n for _, n in module))
    next_use: dict[str, int] = {}
    kept_after: list[set[str]] = [set() for _ in trace]
    for t in range(len(trace) - 1, -1, -1):
        for name, _ in trace[t]:
            later = next_use.get(name)
            # Kept when the modules in between hold fewer than the reuse distance.
            if later is not None and prefix[later] - prefix[t + 1] < MAX_REUSE_DISTANCE:
                kept_after[t].add(name)
            next_use[name] = t
    available: set[str] = set()
    gathered = calls = first = 0
    for t, module in enumerate(trace):
        fetch = [(name, n) for name, n in module if name not in persistent and name not in available]
        if fetch:
            calls += 1
            gathered += sum(n for _, n in fetch)
            first = first or sum(n for _, n in fetch)
        available |= {name for name, _ in fetch}
        available -= {name for name, _ in module} - kept_after[t]
    return Zero3Gathers(gathered, calls, sum(sizes[name] for name in persistent), first)
