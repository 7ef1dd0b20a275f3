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

import argparse
import asyncio
import multiprocessing
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI, Request  # no `from __future__ import annotations`: the pickled deployment needs real ones
from fastapi.responses import JSONResponse

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "gateway"))

from gw_fakes import OPENAI_KEY, FakeUpstreams  # noqa: E402
from gw_harness import make_keys, make_policies  # noqa: E402

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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_fake(ready: Any) -> None:
    fake = FakeUpstreams()
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


def sequential_interleaved(
    targets: dict[str, tuple[str, dict[str, str], dict[str, Any]]], rounds: int
) -> dict[str, Any]:
    """Concurrency 1 again, but alternating targets request by request, so that load from
    other processes on this shared machine hits every target alike."""
    out: dict[str, list[float]] = {name: [] for name in targets}
    timing: dict[str, list[float]] = {name: [] for name in targets}
    with httpx.Client(timeout=30) as client:
        for _ in range(rounds):
            for name, (url, headers, body) in targets.items():
                t = time.perf_counter()
                r = client.post(url, json=body, headers=headers)
                out[name].append((time.perf_counter() - t) * 1000)
                if "server-timing" in r.headers:
                    timing[name].append(float(r.headers["server-timing"].split("gateway;dur=")[1].split(",")[0]))
    in_replica = {name: sorted(v) for name, v in timing.items()}
    return {
        "latency": {k: sorted(v) for k, v in out.items()},
        "in_replica_gateway_p50": {k: v[len(v) // 2] for k, v in in_replica.items() if v},
    }


def main(seconds: float) -> None:
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
        ray.init(address="local", num_cpus=4, include_dashboard=False, _temp_dir=str(root / "ray"), log_to_driver=False)
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
            for concurrency in (1, 16):
                for name, (url, headers, body) in targets.items():
                    results[(name, concurrency)] = asyncio.run(load(url, headers, body, concurrency, seconds))
            interleaved = sequential_interleaved(targets, rounds=300)
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
    print(f"load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"reproduce: flock /tmp/switchyard-ray.lock .venv/bin/python bench/gateway_serve.py --seconds {seconds:g}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=8.0)
    main(ap.parse_args().seconds)
