"""Benchmark 2: through Ray Serve with the HAProxy ingress, against one fake upstream, side
by side in one run: switchyard's gateway vs a bare Serve passthrough deployment vs calling
the upstream directly, at concurrency 1 and 16. Prints req/s, p50, p99 and ratios.

The gateway runs as deployed: budgets on the shared ledger actor (leased), the durable
audit sink, the Presidio redactor. Two gateway targets: `qa/plain` (class `internal`: sent
raw, audited with full bodies) and `support/reply` with a customer message full of personal
data (class `personal`: redacted before sending, restored in the answer, stored redacted
and encrypted), so the difference between them is what redaction adds.

    flock /tmp/switchyard-ray.lock .venv/bin/python bench/gateway_serve.py [--seconds 8]

The fake upstream (OpenAI wire format, validating requests) runs in its own process;
the load generator is one asyncio process with keep-alive connections.
"""

import os

os.environ.setdefault("RAY_SERVE_ENABLE_HA_PROXY", "1")  # must be set before Ray starts
# The gateway's replicas inherit it: every answer's server-timing carries the per-stage breakdown.
os.environ.setdefault("SWITCHYARD_SERVER_TIMING", "stages")

import argparse
import asyncio
import contextlib
import multiprocessing
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import psutil  # installed with ray[default]; the bench reads CPU time per process tree
from fastapi import FastAPI, Request  # no `from __future__ import annotations`: the pickled deployment needs real ones
from fastapi.responses import JSONResponse

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "gateway"))

from gw_fakes import OPENAI_KEY, FakeUpstreams  # noqa: E402
from gw_harness import make_keys, make_policies  # noqa: E402

sys.path.insert(0, str(REPO / "bench"))
from gateway_streaming import print_streaming, stream_interleaved  # noqa: E402

BODY = {"model": "auto", "messages": [{"role": "user", "content": "Summarise my last three orders."}]}
PERSONAL_BODY = {
    "model": "auto",
    "messages": [
        {
            "role": "user",
            "content": "I'm Jane (jane.doe@example.com, +1 415-555-0132). My card 4111 1111 1111 1111"
            " was charged twice for the same order; please refund one and confirm by email.",
        }
    ],
    "variables": {"product": "X"},
}
GATEWAYS = ("gateway qa/plain", "gateway support/reply")
STREAM_CHUNK_GAP_S = 0.002


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_fake(ready: Any) -> None:
    fake = FakeUpstreams()
    # Streamed content chunks 2 ms apart, so what a gateway adds per chunk shows as a wider gap
    # (unpaced, all chunks arrive in one read and the gaps measure nothing).
    fake.openai.chunk_gap_s = STREAM_CHUNK_GAP_S
    fake.start()
    ready.put(fake.port)
    while True:
        time.sleep(3600)


def passthrough_app(upstream: str) -> Any:
    from ray import serve

    app = FastAPI()

    @serve.deployment(name="passthrough", ray_actor_options={"num_cpus": 1}, max_ongoing_requests=256)
    @serve.ingress(app)
    class Passthrough:
        def __init__(self, upstream: str) -> None:
            self.client = httpx.AsyncClient(base_url=upstream, headers={"authorization": f"Bearer {OPENAI_KEY}"})

        @app.post("/v1/chat/completions")
        async def chat(self, request: Request) -> JSONResponse:
            body = await request.json()
            body["model"] = "gpt-4o-mini-2024-07-18"
            resp = await self.client.post("/v1/chat/completions", json=body)
            return JSONResponse(resp.json(), status_code=resp.status_code)

    return Passthrough.bind(upstream)  # type: ignore[attr-defined]


