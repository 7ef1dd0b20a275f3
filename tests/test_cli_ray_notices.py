"""A CLI command's stdout is its own output: Ray's driver prints the raylet's cluster-wide
notices ("WARNING: 10 PYTHON worker processes have been started ...") to stdout from a
background thread, which broke `switchyard train list --json` for a script once the cluster
had started many workers (found in CI). While a command is attached they go to stderr."""

from __future__ import annotations

import random
import string
import threading

import pytest
from ray._private.worker import print_to_stdstream

from switchyard.cli._ray import ray_notices_to_stderr


def raylet_notice() -> str:
    """What Ray's `listen_error_messages` thread does with an error message from the GCS. Each
    is new: Ray drops a line that repeats within a few seconds, numbers and hex ids aside."""
    word = "".join(random.choices(string.ascii_lowercase[6:], k=12))  # no hex digits
    notice = f"WARNING: 10 PYTHON worker processes have been started on node {word}"
    print_to_stdstream({"lines": [notice], "pid": "raylet", "is_err": False}, ignore_prefix=False)
    return notice


def test_raylet_notices_go_to_stderr_while_attached(capsys: pytest.CaptureFixture[str]) -> None:
    said: list[str] = []
    with ray_notices_to_stderr():
        printer = threading.Thread(target=lambda: said.append(raylet_notice()))  # another thread, as Ray's
        printer.start()
        printer.join()
    print('{"json": "only"}')
    out, err = capsys.readouterr()
    assert out == '{"json": "only"}\n'
    assert said[0] in err


def test_without_it_they_reach_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    notice = raylet_notice()  # the behaviour the redirect exists for: if Ray changes it, this says so
    assert notice in capsys.readouterr().out
