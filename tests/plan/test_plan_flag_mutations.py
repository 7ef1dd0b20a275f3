"""`switchyard plan` with generated flags: a model from a preset, a parameter count or explicit
dimensions, then one to four flags set to values of every kind (zero, negative, huge, a
fraction, not finite, not a number). The plan must either print finite figures or stop with an
error (exit 2) that names the input, never with a traceback or a machine's worth of memory.

Found by the first version of this test, run as a script (stop 44): `--params inf` raised
OverflowError, an infinite or NaN cluster figure was planned with and printed (`inf GiB`), and
`--layers 1000000000` used 24 GB until the kernel killed the process, and a run at scale found
`--peak-tflops 1e-300 --mfu 1e-300` divided by zero (`test_plan_cli.py` keeps those cases).
Pure: `make test` runs `examples(40)`.
"""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from switchyard.cli import main
from tests.examples import examples

MODELS = (
    ["--model", "gpt-small"],
    ["--model", "llama3-8b"],
    ["--params", "70e9"],
    ["--layers", "32", "--hidden", "4096", "--heads", "32", "--kv-heads", "8", "--ffn", "14336", "--vocab", "128256"],
)
NUMBER_FLAGS = (
    *("--params", "--layers", "--hidden", "--heads", "--kv-heads", "--ffn", "--vocab", "--gpus", "--gpus-per-node"),
    *("--gpu-memory-gib", "--intra-node-gbps", "--inter-node-gbps", "--nics-per-node", "--intra-node-latency-us"),
    *("--inter-node-latency-us", "--pcie-gbps", "--peak-tflops", "--fp32-peak-tflops", "--mfu"),
    *("--runtime-overhead-gib", "--fragmentation", "--micro-batch", "--seq-len", "--grad-accum"),
    *("--checkpoint-every-k", "--prefetch", "--shard-group", "--headroom"),
)
CHOICES = {
    "--strategy": ("ddp", "fsdp-full", "fsdp-grad-op", "fsdp-no-shard", "fsdp-hybrid", "zero1", "zero2", "zero3"),
    "--offload": ("none", "cpu", "nvme"),
    "--precision": ("bf16", "fp16", "fp32"),
    "--checkpointing": ("none", "full", "every-k", "selective", "op"),
    "--wrap": ("block", "layer", "root"),
}
VALUES = (
    *("0", "-1", "1", "3", "7", "0.5", "1.5", "65536", "1000000000", "99999999999999999999999"),
    *("1e12", "1e30", "1e-300", "1e400", "nan", "inf", "-inf", "70e9", "70B", "x"),
)


def _finite(value: object) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    if isinstance(value, list):
        return all(_finite(v) for v in value)
    return True


@settings(
    max_examples=examples(40),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_generated_flags_plan_finite_figures_or_are_refused(
    capsys: pytest.CaptureFixture[str], data: st.DataObject
) -> None:
    argv = ["plan", *data.draw(st.sampled_from(MODELS), label="model")]
    for _ in range(data.draw(st.integers(1, 4), label="flags")):
        flag = data.draw(st.sampled_from((*NUMBER_FLAGS, *CHOICES)), label="flag")
        argv += [flag, data.draw(st.sampled_from(CHOICES.get(flag, VALUES)), label=flag)]
    argv += data.draw(st.sampled_from(([], ["--compare"])), label="compare")
    capsys.readouterr()
    try:
        code = main([*argv, "--json"])
    except SystemExit as exc:  # argparse: a value of the wrong type, named by its flag
        code = exc.code
    out, err = capsys.readouterr()
    assert "Traceback" not in err, err
    assert code in (0, 2), f"{argv}: exit {code}: {err}"
    if code == 0:
        assert _finite(json.loads(out)), f"{argv}: figures that are not finite: {out[:400]}"
    else:
        assert err.startswith(("switchyard: error:", "usage:")), f"{argv}: {err}"
