"""Wait, with a deadline, for one of the platform's actors (the scheduler, the policy
publisher) to answer; if it does not, say why in words an operator can act on.

`up` asked them with `ray.get(..., timeout=60)` and the scheduler client's retries: a scheduler
whose constructor raised (its write-ahead log corrupt, say) cost a minute of retries and then
printed a Ray traceback. Here a constructor's error ends the wait at once and is named.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import ray
from ray.exceptions import ActorDiedError, ActorUnavailableError, GetTimeoutError

from switchyard.cluster.app_readiness import PlatformNotRunning, without_frames

RESTART_POLL_S = 0.5


def creation_error(message: str) -> str:
    """What an actor's constructor raised, from the text of Ray's `ActorDiedError`: the
    `Type: message` line(s) after the traceback's last frame, without Ray's preamble."""
    lines = without_frames(message, after_last_frame=True)
    return " ".join(line.strip() for line in lines) or message.strip().splitlines()[-1]


def wait_for_actor(what: str, ask: Callable[[], Any], within_s: float) -> Any:
    """The answer to `ask()` (an actor method's `.remote()` call), waiting out a restart, at most
    `within_s`. Raises `PlatformNotRunning` naming `what` and the constructor's error, or the
    deadline it missed."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            return ray.get(ask(), timeout=max(deadline - time.monotonic(), 0.0))
        except ActorDiedError as exc:
            if exc.actor_init_failed:
                raise PlatformNotRunning(f"the {what} failed to start: {creation_error(str(exc))}") from None
            raise PlatformNotRunning(f"the {what} died as it started: {str(exc).splitlines()[0]}") from None
        except ActorUnavailableError:  # restarting: it may come back before the deadline
            if time.monotonic() + RESTART_POLL_S > deadline:
                raise PlatformNotRunning(f"the {what} was still restarting after {within_s:g}s") from None
            time.sleep(RESTART_POLL_S)
        except GetTimeoutError:
            raise PlatformNotRunning(f"the {what} did not answer within {within_s:g}s") from None
