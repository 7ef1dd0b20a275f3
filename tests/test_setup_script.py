"""`scripts/setup.sh` checks the machine before it installs anything, and says how to fix it.

Run on a copy of the script in an empty checkout, never on the repo's: nothing here may touch
the real `.venv`. The PATH is a folder of links to exactly the tools the script needs."""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BASE_TOOLS = ("dirname", "cat", "sha256sum", "cut", "make", "c++")


def checkout(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    (root / "scripts").mkdir(parents=True)
    shutil.copy(REPO / "scripts" / "setup.sh", root / "scripts" / "setup.sh")
    shutil.copy(REPO / "pyproject.toml", root / "pyproject.toml")
    return root


def tool_dir(tmp_path: Path, tools: tuple[str, ...], python: str | None = sys.executable) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in tools:
        found = shutil.which(name)
        assert found is not None, f"test setup: {name} is not on this machine"
        (bin_dir / name).symlink_to(found)
    if python is not None:
        # The real interpreter, not a venv's or a pyenv shim (a shim needs pyenv on the PATH).
        (bin_dir / "python3").symlink_to(Path(python).resolve())
    return bin_dir


def run_setup(root: Path, bin_dir: Path) -> subprocess.CompletedProcess[str]:
    env = {"PATH": str(bin_dir), "HOME": str(root)}
    return subprocess.run(
        ["/bin/bash", str(root / "scripts" / "setup.sh")], env=env, capture_output=True, text=True, timeout=30
    )


def test_a_missing_compiler_stops_setup_before_pip(tmp_path: Path) -> None:
    root = checkout(tmp_path)
    tools = tuple(t for t in BASE_TOOLS if t != "c++")
    done = run_setup(root, tool_dir(tmp_path, tools))
    assert done.returncode == 1, done.stderr
    assert "no C++ compiler (c++ or g++)" in done.stderr
    assert "  apt-get install -y build-essential\n" in done.stderr
    assert "nothing was installed" in done.stderr
    assert not (root / ".venv").exists()  # no venv, so pip never ran
    assert "pip" not in done.stdout + done.stderr


def test_every_missing_piece_is_named_in_one_apt_get_line(tmp_path: Path) -> None:
    root = checkout(tmp_path)
    done = run_setup(root, tool_dir(tmp_path, ("dirname", "cat", "sha256sum", "cut"), python=None))
    assert done.returncode == 1
    assert "no python3: switchyard needs Python 3.11" in done.stderr and "no make" in done.stderr
    assert "  apt-get install -y python3.11 python3.11-venv make build-essential\n" in done.stderr
    assert not (root / ".venv").exists()


def test_a_python_without_ensurepip_is_told_to_install_venv(tmp_path: Path) -> None:
    root = checkout(tmp_path)
    bin_dir = tool_dir(tmp_path, BASE_TOOLS, python=None)
    # A Debian-like python3: the real interpreter, with ensurepip hidden.
    shadow = tmp_path / "shadow"
    (shadow / "ensurepip").mkdir(parents=True)
    (shadow / "ensurepip" / "__init__.py").write_text("raise ImportError('ensurepip is not installed')\n")
    wrapper = bin_dir / "python3"
    wrapper.write_text(f'#!/bin/bash\nPYTHONPATH={shadow} exec {Path(sys.executable).resolve()} "$@"\n')
    wrapper.chmod(0o755)
    done = run_setup(root, bin_dir)
    assert done.returncode == 1
    assert "cannot create a virtual environment" in done.stderr
    assert "  apt-get install -y python3.11-venv\n" in done.stderr
    assert not (root / ".venv").exists()


def test_the_checked_python_version_is_pyprojects() -> None:
    text = (REPO / "pyproject.toml").read_text()
    script = (REPO / "scripts" / "setup.sh").read_text()
    wanted = re.search(r"^PY_WANT=(\S+)", script, re.M)
    assert wanted is not None
    assert f'requires-python = ">={wanted[1]},' in text
    assert f"{sys.version_info.major}.{sys.version_info.minor}" == wanted[1]


def test_checks_run_before_the_stamp_fast_path(tmp_path: Path) -> None:
    """An installed checkout still gets the checks (they are cheap), then exits at the stamp."""
    root = checkout(tmp_path)
    venv_bin = root / ".venv" / "bin"
    venv_bin.mkdir(parents=True)
    (venv_bin / "python").symlink_to(Path(sys.executable).resolve())
    stamp_inputs = (root / "pyproject.toml").read_bytes() + (root / "scripts" / "setup.sh").read_bytes()
    want = hashlib.sha256(stamp_inputs).hexdigest() + "\n"
    (root / ".venv" / ".switchyard-installed").write_text(want)
    assert run_setup(root, tool_dir(tmp_path, BASE_TOOLS)).returncode == 0  # installed: the stamp says so
    shutil.rmtree(tmp_path / "bin")
    tools = tuple(t for t in BASE_TOOLS if t != "c++")
    assert run_setup(root, tool_dir(tmp_path, tools)).returncode == 1
