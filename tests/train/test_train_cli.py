from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from _workers import tiny_spec

from switchyard.cli import main
from switchyard.train.preemption import FilePreemptionChannel

REPO = Path(__file__).resolve().parents[2]


def _in_a_fresh_shell(argv: list[str], home: Path, state: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`argv` from the repo root with only what a fresh shell has (no AWS credentials: none are
    looked for on the network either)."""
    env = {"PYTHONPATH": f"{REPO / 'platform'}:{REPO}", "PATH": "/usr/bin:/bin", "HOME": str(home)}
    env["AWS_EC2_METADATA_DISABLED"] = "true"
    if state is not None:
        env["SWITCHYARD_STATE_DIR"] = str(state)
    return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=300, env=env)


def test_cli_rejects_a_bad_config_naming_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nsteps: 0\n")
    assert main(["train", "run", str(bad)]) == 2
    assert "bad.yaml: steps" in capsys.readouterr().err


def test_run_entry_point_preempts_with_exit_75_then_resumes_and_profiles(tmp_path: Path) -> None:
    """`python -m train_jobs.run CONFIG --local 2`: a pending notice stops the job after
    step 1 (exit 75, resumable); the rerun resumes, finishes, and ends with the JSON line;
    `--profile` prints collective vs compute time per step."""
    config = tmp_path / "job.yaml"
    spec = tiny_spec("cli", steps=2, **{"parallel.strategy": "fsdp-full", "checkpoint.resume": True})
    config.write_text(yaml.safe_dump(spec.model_dump(mode="json")))
    state = tmp_path / "state"
    channel = FilePreemptionChannel(state / "train" / "notices")
    channel.send_notice("cli", "make room")

    def run(*extra: str) -> tuple[int, list[str], str]:
        argv = [sys.executable, "-m", "train_jobs.run", str(config), "--local", "2"]
        proc = _in_a_fresh_shell([*argv, "--storage", str(tmp_path / "ckpt"), *extra], tmp_path, state=state)
        return proc.returncode, proc.stdout.strip().splitlines(), proc.stderr[-3000:]

    code, lines, err = run()
    assert code == 75, err
    first = json.loads(lines[-1])
    assert (first["status"], first["step"], first["resumable"]) == ("preempted", 1, True)
    assert first["reason"] == "make room"
    channel.clear("cli")
    code, lines, err = run("--profile", str(tmp_path / "prof"))
    assert code == 0, err
    result = json.loads(lines[-1])
    assert result["status"] == "completed" and result["step"] == 2
    assert result["resumed_from"] == first["checkpoint"]
    assert result["checkpoint"] == f"{tmp_path / 'ckpt'}/cli/step-00000002"
    assert any(line.startswith("step 2: total=") and "all_gather=" in line for line in lines)
    assert (tmp_path / "prof" / "trace-rank0.json").is_file()


def test_sweep_with_gpus_needs_a_team(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from train_jobs.sweep import main as sweep_main

    monkeypatch.delenv("SWITCHYARD_TEAM", raising=False)
    config = str(REPO / "train_jobs" / "configs" / "ddp.yaml")
    assert sweep_main([config, "--gpus-per-trial", "1"]) == 2
    assert "--team" in capsys.readouterr().err
    assert sweep_main([config, "--gpus-per-trial", "-1", "--team", "research"]) == 2
    assert "--gpus-per-trial must be 0 or more, got -1" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--lr", "inf"], "the trial of --lr inf --batch-size 2: optim.lr: Input should be a finite number"),
        (["--lr", "0"], "the trial of --lr 0.0 --batch-size 2: optim.lr: Input should be greater than 0"),
        (["--batch-size", "4", "0"], "the trial of --lr 0.001 --batch-size 0: data.micro_batch_size: Input should be"),
    ],
)
def test_sweep_refuses_a_trial_no_spec_allows_before_starting_ray(
    flags: list[str], expected: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each trial failed in Tune (`--lr 0`, `--batch-size 0`), or trained to a NaN loss
    (`--lr inf`), then the sweep raised with every trial's traceback, after starting Ray."""
    import ray

    from train_jobs.sweep import main as sweep_main

    def no_ray(*args: object, **kwargs: object) -> None:
        raise AssertionError("Ray started for a sweep no trial of which can run")

    monkeypatch.setattr(ray, "init", no_ray)
    config = str(REPO / "train_jobs" / "configs" / "ddp.yaml")
    assert sweep_main([config, *flags]) == 2
    assert capsys.readouterr().err.startswith(f"train_jobs.sweep: {expected}")


def test_a_spec_with_an_infinite_number_is_refused_at_its_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "job.yaml"
    text = (REPO / "train_jobs" / "configs" / "ddp.yaml").read_text()
    config.write_text(text.replace("lr: 3.0e-3", "lr: .inf"))
    assert main(["train", "run", str(config)]) == 2
    assert "job.yaml" in (err := capsys.readouterr().err) and "optim.lr" in err and "finite" in err


def _damaged_only_checkpoint(root: Path) -> None:
    folder = root / "input" / "step-00000003"
    folder.mkdir(parents=True)
    (folder / "manifest.json").write_text('{"format": "dcp", "step": 3, "files": {"x": {"size": -1}}}')


@pytest.mark.parametrize("command", ["switchyard train run", "python -m train_jobs.run"])
def test_a_job_whose_data_or_checkpoints_cannot_be_used_fails_in_one_line(tmp_path: Path, command: str) -> None:
    """Bad data (a shard of an odd size, ids past the vocabulary), checkpoints none of which
    can be resumed, or a checkpoint store that cannot be read (S3 without credentials): the
    launcher exits 2 with one line naming the file or store and the problem. Each printed two
    nested tracebacks (torch's spawn error around the rank's), exit 1."""
    odd = tmp_path / "odd"
    odd.mkdir()
    (odd / "shard.bin").write_bytes(b"abc")
    data = tiny_spec("input", steps=2, num_workers=2, **{"data.source": str(odd)})
    resume = tiny_spec("input", steps=2, num_workers=2, **{"checkpoint.resume": True})
    local = str(tmp_path / "ckpt")
    cases = [
        (data, local, f"{odd / 'shard.bin'}: size 3 is not a whole number of uint16 tokens"),
        (resume, local, "1 checkpoint(s) under"),
        (resume, "s3://nobucket/jobs", "the checkpoint store s3://nobucket/jobs/input cannot be read: NoCredentials"),
    ]
    _damaged_only_checkpoint(tmp_path / "ckpt")
    for spec, storage, expected in cases:
        config = tmp_path / "job.yaml"
        config.write_text(yaml.safe_dump(spec.model_dump(mode="json")))
        argv = (
            [sys.executable, "-m", "switchyard.cli", "train", "run", str(config), "--nproc", "2"]
            if command.startswith("switchyard")
            else [sys.executable, "-m", "train_jobs.run", str(config), "--local", "2"]
        )
        proc = _in_a_fresh_shell([*argv, "--storage", storage], tmp_path)
        assert proc.returncode == 2, proc.stderr[-3000:]
        assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
        last = proc.stderr.strip().splitlines()[-1]
        assert expected in last and (last.startswith("switchyard: error: ") or last.startswith("train_jobs.run: "))
        if spec is resume and storage == local:
            assert "step-00000003: manifest.json: files/x/size: Input should be greater than or equal to 0" in last
