"""`switchyard plan`: stable JSON keys, a table with formulas, and errors that name the input."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from switchyard.cli import plan as plan_cli

REQUIRED_KEYS = {
    "model_states_bytes_per_gpu", "parameters_bytes_per_gpu", "gradients_bytes_per_gpu",
    "optimizer_bytes_per_gpu", "activations_bytes_per_gpu", "transient_bytes_per_gpu",
    "total_bytes_per_gpu", "comm_bytes_per_gpu_per_step", "comm_seconds_per_step",
    "compute_seconds_per_step", "fits",
}


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser()
    plan_cli.register(parser.add_subparsers())
    args = parser.parse_args(["plan", *argv])
    code = args.handler(args)
    out, err = capsys.readouterr()
    return code, out, err


def test_json_has_the_stable_keys(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(["--model", "llama3-70b", "--gpus", "64", "--strategy", "zero3",
                         "--checkpointing", "full", "--json"], capsys)
    assert code == 0
    data = json.loads(out)
    assert set(data) >= REQUIRED_KEYS
    # 18Ψ/64 = 19,843,229,952 (fp32 gradient partitions)
    assert data["model_states_bytes_per_gpu"] == pytest.approx(19_843_229_952)
    assert data["fits"] is True
    assert set(data["formulas"]) >= {"parameters", "total", "communication"}


def test_table_shows_the_formula_per_line(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(["--model", "llama3-8b", "--strategy", "zero1"], capsys)
    assert code == 0
    assert "12·Ψ/N = 12·8.03e9/8" in out
    assert "formula" in out and "fits in 80 GiB" in out


def test_compare_prints_a_recommendation(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(["--model", "llama3-70b", "--gpus", "32", "--compare",
                         "--checkpointing", "full"], capsys)
    assert code == 0
    assert "recommended: fsdp-full" in out
    code, out, _ = _run(["--params", "70e9", "--gpus", "64", "--compare", "--json"], capsys)
    assert json.loads(out)["plans"][0]["activations_bytes_per_gpu"] is None


def test_explicit_dimensions(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(["--layers", "32", "--hidden", "4096", "--heads", "32", "--kv-heads",
                         "8", "--ffn", "14336", "--vocab", "128256", "--llama-style", "--json"],
                        capsys)
    assert code == 0
    assert json.loads(out)["params"] == 8_030_261_248


def test_job_spec_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text(
        "name: tiny-fsdp\nsteps: 10\nnum_workers: 2\nmodel: {preset: tiny}\n"
        "data: {seq_len: 64, micro_batch_size: 4}\nparallel: {strategy: fsdp-full}\n"
    )
    code, out, _ = _run(["--spec", str(spec), "--json"], capsys)
    assert code == 0
    data = json.loads(out)
    # the tiny GPT, 124,736 parameters, fp32 on CPU ("auto"), sharded over 2 workers:
    # (4 + 4 + 8)·124,736/2 = 997,888
    assert (data["gpus"], data["strategy"]) == (2, "fsdp-full")
    assert data["model_states_bytes_per_gpu"] == pytest.approx(997_888)
    code, out, _ = _run(["--spec", str(spec), "--strategy", "ddp", "--json"], capsys)
    assert json.loads(out)["strategy"] == "ddp"  # a flag overrides the file


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--model", "llama9"], "unknown model preset 'llama9'"),
        (["--model", "llama3-8b", "--params", "8e9"], "exactly one model source"),
        (["--layers", "2"], "--hidden"),
        (["--params", "1.5"], "--params"),
        (["--spec", "/nonexistent/job.yaml"], "/nonexistent/job.yaml"),
        (["--model", "llama3-8b", "--micro-batch", "0"], "job.micro_batch"),
        # Found by a generated fuzz of the flags (stop 44): an infinite --params raised
        # OverflowError; an infinite or NaN cluster figure was planned with, and printed as
        # `inf` GiB; a FLOP rate times an MFU that underflows to 0 was divided by; a billion
        # layers used the machine's 24 GB until the kernel killed it.
        (["--params", "inf"], "--params must be a positive whole number"),
        (["--params", "8e9", "--gpu-memory-gib", "inf"], "cluster.gpu_memory_gib must be a finite number"),
        (["--params", "8e9", "--intra-node-latency-us", "nan"], "cluster.intra_node_latency_us must be a finite"),
        (["--model", "gpt-small", "--peak-tflops", "1e-300", "--mfu", "1e-300"],
         "cluster.peak_tflops must be at least"),
        (["--layers", "1000000000", "--hidden", "4096", "--heads", "32", "--kv-heads", "8", "--ffn", "14336",
          "--vocab", "128256", "--llama-style", "--compare"],
         "model.layers must be at most 10,000, got 1,000,000,000"),
    ],
)
def test_errors_name_the_input(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = _run(argv, capsys)
    assert code == 2
    assert message in err


def test_registered_with_the_switchyard_command(capsys: pytest.CaptureFixture[str]) -> None:
    from switchyard.cli import main

    assert main(["plan", "--params", "8e9", "--json"]) == 0
    assert "model_states_bytes_per_gpu" in capsys.readouterr().out