async def load(
    url: str, headers: dict[str, str], body: dict[str, Any], concurrency: int, seconds: float
) -> dict[str, float]:
    latencies: list[float] = []
    errors = 0
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(limits=limits, timeout=30) as client:
        for _ in range(3):  # warm-up
            await client.post(url, json=body, headers=headers)
        stop = time.perf_counter() + seconds

        async def worker() -> None:
            nonlocal errors
            while time.perf_counter() < stop:
                t = time.perf_counter()
                r = await client.post(url, json=body, headers=headers)
                latencies.append((time.perf_counter() - t) * 1000)
                errors += r.status_code != 200

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    latencies.sort()
    return {
        "rps": len(latencies) / elapsed,
        "p50": latencies[len(latencies) // 2],
        "p99": latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))],
        "n": len(latencies),
        "errors": errors,
    }


def tree_cpu_s(pids: list[int]) -> float:
    """User + system CPU seconds of these processes and their live children, from /proc."""
    total = 0.0
    for pid in pids:
        proc = psutil.Process(pid)
        for p in (proc, *proc.children(recursive=True)):
            with contextlib.suppress(psutil.NoSuchProcess):  # a child that ended in between
                t = p.cpu_times()
                total += t.user + t.system
    return total


def cpu_by_process() -> dict[tuple[int, str], float]:
    """CPU seconds so far of every readable process on the machine, by (pid, title)."""
    out: dict[tuple[int, str], float] = {}
    for p in psutil.process_iter():
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            t = p.cpu_times()
            out[(p.pid, " ".join(p.cmdline())[:60] or p.name())] = t.user + t.system
    return out


def serving_pids(apps: tuple[str, ...]) -> dict[str, list[int]]:
    """The processes a request to each target runs in: its Serve replicas, and for the gateway
    the ledger actor it charges (audit, idempotency and redaction run inside the replica).
    Found by the process titles Ray gives actors (`ray::ServeReplica:<app>:<deployment>`)."""
    titles = {p.pid: " ".join(p.cmdline()) for p in psutil.process_iter() if _readable(p)}
    out = {app: [pid for pid, t in titles.items() if t.startswith(f"ray::ServeReplica:{app}:")] for app in apps}
    out["gateway"] += [pid for pid, t in titles.items() if t.startswith("ray::LedgerActor")]
    return out


def gateway_replica_pid() -> int:
    """The gateway deployment's replica (the app also has the local model's)."""
    titles = {p.pid: " ".join(p.cmdline()) for p in psutil.process_iter() if _readable(p)}
    return next(pid for pid, t in titles.items() if t.startswith("ray::ServeReplica:gateway:gateway"))


def _readable(proc: psutil.Process) -> bool:
    try:
        proc.cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False
    return True


async def fixed_count(url: str, headers: dict[str, str], body: dict[str, Any], concurrency: int, count: int) -> int:
    """Sends exactly `count` requests from `concurrency` workers; returns the non-200s."""
    left, errors = count, 0
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(limits=limits, timeout=30) as client:

        async def worker() -> None:
            nonlocal left, errors
            while left > 0:
                left -= 1
                r = await client.post(url, json=body, headers=headers)
                errors += r.status_code != 200

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return errors


