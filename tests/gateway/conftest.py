"""Fixtures for the gateway tests: fake upstreams, a policy copy pointed at them, keys, and
an in-process gateway per test. The Ray Serve fixture lives in `gw_ray.py` (loaded by the
Serve tests only), so the fast tests never start Ray."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from gw_fakes import ANTHROPIC_KEY, OPENAI_KEY, FakeUpstreams
from gw_harness import Harness, build_harness, make_keys, make_policies

ENV = {
    "OPENAI_API_KEY": OPENAI_KEY,
    "AZURE_OPENAI_API_KEY": OPENAI_KEY,
    "ANTHROPIC_API_KEY": ANTHROPIC_KEY,
    "AWS_ACCESS_KEY_ID": "AKIDEXAMPLE",
    "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
    "AWS_EC2_METADATA_DISABLED": "true",
}


def pytest_configure(config: pytest.Config) -> None:
    # The fake providers' credentials, in the environment before the session's Ray cluster
    # starts: Serve replicas inherit the environment of the raylet that starts them.
    os.environ.update(ENV)


@pytest.fixture(scope="session")
def gw_env() -> None:
    """The credentials are in the environment (see `pytest_configure`); a marker for readers."""


@pytest.fixture(scope="session")
def upstreams() -> Iterator[FakeUpstreams]:
    fake = FakeUpstreams()
    fake.start()
    yield fake
    fake.stop()


@pytest.fixture(scope="session")
def gw_dirs(
    tmp_path_factory: pytest.TempPathFactory, upstreams: FakeUpstreams, gw_env: None
) -> tuple[Path, Path, dict[str, str]]:
    root = tmp_path_factory.mktemp("gateway")
    policies = make_policies(root / "policies", upstreams.base)
    state = root / "state"
    state.mkdir()
    return policies, state, make_keys(state)


@pytest.fixture
async def gw(gw_dirs: tuple[Path, Path, dict[str, str]], upstreams: FakeUpstreams) -> AsyncIterator[Harness]:
    upstreams.reset()
    policies, state, keys = gw_dirs
    harness = build_harness(policies, state, keys)
    yield harness
    await harness.aclose()


@pytest.fixture(scope="module")
def serve_gateway(
    gw_dirs: tuple[Path, Path, dict[str, str]], upstreams: FakeUpstreams, serve_http: str
) -> Iterator[str]:
    """The gateway Serve app (2 replicas + the local model) on the session's Ray cluster,
    removed after the module so later tests can deploy their own app at `/`."""
    import ray
    from ray import serve

    from serve_apps.gateway import build_app
    from switchyard.cluster.ledger import stop_ledger_actor
    from switchyard.cluster.policy_publisher import find_publisher

    policies, state, _ = gw_dirs
    serve.run(
        build_app({"policies_dir": str(policies), "state_dir": str(state), "num_replicas": "2"}),
        name="gateway",
        route_prefix="/",
    )
    try:
        yield serve_http
    finally:
        serve.delete("gateway")
        # The replicas started these (detached): they would outlive the module.
        stop_ledger_actor(state)
        with contextlib.suppress(ValueError):  # none: no replica got as far as asking for it
            ray.kill(find_publisher(policies, state), no_restart=True)
