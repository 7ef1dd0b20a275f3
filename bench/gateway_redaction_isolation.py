"""Does one team's large personal message delay another team's small requests?

    .venv/bin/python bench/gateway_redaction_isolation.py [--seconds 8] [--concurrency 4]

Three processes on 127.0.0.1: the fake upstreams (OpenAI's wire format), one gateway
(uvicorn, the real pipeline with the Presidio redactor) and this load generator. Team `qa`
sends a stream of small requests (flow `plain`, class `internal`) at a fixed concurrency;
meanwhile team `support` sends 100 KB `personal` messages (flow `reply`, redacted) one
after another. Each phase runs twice, side by side in one run:

  analysed in a process    what the gateway does: large texts redacted in a thread
                           (`RedactionPool`), their Presidio analysis in a worker process
                           (`AnalysisProcessPool`), so the loop keeps the GIL
  redacted in a thread     the thread alone (analysis holds the GIL in the gateway process)
  on the loop (old)        every text redacted inline on the event loop

and once with no large messages at all (baseline). It prints p50/p99 of the small requests,
the large requests' own latency, and the ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "platform"), str(ROOT / "tests" / "gateway")]

LARGE_CHARS = 100_000


def personal_text(chars: int, seed: int) -> str:
    """Customer prose with an email or phone number every ~100 words (the shape Presidio meets)."""
    rng = random.Random(seed)
    words = ("my", "parcel", "arrived", "late", "and", "the", "router", "does", "not", "start")
    words += ("please", "call", "me", "back", "about", "order")
    out: list[str] = []
    size = 0
    while size < chars:
        r = rng.random()
        if r < 0.01:
            w = f"jane.doe{rng.randint(0, 99)}@example.com"
        elif r < 0.02:
            w = f"+44 20 7946 {rng.randint(0, 9999):04d}"
        else:
            w = rng.choice(words)
        out.append(w)
        size += len(w) + 1
    return " ".join(out)[:chars]


# ---------------------------------------------------------------- child processes


def run_upstream() -> None:
    from gw_fakes import FakeUpstreams

    fake = FakeUpstreams()
    fake.start()
    print(fake.base, flush=True)
    sys.stdin.read()  # until the parent closes our stdin
    fake.stop()


def run_gateway(upstream: str, mode: str) -> None:
    import uvicorn
    from gw_harness import build_harness, make_keys, make_policies

    from switchyard.audit.analysis_pool import AnalysisProcessPool
    from switchyard.audit.redaction import PresidioRedactor, TextScrubber
    from switchyard.gateway.http import create_app

    root = Path(tempfile.mkdtemp(prefix="sy-redact-bench-"))
    policies = make_policies(root / "policies", upstream)
    state = root / "state"
    state.mkdir()
    keys = make_keys(state)
    h = build_harness(policies, state, keys)
    offload = AnalysisProcessPool() if mode == "process" else None
    redactor = PresidioRedactor(lambda: h.store.current.data, TextScrubber(offload=offload))
    h.parts.redactor = redactor
    if mode == "inline":
        h.pipeline.redaction.inline_chars = 10**9
    app = create_app(lambda: h.pipeline)
    import socket

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)  # asyncio sets TCP_NODELAY
    sock.bind(("127.0.0.1", 0))
    print(f"{sock.getsockname()[1]} {keys['qa']} {keys['support']}", flush=True)
    uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")).run(sockets=[sock])


# ---------------------------------------------------------------- load


async def phase(
    url: str, qa_key: str, support_key: str, seconds: float, concurrency: int, large: bool
) -> dict[str, object]:
    import httpx

    small_ms: list[float] = []
    large_ms: list[float] = []
    statuses: dict[int, int] = {}
    stop_at = time.monotonic() + seconds
    big = personal_text(LARGE_CHARS, 7)

    async with httpx.AsyncClient(base_url=url, timeout=60) as client:

        async def small_loop() -> None:
            body = {"model": "auto", "messages": [{"role": "user", "content": "Where is my parcel?"}]}
            headers = {"authorization": f"Bearer {qa_key}"}
            while time.monotonic() < stop_at:
                t0 = time.perf_counter()
                r = await client.post("/v1/chat/completions", json=body, headers=headers)
                small_ms.append((time.perf_counter() - t0) * 1000)
                statuses[r.status_code] = statuses.get(r.status_code, 0) + 1

        async def large_loop() -> None:
            headers = {"authorization": f"Bearer {support_key}", "x-switchyard-flow": "reply"}
            n = 0
            while time.monotonic() < stop_at:
                body = {
                    "model": "auto",
                    "messages": [{"role": "user", "content": f"{n} {big}"}],  # distinct: no cache hit
                    "variables": {"product": "Acme Router"},
                }
                t0 = time.perf_counter()
                r = await client.post("/v1/chat/completions", json=body, headers=headers)
                large_ms.append((time.perf_counter() - t0) * 1000)
                statuses[1000 + r.status_code] = statuses.get(1000 + r.status_code, 0) + 1
                n += 1

        tasks = [small_loop() for _ in range(concurrency)] + ([large_loop()] if large else [])
        await asyncio.gather(*tasks)
    return {"small": small_ms, "large": large_ms, "statuses": statuses}


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def start(args: list[str]) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, __file__, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if not line:
        raise RuntimeError(f"child {args} did not start")
    return proc, line


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--role", choices=["upstream", "gateway"])
    ap.add_argument("--upstream")
    ap.add_argument("--mode", choices=["process", "thread", "inline"], default="process")
    args = ap.parse_args()
    if args.role == "upstream":
        return run_upstream()
    if args.role == "gateway":
        return run_gateway(args.upstream, args.mode)

    from gw_fakes import ANTHROPIC_KEY, OPENAI_KEY

    os.environ.update({"OPENAI_API_KEY": OPENAI_KEY, "ANTHROPIC_API_KEY": ANTHROPIC_KEY})
    upstream, base = start(["--role", "upstream"])
    rows = []
    try:
        for label, mode, large in (
            ("no large messages (baseline)", "process", False),
            ("large: analysed in a process", "process", True),
            ("large: redacted in a thread", "thread", True),
            ("large: on the loop (old)", "inline", True),
        ):
            gateway, line = start(["--role", "gateway", "--upstream", base, "--mode", mode])
            port, qa_key, support_key = line.split()
            try:
                url = f"http://127.0.0.1:{port}"
                asyncio.run(phase(url, qa_key, support_key, 1.0, args.concurrency, False))  # warm up
                result = asyncio.run(phase(url, qa_key, support_key, args.seconds, args.concurrency, large))
            finally:
                gateway.terminate()
                gateway.wait(timeout=10)
            rows.append((label, result))
    finally:
        upstream.terminate()
        upstream.wait(timeout=10)

    base_p99 = pct(rows[0][1]["small"], 0.99)  # type: ignore[arg-type]
    print(
        f"\nsmall requests: team qa, concurrency {args.concurrency}, {args.seconds:.0f} s per phase; "
        f"large: team support, {LARGE_CHARS // 1000} KB personal messages, one at a time\n"
    )
    print(
        f"{'phase':32} {'small n':>8} {'p50 ms':>8} {'p99 ms':>8} {'p99/base':>9} "
        f"{'large n':>8} {'large p50 ms':>13} statuses"
    )
    for label, r in rows:
        small, large = r["small"], r["large"]
        assert isinstance(small, list) and isinstance(large, list)
        print(
            f"{label:32} {len(small):8d} {statistics.median(small):8.1f} {pct(small, 0.99):8.1f} "
            f"{pct(small, 0.99) / base_p99:8.2f}x {len(large):8d} "
            f"{(statistics.median(large) if large else float('nan')):13.0f} {r['statuses']}"
        )
    print("\nstatuses: small by HTTP status; large as 1000 + status")
    print(
        "reproduce: .venv/bin/python bench/gateway_redaction_isolation.py "
        f"--seconds {args.seconds:g} --concurrency {args.concurrency}"
    )


if __name__ == "__main__":
    main()
