"""How a CLI command attaches to the platform's Ray cluster.

While attached, Ray's driver prints cluster-wide notices from the raylet ("WARNING: 10 PYTHON
worker processes have been started ...") to standard output from a background thread; a
command's stdout carries its own output only (`--json` is parsed by scripts), so those notices
are sent to stderr, where a person still sees them.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from switchyard.cluster.record import PlatformRecord

OCCUPANT_TIMEOUT_S = 30.0  # for the cluster's scheduler to say whose it is


class NotRunning(LookupError):
    """The state dir's record describes no running platform; the message says why, and what
    clears the record."""


@contextlib.contextmanager
def ray_notices_to_stderr() -> Iterator[None]:
    with contextlib.redirect_stdout(sys.stderr):
        yield


@contextlib.contextmanager
def attached(address: str) -> Iterator[None]:
    """Connected to the cluster at `address` in the platform's namespace and environment (set
    before the first `import ray`: Ray reads it at import)."""
    from switchyard.cluster.head import PLATFORM_ENV

    os.environ.update(PLATFORM_ENV)
    import ray

    from switchyard.cluster.record import NAMESPACE

    with ray_notices_to_stderr():
        ray.init(address=address, namespace=NAMESPACE, logging_level="WARNING", log_to_driver=False)
        try:
            yield
        finally:
            ray.shutdown()


@contextlib.contextmanager
def attached_platform(state: Path, record: PlatformRecord) -> Iterator[None]:
    """Attached to the cluster of the platform recorded in `state`, once it is known to run
    there. Raises NotRunning, before waiting on Ray, when its supervisor is gone or its cluster
    does not answer, and, once attached, when the cluster runs another platform (a stale or
    copied record of an attached platform), whose scheduler would take this command's work."""
    from switchyard.cluster.record_liveness import not_running, stale_record_message

    why = not_running(state, record)
    if why is not None:
        raise NotRunning(stale_record_message(state, why))
    with attached(record.ray_address):
        if not record.owns_cluster:
            from switchyard.cluster.deploy import cluster_occupant
            from switchyard.cluster.occupant import another_platform

            other = another_platform(state, cluster_occupant(OCCUPANT_TIMEOUT_S))
            if other is not None:
                raise NotRunning(
                    stale_record_message(
                        state,
                        f"its cluster {record.ray_address} runs another platform now (state dir {other}; "
                        f"`switchyard status --state-dir {other}` shows it)",
                    )
                )
        yield
