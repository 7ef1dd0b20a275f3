"""The planner against DeepSpeed's own memory estimators, on the same shapes.

DeepSpeed's `_cold` estimators take parameter counts, so 70B needs no memory; in 0.19.8 they
print a table (per CPU | per GPU, in GiB though labelled GB) and return None, so the test
reads the printed per-GPU column and, for exact arithmetic, the functions they print from.

The planner models the trainer's DeepSpeed config, which accumulates and reduces gradients
in fp32 at stages 2 and 3; where DeepSpeed's estimators assume otherwise, the difference is
derived and asserted exactly:
- ZeRO-2, no offload. DeepSpeed: 2Ψ + 18Ψ/N ("2 params_16bit; 18 = 2 grads_16bit +
  4 grads_32bit + 4 params_32bit + 8 optimizer states"). Planner: 2Ψ + (4 + 12)Ψ/N: the
  trainer accumulates the gradient partition in fp32 and never holds a 16-bit one, so
  DeepSpeed's figure is exactly 2Ψ/N larger. The planner's transient is the two 16-bit
  reduce buckets `overlap_comm` keeps (2·5e8·2 bytes).
- ZeRO-3, no offload. DeepSpeed: 4·P_layer + 18Ψ/N, P_layer its largest layer. Planner:
  the same 18Ψ/N (2 params_16bit + 4 grads_32bit + 12 optimizer), and a transient of
  8·P_layer with no prefetch: one gathered 16-bit layer (2·P_layer), its 16-bit gradient
  (2·P_layer) and that gradient's fp32 copy for the fp32 reduce-scatter (4·P_layer), which
  DeepSpeed's 4·P_layer leaves out.
- With offload, DeepSpeed keeps 2Ψ (ZeRO-2) and 4·P_layer (ZeRO-3) on the GPU; the planner
  adds the fp32 gradient partition ZeRO-2 accumulates on the GPU (4Ψ/N) and the fp32
  copy of ZeRO-3's layer gradient (4·P_layer).
"""

from __future__ import annotations

import contextlib
import io
import re

import pytest

from switchyard.train.plan import ClusterSpec, TrainingJob, model_preset, plan
from switchyard.train.plan.hardware import GIB
from switchyard.train.plan.job import Precision
from switchyard.train.plan.transient import transient
from switchyard.train.strategy import Offload, Strategy

stage12 = pytest.importorskip("deepspeed.runtime.zero.stage_1_and_2")
stage3 = pytest.importorskip("deepspeed.runtime.zero.stage3")

SHAPES = ["llama3-8b", "llama3-70b", "llama3-405b"]
GPUS = [8, 16, 32, 64]
ROW = re.compile(r"^\s*([\d.]+)GB \|\s*([\d.]+)GB \| (.+)$")


def _printed_per_gpu(estimator: object, *args: object, **kwargs: object) -> dict[str, float]:
    """{options: per-GPU bytes} from a `_cold` estimator's table."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        returned = estimator(*args, **kwargs)  # type: ignore[operator]
    assert returned is None  # if DeepSpeed starts returning numbers, read them instead
    rows = {}
    for line in out.getvalue().splitlines():
        match = ROW.match(line)
        if match:
            rows[match.group(3).replace("OffloadDeviceEnum.cpu", "cpu")] = (
                float(match.group(2)) * GIB
            )
    return rows


def _zero(name: str, gpus: int, strategy: Strategy, offload: Offload = Offload.NONE):  # type: ignore[no-untyped-def]
    job = TrainingJob(strategy=strategy, offload=offload, prefetch=0)
    return plan(model_preset(name), ClusterSpec(gpus=gpus), job)


@pytest.mark.parametrize("name", SHAPES)
@pytest.mark.parametrize("gpus", GPUS)
def test_zero2_differs_from_deepspeed_by_the_16bit_gradient_partition(name: str, gpus: int) -> None:
    p = _zero(name, gpus, Strategy.ZERO2)
    psi, nodes = p.params, gpus // 8
    printed = _printed_per_gpu(
        stage12.estimate_zero2_model_states_mem_needs_all_cold, psi, 8, nodes
    )
    _, exact = stage12.estimate_zero2_model_states_mem_needs(psi, 8, nodes, cpu_offload=False)
    assert printed["offload_optimizer=none"] == pytest.approx(exact, abs=0.006 * GIB)
    # 2Ψ + 4Ψ/N (fp32 gradient partition) + 12Ψ/N; DeepSpeed adds a 16-bit one, 2Ψ/N.
    assert p.states.total.value == pytest.approx(2 * psi + 16 * psi / gpus, rel=1e-12)
    assert exact - p.states.total.value == pytest.approx(2 * psi / gpus, abs=1.0)
    # The planner's transient: two 16-bit reduce buckets of 5e8 elements (overlap_comm).
    assert p.transient is not None
    assert p.transient.value == 2 * 500_000_000 * 2


@pytest.mark.parametrize("name", SHAPES)
@pytest.mark.parametrize("gpus", GPUS)
def test_zero3_matches_deepspeed_plus_the_fp32_copy_of_one_layer_gradient(name: str, gpus: int) -> None:
    shape = model_preset(name)
    p = _zero(name, gpus, Strategy.ZERO3)
    psi, layer, nodes = p.params, shape.largest_module_params(), gpus // 8
    printed = _printed_per_gpu(
        stage3.estimate_zero3_model_states_mem_needs_all_cold, psi, layer, 8, nodes
    )
    _, exact, _ = stage3.estimate_zero3_model_states_mem_needs(
        psi, layer, 8, nodes, cpu_offload=False, cpu_offload_params=False
    )
    assert printed["offload_param=none, offload_optimizer=none, zero_init=1"] == pytest.approx(
        exact, abs=0.006 * GIB
    )
    assert p.states.total.value == pytest.approx(18 * psi / gpus, rel=1e-12)  # = DeepSpeed's
    assert p.transient is not None
    # one 16-bit layer, its 16-bit gradient and that gradient's fp32 copy
    assert p.transient.value == 8 * layer
    assert (p.states.total.value + p.transient.value) - exact == pytest.approx(4 * layer, abs=1.0)


@pytest.mark.parametrize("name", SHAPES)
def test_offload_matches_deepspeed_exactly(name: str) -> None:
    gpus, nodes = 64, 8
    z2 = _zero(name, gpus, Strategy.ZERO2, Offload.CPU)
    z3 = _zero(name, gpus, Strategy.ZERO3, Offload.CPU)
    layer = model_preset(name).largest_module_params()
    _, ds2 = stage12.estimate_zero2_model_states_mem_needs(z2.params, 8, nodes, cpu_offload=True)
    _, ds3, _ = stage3.estimate_zero3_model_states_mem_needs(
        z3.params, layer, 8, nodes, cpu_offload=True, cpu_offload_params=True
    )
    # ZeRO-2 accumulates its fp32 gradient partition on the GPU before the host copy.
    assert ds2 == 2 * z2.params
    assert z2.states.total.value == pytest.approx(ds2 + 4 * z2.params / gpus, rel=1e-12)
    # ZeRO-3 adds the fp32 copy of the layer gradient for the fp32 reduce-scatter.
    assert z3.transient is not None
    assert ds3 == 4 * layer
    assert z3.states.total.value + z3.transient.value == ds3 + 4 * layer


def test_transient_without_units_is_unknown() -> None:
    # Only Ψ known: ZeRO-3's gathered units cannot be sized, and the planner says so.
    assert transient(Strategy.ZERO3, Precision.BF16, Offload.NONE, 10**9, None, 8, 1) is None
