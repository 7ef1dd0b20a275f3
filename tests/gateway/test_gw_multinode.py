"""Two gateway replicas on two nodes, each node with its own state directory, one Postgres.

Nothing can pass between the replicas through a shared file: each node's Ray processes get their
own `SWITCHYARD_STATE_DIR` (the raylet's environment), and the policy files the head publishes
are not on their disks. What must still hold, as on a real cluster:
- both replicas authenticate the same keys; a key revoked with the CLI is refused by both
  within the refresh interval;
- both write to one audit chain that `switchyard audit verify` accepts;
- an idempotent replay hits the one stored answer whichever replica serves it, also after the
  database restarts;
- a policy change made on the head is served by both (one fingerprint).

    flock /tmp/switchyard-ray.lock .venv/bin/python -m pytest tests/gateway/test_gw_multinode.py
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from gw_fakes import FakeUpstreams
from gw_harness import make_keys, make_policies

from switchyard.db.location import DATABASE_URL_ENV
from switchyard.db.schemas import store_schemas
from switchyard.paths import POLICIES_ENV
from switchyard.policy.loader import load_policy_set
from switchyard.state import STATE_DIR_ENV
from tests.shared_db import fresh_postgres, postgres_url

pytestmark = pytest.mark.ray

REPO = Path(__file__).resolve().parents[2]
APP = "gateway-multinode"
NODE_RESOURCE = "gateway_multinode_host"  # one per added node: one replica per node
REFRESH_S = 2.0  # the replicas' key and policy refresh interval (`Refresher`)


def _wait(what: str, check: Callable[[], bool], timeout_s: float) -> float:
    started = time.monotonic()
    while not check():
        if time.monotonic() - started > timeout_s:
            raise AssertionError(f"not within {timeout_s:.0f}s: {what}")
        time.sleep(0.2)
    return time.monotonic() - started


def _cli(*args: str, state: Path, policies: Path, key: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, DATABASE_URL_ENV: postgres_url(), STATE_DIR_ENV: str(state), POLICIES_ENV: str(policies)}
    if key is not None:
        env["SWITCHYARD_API_KEY"] = key
    return subprocess.run(
        [sys.executable, "-m", "switchyard.cli", *args], capture_output=True, text=True, env=env, timeout=120, cwd=REPO
    )


class Cluster2:
    def __init__(self, base: str, head_state: Path, policies: Path, keys: dict[str, str], nodes: list[str]) -> None:
        self.nodes = nodes  # the two added nodes' ids
        self.base = base
        self.head_state = head_state
        self.policies = policies
        self.keys = keys

    def chat(self, key: str, text: str, **headers: str) -> httpx.Response:
        return httpx.post(
            f"{self.base}/v1/chat/completions",
            json={"model": "auto", "messages": [{"role": "user", "content": text}]},
            headers={"authorization": f"Bearer {key}", **headers},
            timeout=60,
        )

    def replicas(self) -> dict[str, dict[str, Any]]:
        """Each replica's own health detail, by replica id, from enough polls to see both."""
        seen: dict[str, dict[str, Any]] = {}
        for _ in range(40):
            detail = httpx.get(
                f"{self.base}/v1/switchyard/status",
                headers={"authorization": f"Bearer {self.keys['operator']}"},
                timeout=30,
            ).json()["policy"]
            seen[detail["replica"]] = detail
            if len(seen) == 2:
                break
        return seen


@pytest.fixture(scope="module")
def two_nodes(
    ray_cluster: dict[str, Any], serve_http: str, upstreams: FakeUpstreams, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster2]:
    import ray
    from ray import serve

    from serve_apps.gateway import Gateway
    from switchyard.cluster.ledger import stop_ledger_actor
    from switchyard.cluster.policy_publisher import find_publisher

    root = tmp_path_factory.mktemp("multinode")
    fresh_postgres(*store_schemas().values()).close()  # as `switchyard up` migrates
    head_state = root / "head-state"
    head_state.mkdir()
    policies = make_policies(root / "policies", upstreams.base)
    saved = os.environ.get(DATABASE_URL_ENV)
    os.environ[DATABASE_URL_ENV] = postgres_url()  # this process's stores (the keys made below)
    keys = make_keys(head_state)
    cluster = ray_cluster["cluster"]
    nodes = []
    for name in ("x", "y"):
        node_state = root / f"node-{name}"
        # A stale checkout on each node: the replicas must never serve it.
        shutil.copytree(REPO / "policies", node_state / "policies")
        nodes.append(
            cluster.add_node(
                num_cpus=2,
                resources={NODE_RESOURCE: 1},
                env_vars={STATE_DIR_ENV: str(node_state)},
            )
        )
    cluster.wait_for_nodes()
    options = {
        "num_cpus": 0.5,
        "resources": {NODE_RESOURCE: 1},
        # The session's raylets started before this test chose its database: the URL travels in
        # the runtime env (the publisher the replicas create on the head inherits it).
        "runtime_env": {"env_vars": {DATABASE_URL_ENV: postgres_url()}},
    }
    app = Gateway.options(num_replicas=2, ray_actor_options=options).bind(  # type: ignore[attr-defined]
        str(policies), str(head_state), None, APP, None
    )
    serve.run(app, name=APP, route_prefix="/")
    try:
        yield Cluster2(serve_http, head_state, policies, keys, [n.node_id for n in nodes])
    finally:
        serve.delete(APP)
        stop_ledger_actor(head_state)  # before the database URL is put back: it names the actor
        with contextlib.suppress(ValueError):  # never started: the test failed before a replica asked
            ray.kill(find_publisher(policies, head_state), no_restart=True)
        for node in nodes:
            cluster.remove_node(node)
        if saved is None:
            os.environ.pop(DATABASE_URL_ENV, None)
        else:
            os.environ[DATABASE_URL_ENV] = saved