def sequential_interleaved(
    targets: dict[str, tuple[str, dict[str, str], dict[str, Any]]], rounds: int
) -> dict[str, Any]:
    """Concurrency 1 again, but alternating targets request by request, so that load from
    other processes on this shared machine hits every target alike."""
    out: dict[str, list[float]] = {name: [] for name in targets}
    timing: dict[str, list[float]] = {name: [] for name in targets}
    stages: dict[str, dict[str, list[float]]] = {name: {} for name in targets}
    with httpx.Client(timeout=30) as client:
        for _ in range(rounds):
            for name, (url, headers, body) in targets.items():
                t = time.perf_counter()
                r = client.post(url, json=body, headers=headers)
                out[name].append((time.perf_counter() - t) * 1000)
                if "server-timing" in r.headers:
                    entries = server_timing_entries(r.headers["server-timing"])
                    timing[name].append(entries["gateway"])
                    for stage, ms in entries.items():
                        stages[name].setdefault(stage, []).append(ms)
    in_replica = {name: sorted(v) for name, v in timing.items()}
    return {
        "latency": {k: sorted(v) for k, v in out.items()},
        "in_replica_gateway_p50": {k: v[len(v) // 2] for k, v in in_replica.items() if v},
        "stage_means": {k: {s: sum(v) / len(v) for s, v in by.items()} for k, by in stages.items() if by},
    }


def server_timing_entries(header: str) -> dict[str, float]:
    """`gateway;dur=1.2, upstream;dur=0.3, plan;dur=...` -> {name: ms}."""
    out = {}
    for item in header.split(","):
        name, _, dur = item.strip().partition(";dur=")
        if dur:
            out[name] = float(dur)
    return out


def profile_replica(pid: int, out: str, run_load: Any) -> None:
    """py-spy (bench-only: `pip install py-spy`) samples the gateway replica while `run_load`
    runs, and writes collapsed stacks to `out` (flamegraph.pl or speedscope read them)."""
    import shutil
    import subprocess

    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    command = [spy, "record", "--pid", str(pid), "--format", "raw", "-o", out, "--threads"]
    with tempfile.TemporaryFile("w+") as said:  # a file, not a pipe: a full pipe would stall py-spy
        sampler = subprocess.Popen(command, stderr=said, text=True)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # "py-spy> Sampling process 100 times a second...": attached
            said.seek(0)
            if "Sampling" in said.read():
                break
            time.sleep(0.1)
        run_load()
        sampler.send_signal(2)  # SIGINT: py-spy writes the file and exits
        sampler.wait(timeout=60)


def hold_for_peers(path: Path, upstream: str, targets: dict[str, tuple[str, dict[str, str], dict[str, Any]]]) -> None:
    """For bench/gateway_peers.sh: write the targets (and the processes serving each) to `path`,
    then keep serving until `<path>.stop` exists."""
    import json

    pids = serving_pids(("gateway", "passthrough"))
    described = {
        name: {
            "url": url,
            "headers": headers,
            "body": body,
            "pids": []
            if name == "upstream direct"
            else pids["passthrough" if name == "serve passthrough" else "gateway"],
        }
        for name, (url, headers, body) in targets.items()
    }
    path.write_text(json.dumps({"upstream": upstream, "targets": described}, indent=1))
    stop = path.with_name(path.name + ".stop")
    while not stop.exists():
        time.sleep(0.5)


def main(seconds: float, cpu_requests: int, profile: str | None, serve_only: str | None = None) -> None:
    import ray
    from ray import serve

    from serve_apps.gateway import build_app

    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Queue()
    fake = ctx.Process(target=run_fake, args=(ready,), daemon=True)
    fake.start()
    upstream = f"http://127.0.0.1:{ready.get(timeout=30)}"
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        policies = make_policies(root / "policies", upstream)
        catalog = policies / "providers.yaml"  # the tests' short upstream timeout is not for load
        catalog.write_text(catalog.read_text().replace("timeout_s: 0.5", "timeout_s: 30"))
        support = policies / "teams" / "support.yaml"  # its rate limits would answer 429s under load
        support.write_text(
            support.read_text()
            .replace("requests_per_minute: 600", "requests_per_minute: 100000000")
            .replace("tokens_per_minute: 400000", "tokens_per_minute: 100000000000")
        )
        (root / "state").mkdir()
        keys = make_keys(root / "state")
        os.environ.update(
            {
                "OPENAI_API_KEY": OPENAI_KEY,
                "ANTHROPIC_API_KEY": "unused",
                "AZURE_OPENAI_API_KEY": "unused",
                "AWS_ACCESS_KEY_ID": "x",
                "AWS_SECRET_ACCESS_KEY": "x",
                "AWS_EC2_METADATA_DISABLED": "true",
            }
        )
        port = free_port()
        ray.init(address="local", num_cpus=6, include_dashboard=False, _temp_dir=str(root / "ray"), log_to_driver=False)
        try:
            serve.start(http_options={"host": "127.0.0.1", "port": port})
            serve.run(
                build_app({"policies_dir": str(policies), "state_dir": str(root / "state")}),
                name="gateway",
                route_prefix="/",
            )
            serve.run(passthrough_app(upstream), name="passthrough", route_prefix="/passthrough")
            base = f"http://127.0.0.1:{port}"
            targets = {
                "upstream direct": (
                    f"{upstream}/v1/chat/completions",
                    {"authorization": f"Bearer {OPENAI_KEY}"},
                    {**BODY, "model": "gpt-4o-mini"},
                ),
                "serve passthrough": (f"{base}/passthrough/v1/chat/completions", {}, BODY),
                GATEWAYS[0]: (f"{base}/v1/chat/completions", {"authorization": f"Bearer {keys['qa']}"}, BODY),
                GATEWAYS[1]: (
                    f"{base}/v1/chat/completions",
                    {"authorization": f"Bearer {keys['support']}", "x-switchyard-flow": "reply"},
                    PERSONAL_BODY,
                ),
            }
            results: dict[tuple[str, int], dict[str, float]] = {}
            for name, (url, headers, body) in targets.items():  # each must answer 200 before measuring
                check = httpx.post(url, json=body, headers=headers, timeout=30)
                assert check.status_code == 200, f"{name}: {check.status_code} {check.text[:200]}"
            if serve_only is not None:
                hold_for_peers(Path(serve_only), upstream, targets)
                return
            for concurrency in (1, 16):
                for name, (url, headers, body) in targets.items():
                    results[(name, concurrency)] = asyncio.run(load(url, headers, body, concurrency, seconds))
            interleaved = sequential_interleaved(targets, rounds=300)
            streamed = stream_interleaved({k: v for k, v in targets.items() if k != "serve passthrough"}, rounds=200)
            pids = serving_pids(("gateway", "passthrough"))
            cpu: dict[str, tuple[float, int]] = {}
            machine: dict[str, list[tuple[tuple[int, str], float]]] = {}  # where the machine's CPU went
            for name, (url, headers, body) in targets.items():
                if name == "upstream direct":
                    continue
                app = "passthrough" if name == "serve passthrough" else "gateway"
                before, everyone = tree_cpu_s(pids[app]), cpu_by_process()
                errors = asyncio.run(fixed_count(url, headers, body, 16, cpu_requests))
                cpu[name] = ((tree_cpu_s(pids[app]) - before) / cpu_requests * 1000, errors)
                after = cpu_by_process()
                spent = {k: after[k] - v for k, v in everyone.items() if k in after and after[k] - v > 0}
                machine[name] = sorted(spent.items(), key=lambda kv: -kv[1])[:8]
            # The same CPU per request with two gateway replicas (Serve spreads the requests); the
            # passthrough goes first, so the second replica surely finds a logical CPU.
            serve.delete("passthrough")
            serve.run(
                build_app({"policies_dir": str(policies), "state_dir": str(root / "state"), "num_replicas": "2"}),
                name="gateway",
                route_prefix="/",
            )
            url, headers, body = targets[GATEWAYS[0]]
            gateway_pids = serving_pids(("gateway",))["gateway"]
            asyncio.run(fixed_count(url, headers, body, 16, 200))  # warm both replicas
            before = tree_cpu_s(gateway_pids)
            errors = asyncio.run(fixed_count(url, headers, body, 16, cpu_requests))
            two_replicas = ((tree_cpu_s(gateway_pids) - before) / cpu_requests * 1000, errors)
            replicas = sum(
                1 for p in gateway_pids if "ServeReplica:gateway:gateway" in " ".join(psutil.Process(p).cmdline())
            )
            if profile:
                url, headers, body = targets[GATEWAYS[0]]
                profile_replica(
                    gateway_replica_pid(),
                    profile,
                    lambda: asyncio.run(fixed_count(url, headers, body, 16, cpu_requests)),
                )
        finally:
            serve.shutdown()
            ray.shutdown()
            fake.kill()
    print(
        f"Serve with HAProxy ingress (RAY_SERVE_ENABLE_HA_PROXY={os.environ['RAY_SERVE_ENABLE_HA_PROXY']}), "
        f"{seconds:.0f} s per cell, 1 gateway replica, fake OpenAI upstream"
    )
    print(f"{'target':22} {'conc':>4} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'errors':>6}")
    for (name, conc), r in results.items():
        print(f"{name:22} {conc:4d} {r['rps']:8.1f} {r['p50']:8.2f} {r['p99']:8.2f} {int(r['errors']):6d}")
    for gateway in GATEWAYS:
        for conc in (1, 16):
            gw, bare = results[(gateway, conc)], results[("serve passthrough", conc)]
            ratio = gw["rps"] / bare["rps"]
            print(
                f"{gateway}, concurrency {conc}: gateway/passthrough throughput = {ratio:.2f}x "
                f"(target >= 0.8x: {'MET' if ratio >= 0.8 else 'NOT MET'}); "
                f"added p50 = {gw['p50'] - bare['p50']:.2f} ms"
            )
    lat = interleaved["latency"]
    print("interleaved sequential (300 rounds):")
    for name, v in lat.items():
        print(f"  {name:22} p50 {v[len(v) // 2]:6.2f} ms  mean {sum(v) / len(v):6.2f} ms")
    bare_mean = sum(lat["serve passthrough"]) / len(lat["serve passthrough"])
    for gateway in GATEWAYS:
        gw_mean = sum(lat[gateway]) / len(lat[gateway])
        print(
            f"  {gateway}: throughput (1/mean) vs passthrough = {bare_mean / gw_mean:.2f}x; gateway time inside"
            f" the replica (server-timing) p50 = {interleaved['in_replica_gateway_p50'][gateway]:.2f} ms"
        )
    print("per-stage server time, mean ms (server-timing with SWITCHYARD_SERVER_TIMING=stages):")
    for gateway in GATEWAYS:
        means = interleaved["stage_means"][gateway]
        named = sum(ms for stage, ms in means.items() if stage not in ("gateway", "upstream"))
        parts = "  ".join(f"{stage} {ms:.3f}" for stage, ms in means.items())
        print(f"  {gateway:22} {parts}  (outside the named stages: {means['gateway'] - named:.3f})")
    print_streaming(streamed, rounds=200)
    print(
        f"CPU per request ({cpu_requests} requests at concurrency 16;"
        " replica processes, their children, the ledger actor):"
    )
    for name, (ms, errors) in cpu.items():
        print(f"  {name:22} {ms:6.2f} ms CPU/request ({errors} errors); the machine's CPU per request, by process:")
        for (pid, title), spent_s in machine[name]:
            print(f"      {spent_s / cpu_requests * 1000:6.2f} ms  {pid:>7} {title}")
    one = cpu[GATEWAYS[0]][0]
    print(
        f"  {GATEWAYS[0]} with {replicas} gateway replicas: {two_replicas[0]:.2f} ms CPU/request"
        f" ({two_replicas[1]} errors);"
        f" {two_replicas[0] / one:.2f}x one replica's (target <= 1.1x)"
    )
    print(f"load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(
        "reproduce: flock /tmp/switchyard-ray.lock .venv/bin/python bench/gateway_serve.py"
        f" --seconds {seconds:g} --cpu-requests {cpu_requests}"
    )


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--cpu-requests", type=int, default=2000, help="requests per target for CPU per request")
    ap.add_argument("--profile", help="write py-spy's collapsed stacks of the gateway replica under load here")
    ap.add_argument(
        "--serve-only",
        metavar="FILE",
        help="set up the upstream and Serve targets, write them to FILE as JSON and serve until FILE.stop exists"
        " (bench/gateway_peers.sh drives them with wrk)",
    )
    args = ap.parse_args()
    main(args.seconds, args.cpu_requests, args.profile, args.serve_only)
