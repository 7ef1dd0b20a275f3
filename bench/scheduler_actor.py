"""The live scheduler actor under load: mutations/s through the typed client, and recovery from SIGKILL.

    RAY_ADDRESS= flock /tmp/switchyard-ray.lock nice .venv/bin/python bench/scheduler_actor.py
        [--clients 4] [--duration 10] [--nodes 1250] [--pending 5000]

A local Ray cluster (its own temp dir), the real `SchedulerActor` with `fixed_nodes`: 1,250
logical nodes x 8 GPUs (10,000 GPUs, no Ray GPU nodes), its write-ahead log in a temp folder.
Before timing, through the client, one submission per call: 1,250 one-node gangs (they fill
the cluster) and then `--pending` more, which wait. Then `--clients` processes (spawned, each
its own `ray.init(address=<the cluster>)` and `SchedulerClient`) run for `--duration` s:

    claim a granted workload -> release it (finished) -> submit a new one

one mutation per call, each acknowledged by the actor only after its log line is synced. A
release frees one node, which the next tick gives to the oldest waiting gang, so the queue
stays at `--pending`. Each client owns every n-th workload (admission is FIFO here: one team,
one class), and when none it owns is granted yet, it claims the oldest it owns that waits
(a claim answered "no lease" is still a logged mutation; the counts show how many).

Then the actor's process is SIGKILLed and the time to the first successful call (a `ping` of
the new incarnation) is measured, and the queue and leases are checked against before the kill.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import signal
import sys
import tempfile
import time
from collections import deque
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "platform"))
from switchyard.cluster.scheduler_client import RetryPolicy, SchedulerClient
from switchyard.scheduler.api import WorkloadSubmission

ACTOR_NAME = "bench-scheduler"
NAMESPACE = "switchyard-bench"
GPUS_PER_NODE = 8
BENCH_POLICY = """
version: 1
policy: {preemption_grace_s: 30}
priority_classes:
  - {name: training, value: 100, preemptible: true, min_runtime_s: 0}
teams:
  - name: bench
    quotas: [{classes: [training], guaranteed_gpus: %d}]
