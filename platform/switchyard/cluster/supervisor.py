"""Whether the process a platform record names is that platform's supervisor.

A local platform's record (`up.json`) names its supervisor's PID, and `down` signals that PID.
A record copied into another state dir, or one a crashed supervisor left behind whose PID was
reused, names a process that is not this state dir's supervisor: signalling it would stop
another platform, or some unrelated process. `down` asks this module first.

A state dir has at most one supervisor: it holds an exclusive lock on `<state>/supervisor.lock`
for its whole life. Two `up`s started together both passed the record check (the record is
written only once the platform is up) and ran two clusters on one state dir and one Ray temp
dir, the record naming one of them, so `down` left the other running for good.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

HEAD_MODULE = "switchyard.cluster.head"  # `up` runs the supervisor as `python -m HEAD_MODULE`


def supervised_state_dir(cmdline: Sequence[str], cwd: Path) -> Path | None:
    """The state dir a process supervises, from its command line (relative paths are the
    process's own, so they resolve against its working directory); None when the process is not
    a switchyard head."""
    args = _module_args(list(cmdline))
    if args is None:
        return None
    for i, arg in enumerate(args):
        if arg == "--state-dir" and i + 1 < len(args):
            return (cwd / args[i + 1]).resolve()
        if arg.startswith("--state-dir="):
            return (cwd / arg.removeprefix("--state-dir=")).resolve()
    return None


def _module_args(cmdline: list[str]) -> list[str] | None:
    """The arguments after `python [options] -m HEAD_MODULE`; None for any other command (a
    script, `-c`, another module)."""
    i = 1  # past the interpreter
    while i < len(cmdline):
        arg = cmdline[i]
        if arg == "-m":
            return cmdline[i + 2 :] if cmdline[i + 1 : i + 2] == [HEAD_MODULE] else None
        if arg in ("-W", "-X"):  # the interpreter's options that take a value
            i += 2
        elif arg.startswith("-") and arg != "-c":
            i += 1
        else:
            return None
    return None


@dataclass(frozen=True)
class Supervisor:
    """What runs under a recorded supervisor PID now."""

    alive: bool
    state_dir: Path | None  # the state dir it supervises; None: not a switchyard head (or unreadable)

    def serves(self, state: Path) -> bool:
        return self.alive and self.state_dir == state.resolve()

    def serves_another(self, state: Path) -> Path | None:
        """The state dir it supervises when that is not `state` (the record naming it is a copy)."""
        return self.state_dir if self.alive and self.state_dir is not None and not self.serves(state) else None


def look_up(pid: int) -> Supervisor:
    """The process under `pid`, as `down` must know it before signalling."""
    import psutil  # reads a process's command line on every OS Ray runs on

    try:
        process = psutil.Process(pid)
        cmdline, cwd = process.cmdline(), Path(process.cwd())
    except psutil.NoSuchProcess:  # ZombieProcess too: exited, not yet reaped
        return Supervisor(alive=False, state_dir=None)
    except psutil.AccessDenied:  # another user's process: not a supervisor this user started
        return Supervisor(alive=True, state_dir=None)
    return Supervisor(alive=True, state_dir=supervised_state_dir(cmdline, cwd))


LOCK_FILE = "supervisor.lock"


class StateDirTaken(Exception):
    """Another supervisor holds the state dir's lock."""

    def __init__(self, state: Path, holder: str) -> None:
        super().__init__(
            f"another switchyard supervisor (PID {holder or '?'}) already serves state dir {state}: the platform "
            f"is up or starting (`switchyard status --state-dir {state}`)"
        )


def claim_state_dir(state: Path) -> int:
    """Take the state dir's supervisor lock for the life of this process (the kernel releases it
    when the process exits, however it exits) and write this PID into it; returns the lock's
    file descriptor, which the caller keeps open. Raises StateDirTaken when another holds it."""
    fd = os.open(state / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)  # not inherited by Ray's processes
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder_pid(fd)
        os.close(fd)
        raise StateDirTaken(state, holder) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    return fd


def _holder_pid(fd: int, within_s: float = 1.0) -> str:
    """The PID the lock's holder wrote. It writes it just after taking the lock: a second `up`
    started at the same moment read the file before that and said "PID ?" (a flaky CI run)."""
    deadline = time.monotonic() + within_s
    while True:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
        if holder or time.monotonic() >= deadline:
            return holder
        time.sleep(0.01)
