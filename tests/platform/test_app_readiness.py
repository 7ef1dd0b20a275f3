"""The error `switchyard up` gives when a Serve app does not run: which deployment is stuck,
what each replica asks for, what Serve says, what the cluster has free."""

from __future__ import annotations

from switchyard.cli.up import failure_excerpt
from switchyard.cluster.app_readiness import DeploymentState, HeadRoom, describe_unready, replica_needs

PENDING = (
    "Deployment 'console' in application 'console' has 1 replicas that have taken more than 30s to be"
    " scheduled. Resources required for each replica: {'CPU': 0.1}, total resources available: {'CPU': 0.0}."
)


def test_names_each_stuck_deployment_with_what_it_needs_and_what_is_free() -> None:
    message = describe_unready(
        "console",
        "DEPLOYING",
        "",
        [
            DeploymentState(
                "console", "UPDATING", {"STARTING": 1}, PENDING, {"CPU": 0.1, "node:__internal_head__": 0.001}
            ),
            DeploymentState("assets", "HEALTHY", {"RUNNING": 2}, "", {"CPU": 0.5}),
        ],
        {"CPU": 0.0, "GPU": 8.0, "node:127.0.0.1": 1.0, "object_store_memory": 2e9, "memory": 3 * 2**30},
        20.0,
    )
    lines = message.splitlines()
    assert lines[0] == "the Serve application 'console' was not running within 20s (status DEPLOYING)"
    assert lines[1] == (
        "  deployment 'console' (UPDATING): 0 replica(s) running, 1 starting;"
        " each replica needs CPU 0.1, node:__internal_head__ 0.001"
    )
    assert lines[2] == f"    Serve says: {PENDING}"
    # Used up, so Ray leaves it out of what is free: said as 0, since it is what the replica lacks.
    assert lines[3] == "  free on the cluster now: CPU 0, GPU 8, memory 3.0 GiB, node:__internal_head__ 0"
    assert "assets" not in message  # a healthy deployment is not what is wrong


def test_a_replica_pinned_to_the_head_is_told_what_the_head_has_and_who_holds_it() -> None:
    """The cluster had CPU 7.5 free and the console (CPU 0.1, pinned to the head) still could
    not start: the head's own CPUs were held. The error says so, and by whom."""
    console = DeploymentState(
        "console", "UPDATING", {"STARTING": 1}, PENDING, {"CPU": 0.1, "node:__internal_head__": 0.001}
    )
    head = HeadRoom(
        free={"node:__internal_head__": 0.993, "memory": 2**30},
        cpu_holders={"LedgerActor": 3.0, "ServeReplica:gateway:gateway": 1.0, "ServeController": 0.0},
    )
    message = describe_unready("console", "DEPLOYING", "", [console], {"CPU": 7.5}, 180.0, head)
    assert message.splitlines()[-1] == (
        "  free on the head node now: CPU 0, memory 1.0 GiB, node:__internal_head__ 0.993;"
        " its CPUs are held by LedgerActor CPU 3, ServeReplica:gateway:gateway CPU 1"
    )
    gateway = DeploymentState("gateway", "UPDATING", {"STARTING": 1}, "", {"CPU": 1.0})
    unpinned = describe_unready("gateway", "DEPLOYING", "", [gateway], {"CPU": 0.0}, 180.0, head)
    assert "head node" not in unpinned  # a replica that may go anywhere waits on the cluster


def test_a_failed_deploy_says_so_with_serve_s_reason() -> None:
    message = describe_unready(
        "gateway",
        "DEPLOY_FAILED",
        "The deployment failed to start 3 times in a row: ImportError: no module named 'x'",
        [DeploymentState("gateway", "DEPLOY_FAILED", {}, "", {"CPU": 1.0})],
        {},
        3.0,
    )
    assert message.splitlines()[0] == (
        "the Serve application 'gateway' failed to deploy:"
        " The deployment failed to start 3 times in a row: ImportError: no module named 'x'"
    )
    assert "0 replica(s) running; each replica needs CPU 1" in message
    assert message.endswith("free on the cluster now: CPU 0")


def test_an_app_serve_has_not_created_yet_is_said_plainly() -> None:
    message = describe_unready("gateway", "NOT_STARTED", "", [], {}, 180.0)
    assert "Serve reports no deployments for it yet" in message
    assert message.endswith("free on the cluster now: nothing")


def test_replica_needs_counts_as_ray_does() -> None:
    assert replica_needs({"num_cpus": 0.5}) == {"CPU": 0.5}
    assert replica_needs({"num_cpus": 0, "num_gpus": 1, "resources": {"switchyard_serve_gpu": 1}}) == {
        "GPU": 1.0,
        "switchyard_serve_gpu": 1.0,
    }
    assert replica_needs({"memory": 2**30, "runtime_env": {"pip": ["x"]}}) == {"memory": float(2**30)}
    assert replica_needs({}) == {}


def test_the_head_s_error_survives_up_s_excerpt_of_its_log() -> None:
    """A local head logs the error as its last words; `up` shows the log's last lines."""
    error = describe_unready(
        "gateway",
        "DEPLOYING",
        "",
        [DeploymentState("gateway", "UPDATING", {"STARTING": 1}, "", {"CPU": 1.0})],
        {"CPU": 0.0},
        180.0,
    )
    log = "2026-12-05 10:00:00 switchyard.head INFO stopping: removing the gateway\n"
    log += f"2026-12-05 10:00:01 switchyard.head ERROR {error}\n"
    excerpt = failure_excerpt(log)
    assert "deployment 'gateway' (UPDATING): 0 replica(s) running, 1 starting; each replica needs CPU 1" in excerpt
    assert "free on the cluster now: CPU 0" in excerpt