def test_replicas_on_two_nodes_share_one_source_of_truth(two_nodes: Cluster2, upstreams: FakeUpstreams) -> None:
    gw = two_nodes
    upstreams.reset()
    replicas = gw.replicas()
    assert len(replicas) == 2 and len({r["node"] for r in replicas.values()}) == 2, replicas
    root = gw.head_state.parent
    for name in ("x", "y"):  # each replica wrote its copy of the published set on its own node
        assert any((root / f"node-{name}" / "policy_published").iterdir()), name

    # Keys: a key made with the CLI after the replicas started works on both; revoked, it is
    # refused by both within the refresh interval.
    made = _cli(
        "keys", "create", "--team", "qa", "--json", state=gw.head_state, policies=gw.policies, key=gw.keys["operator"]
    )
    assert made.returncode == 0, made.stderr
    created = json.loads(made.stdout)
    new_key, new_id = created["key"], created["key_id"]
    _wait(
        "both replicas know the new key", lambda: all(gw.chat(new_key, "hi").status_code == 200 for _ in range(8)), 15
    )
    revoked = _cli("keys", "revoke", new_id, state=gw.head_state, policies=gw.policies, key=gw.keys["operator"])
    assert revoked.returncode == 0, revoked.stderr
    took = _wait(
        "both replicas refuse the revoked key",
        lambda: all(gw.chat(new_key, "hi").status_code == 401 for _ in range(8)),
        3 * REFRESH_S + 5,
    )
    assert took <= 2 * REFRESH_S + 3, f"refused after {took:.1f}s"

    # Idempotency: one upstream call for a key, whichever replica serves a replay, and after
    # the database restarts.
    upstreams.reset()
    first = gw.chat(gw.keys["qa"], "once please", **{"idempotency-key": "multinode-1"})
    assert first.status_code == 200, first.text
    for _ in range(8):
        again = gw.chat(gw.keys["qa"], "once please", **{"idempotency-key": "multinode-1"})
        assert again.status_code == 200 and again.json()["id"] == first.json()["id"]
    restart = subprocess.run(["bash", "scripts/postgres.sh", "restart"], cwd=REPO, capture_output=True, text=True)
    assert restart.returncode == 0, restart.stderr
    for _ in range(8):
        again = gw.chat(gw.keys["qa"], "once please", **{"idempotency-key": "multinode-1"})
        assert again.status_code == 200 and again.json()["id"] == first.json()["id"], again.text
    assert len(upstreams.openai.received) == 1

    # Audit: every answered request of both replicas is in one chain that verifies.
    answered = gw.chat(gw.keys["qa"], "audited")
    assert answered.status_code == 200
    anchors = [root / f"node-{n}" / "audit" / "anchors.jsonl" for n in ("x", "y")]
    _wait("both replicas appended to the chain", lambda: all(a.exists() and a.stat().st_size for a in anchors), 30)
    verified = _cli("audit", "verify", "--json", state=gw.head_state, policies=gw.policies, key=gw.keys["auditor"])
    assert verified.returncode == 0, verified.stdout + verified.stderr

    # Policy: a change on the head reaches both replicas; their nodes' own files are stale.
    team = gw.policies / "teams" / "qa.yaml"
    team.write_text(team.read_text().replace("deadline_ms: 5000", "deadline_ms: 6000", 1))
    published = load_policy_set(gw.policies).fingerprint
    stale = load_policy_set(root / "node-x" / "policies").fingerprint
    assert published != stale
    _wait(
        "both replicas serve the published set",
        lambda: {r["fingerprint"] for r in gw.replicas().values()} == {published},
        6 * REFRESH_S,
    )


def test_a_replica_whose_node_has_its_own_sqlite_state_refuses_to_start(two_nodes: Cluster2, tmp_path: Path) -> None:
    """What a gateway replica runs first, on a node with its own state directory and no shared
    database: it must refuse, naming the setting, rather than serve from a private copy."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from switchyard.cluster.gateway_state import replica_state
    from switchyard.cluster.policy_publisher import find_publisher
    from switchyard.db.location import UnsafeLayout

    head_state = tmp_path / "sqlite-head-state"
    head_state.mkdir()
    start_like_a_replica = ray.remote(num_cpus=0)(replica_state)
    no_database = {"env_vars": {DATABASE_URL_ENV: ""}}  # this node's SQLite, the default
    on_node_x = NodeAffinitySchedulingStrategy(two_nodes.nodes[0], soft=False)
    started = start_like_a_replica.options(scheduling_strategy=on_node_x, runtime_env=no_database)
    with pytest.raises(UnsafeLayout) as refused:
        ray.get(started.remote(str(two_nodes.policies), str(head_state), "refused"))
    assert f"Set {DATABASE_URL_ENV}=postgresql://" in str(refused.value) and str(head_state) in str(refused.value)
    with contextlib.suppress(ValueError):
        ray.kill(find_publisher(two_nodes.policies, head_state), no_restart=True)
