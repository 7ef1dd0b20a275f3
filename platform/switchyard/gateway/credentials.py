"""Provider credentials from environment variables or secret files named in policy.

The value is read when a provider is built and is held only by that provider's client; it
never enters an error, a log line, a metric or an audit record.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from switchyard.policy.models import Credential


class MissingCredential(Exception):
    """Names where the credential was expected, never a value."""


def read_credential(cred: Credential, environ: Mapping[str, str] | None = None) -> str:
    env = os.environ if environ is None else environ
    if cred.env is not None:
        value = env.get(cred.env)
        if not value:
            raise MissingCredential(f"environment variable {cred.env} is not set")
        return value
    assert cred.file is not None  # the policy model guarantees exactly one source
    path = Path(cred.file).expanduser()
    try:
        value = path.read_text().strip()
    except OSError as exc:
        raise MissingCredential(f"secret file {path} cannot be read ({exc.strerror})") from None
    if not value:
        raise MissingCredential(f"secret file {path} is empty")
    return value
