"""Streamed answers side by side: time to the first content chunk and the gap between chunks,
per target, and what a gateway adds to each against the upstream called directly.

Used by bench/gateway_serve.py and bench/gateway_peers_wrk.py. Concurrency 1, targets
alternated request by request, so load from other processes on a shared machine hits every
target alike; medians over the rounds.
"""

import json
import time
from typing import Any

import httpx

Target = tuple[str, dict[str, str], dict[str, Any]]  # url, headers, body (sent with "stream": true)
DIRECT = "upstream direct"


def stream_interleaved(targets: dict[str, Target], rounds: int) -> dict[str, dict[str, float]]:
    """Streamed answers at concurrency 1, alternating targets request by request: time to the
    first content chunk, and the mean gap between content chunks, per target (medians over
    rounds). Against `upstream direct`, what the gateway adds to each."""
    ttft: dict[str, list[float]] = {name: [] for name in targets}
    gaps: dict[str, list[float]] = {name: [] for name in targets}
    chunks: dict[str, list[int]] = {name: [] for name in targets}
    failed: dict[str, str] = {}  # target -> why its stream failed
    with httpx.Client(timeout=30) as client:
        for _ in range(rounds):
            for name, (url, headers, body) in targets.items():
                started = time.perf_counter()
                arrivals = []
                if name in failed:
                    continue
                with client.stream("POST", url, json={**body, "stream": True}, headers=headers) as r:
                    if r.status_code != 200:  # reported, and the target left out of the rounds
                        failed[name] = f"HTTP {r.status_code}: {r.read()[:120].decode(errors='replace')}"
                        continue
                    for line in r.iter_lines():
                        if has_text(line):
                            arrivals.append(time.perf_counter())
                assert arrivals, f"{name}: a stream with no content chunk"
                ttft[name].append((arrivals[0] - started) * 1000)
                chunks[name].append(len(arrivals))
                if len(arrivals) > 1:
                    gaps[name].append((arrivals[-1] - arrivals[0]) / (len(arrivals) - 1) * 1000)

    def median(v: list[float]) -> float:
        return sorted(v)[len(v) // 2] if v else float("nan")

    for name, why in failed.items():
        print(f"  {name}: streaming failed, left out: {why}")
    return {
        name: {
            "ttft": median(ttft[name]),
            "gap": median(gaps[name]),
            "chunks": median([float(c) for c in chunks[name]]),
        }
        for name in targets
        if name not in failed
    }


def has_text(line: str) -> bool:
    """An SSE line carrying answer text (not the role chunk, a usage chunk or `[DONE]`)."""
    if not line.startswith("data: ") or line == "data: [DONE]":
        return False
    chunk = json.loads(line[len("data: ") :])
    return any((c.get("delta") or {}).get("content") for c in chunk.get("choices") or [])


def print_streaming(results: dict[str, dict[str, float]], rounds: int) -> None:
    print(f"streaming, interleaved at concurrency 1 ({rounds} rounds; medians):")
    direct = results[DIRECT]
    for name, r in results.items():
        added = (
            ""
            if name == DIRECT
            else (
                f"  added TTFT {r['ttft'] - direct['ttft']:+.2f} ms,"
                f" per-chunk overhead {r['gap'] - direct['gap']:+.3f} ms"
            )
        )
        print(f"  {name:22} TTFT {r['ttft']:6.2f} ms  chunk gap {r['gap']:6.3f} ms  ({r['chunks']:.0f} chunks){added}")
