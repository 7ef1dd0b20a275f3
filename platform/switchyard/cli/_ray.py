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
