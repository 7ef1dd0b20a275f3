"""Fixtures for the audit tests: the shipped data policies, one shared Presidio scrubber, and
an S3 endpoint (moto's server on 127.0.0.1) with a client for it."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto.server import ThreadedMotoServer

from switchyard.audit.data_policy import load_data_policies
from switchyard.audit.redaction import TextScrubber
from switchyard.paths import repo_root
from switchyard.policy.models import DataPolicies


@pytest.fixture(scope="session")
def data_policies() -> DataPolicies:
    return load_data_policies(repo_root() / "policies")


@pytest.fixture(scope="session")
def scrubber() -> TextScrubber:
    return TextScrubber()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture
def s3(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    # Dummy credentials, only for this test: moto accepts any.
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    return boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")