"""


def node_fields(count: int) -> list[dict[str, Any]]:
    return [
        {"name": f"node-{i:04d}", "gpus": GPUS_PER_NODE, "node_group": f"g{i // 16}", "rack": f"r{i // 4}"}
        for i in range(count)
    ]


def gang(workload_id: str) -> WorkloadSubmission:
    return WorkloadSubmission(workload_id=workload_id, team="bench", bundles=(GPUS_PER_NODE,))


def owned(ids: list[str], client: int, clients: int) -> deque[str]:
    return deque(wid for i, wid in enumerate(ids) if i % clients == client)


def admitted_ids(nodes: int) -> list[str]:
    return [f"a{i:05d}" for i in range(nodes)]


def pending_ids(pending: int) -> list[str]:
    return [f"p{i:05d}" for i in range(pending)]


# ---------------------------------------------------------------------------- the mutation mix
class MutationMix:
    """One client's loop state: the workloads it owns that are granted, those that wait, and
    its call latencies by kind."""

    def __init__(self, client: Any, index: int, clients: int, nodes: int, pending: int) -> None:
        self.client = client
        self.index = index
        self.granted = owned(admitted_ids(nodes), index, clients)
        self.waiting = owned(pending_ids(pending), index, clients)
        self.latencies: dict[str, list[float]] = {"submit": [], "claim": [], "release": []}
        self.empty_claims = 0
        self.made = 0

    def _timed(self, kind: str, fn: Any, *args: Any) -> Any:
        started = time.perf_counter()
        answer = fn(*args)
        self.latencies[kind].append(time.perf_counter() - started)
        return answer

    def step(self) -> None:
        queue = self.granted if self.granted else self.waiting
        workload_id = queue[0]
        grant = self._timed("claim", self.client.claim, workload_id, f"job-{workload_id}")
        if grant is None:
            self.empty_claims += 1
        else:
            queue.popleft()
            self._timed("release", self.client.release, grant.lease_id, True)
        self.made += 1
        new_id = f"c{self.index}-{self.made:06d}"
        self._timed("submit", self.client.submit, gang(new_id))
        self.waiting.append(new_id)


def client_process(address: str, index: int, args: argparse.Namespace, ready: Any, go: Any, results: Any) -> None:
    import ray

    ray.init(address=address, namespace=NAMESPACE, log_to_driver=False)
    client = SchedulerClient.of_handle(ray.get_actor(ACTOR_NAME, namespace=NAMESPACE))
    mix = MutationMix(client, index, args.clients, args.nodes, args.pending)
    ready.put(index)
    go.wait()
    deadline = time.perf_counter() + args.duration
    started = time.perf_counter()
    while time.perf_counter() < deadline:
        mix.step()
    results.put((index, time.perf_counter() - started, mix.latencies, mix.empty_claims))


# ---------------------------------------------------------------------------- the live run
def start_actor(workdir: Path, nodes: int) -> Any:
    from switchyard.cluster.scheduler_actor import SchedulerActor

    policies = workdir / "policies"
    policies.mkdir()
    (policies / "scheduler.yaml").write_text(BENCH_POLICY % (nodes * GPUS_PER_NODE))
    return SchedulerActor.options(  # type: ignore[attr-defined]
        name=ACTOR_NAME, namespace=NAMESPACE, num_cpus=0, max_restarts=-1
    ).remote(str(policies), str(workdir / "state"), None, fixed_nodes=node_fields(nodes))


def wait_until(predicate: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"bench: {what} not reached within {timeout_s:.0f} s")
        time.sleep(0.1)


def prefill(client: SchedulerClient, nodes: int, pending: int) -> float:
    """Fill the cluster, then queue `pending` gangs: one `submit` call each. Returns seconds."""
    started = time.perf_counter()
    wait_until(lambda: client.status()["total_gpus"] == nodes * GPUS_PER_NODE, 60, "the fixed nodes")
    for wid in admitted_ids(nodes):
        client.submit(gang(wid))
    wait_until(lambda: client.status()["free_gpus"] == 0, 120, "a full cluster")
    for wid in pending_ids(pending):
        client.submit(gang(wid))
    return time.perf_counter() - started


def percentile(sorted_values: list[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def latency_line(name: str, sorted_values: list[float]) -> str:
    p50, p99 = percentile(sorted_values, 0.5) * 1e3, percentile(sorted_values, 0.99) * 1e3
    return f"  {name:8s} {len(sorted_values):6d}  p50 {p50:.2f} ms  p99 {p99:.2f} ms"


def report_load(results: list[tuple[int, float, dict[str, list[float]], int]], duration: float) -> None:
    everything = sorted(x for _, _, lat, _ in results for xs in lat.values() for x in xs)
    elapsed = max(r[1] for r in results)
    print(f"clients: {len(results)}, window {elapsed:.2f} s (asked {duration:g} s)")
    print(f"mutations: {len(everything)} -> {len(everything) / elapsed:.0f} mutations/s")
    print(latency_line("all", everything))
    for kind in ("submit", "claim", "release"):
        xs = sorted(x for _, _, lat, _ in results for x in lat[kind])
        if xs:
            print(latency_line(kind, xs))
    print(f"  claims answered 'no lease yet': {sum(r[3] for r in results)}")
    print(f"load average (1, 5, 15 min): {os.getloadavg()}")


def measure_recovery(client: SchedulerClient) -> None:
    """SIGKILL the actor's process; time to the first successful call of the new incarnation."""
    before = client.status()
    incarnation, pid = client.ping(), client.pid()
    killed_at = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    while client.ping() == incarnation:  # a ping that the dying process still answered
        time.sleep(0.01)
    recovered_s = time.monotonic() - killed_at
    after = client.status()
    same = sorted(before["pending"]) == sorted(after["pending"]) and len(before["leases"]) == len(after["leases"])
    print(f"recovery: {recovered_s:.2f} s from SIGKILL (pid {pid}) to the first successful call")
    print(f"  state kept: {same} ({len(after['pending'])} pending, {len(after['leases'])} leases after)")


def run_live(args: argparse.Namespace) -> None:
    import ray

    workdir = Path(tempfile.mkdtemp(prefix="sy-bench-"))
    ray.init(
        address="local",
        num_cpus=args.clients + 2,
        include_dashboard=False,
        _temp_dir=str(workdir / "ray"),
        namespace=NAMESPACE,
        log_to_driver=False,
    )
    actor = start_actor(workdir, args.nodes)
    client = SchedulerClient.of_handle(actor, RetryPolicy(first_backoff_s=0.01, max_backoff_s=0.1, attempts=1000))
    client.ping()
    prefill_s = prefill(client, args.nodes, args.pending)
    print(f"prefill: {args.nodes} admitted + {args.pending} pending, one submit call each, in {prefill_s:.1f} s")

    ctx = mp.get_context("spawn")
    ready, results, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    address = ray.get_runtime_context().gcs_address
    procs = [
        ctx.Process(target=client_process, args=(address, i, args, ready, go, results)) for i in range(args.clients)
    ]
    for p in procs:
        p.start()
    for _ in procs:
        ready.get(timeout=120)
    go.set()
    report_load([results.get(timeout=args.duration + 120) for _ in procs], args.duration)
    for p in procs:
        p.join()
    print(f"after the run: {len(client.status()['pending'])} pending")
    measure_recovery(client)
    print(
        "reproduce: RAY_ADDRESS= flock /tmp/switchyard-ray.lock nice .venv/bin/python bench/scheduler_actor.py "
        f"--clients {args.clients} --duration {args.duration:g} --nodes {args.nodes} --pending {args.pending}"
    )
    ray.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--nodes", type=int, default=1250)
    parser.add_argument("--pending", type=int, default=5000)
    args = parser.parse_args()
    run_live(args)


if __name__ == "__main__":
    main()
