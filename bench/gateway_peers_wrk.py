"""The measuring half of bench/gateway_peers.sh: wrk against each target at concurrency 1 and
16, the CPU per request of the processes that serve it (from /proc, over a fixed-length wrk
run), then the table and the ratios; then streamed answers at concurrency 1 (time to first
token and per-chunk overhead against the upstream, `gateway_streaming`).

    .venv/bin/python bench/gateway_peers_wrk.py TARGETS.json WRK [--seconds 15]

TARGETS.json: `{"targets": {name: {"url", "headers", "body", "pids"}}}`, as
`bench/gateway_serve.py --serve-only` writes it, with the peers the script started added.
"""

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import psutil  # installed with ray[default]

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gateway_streaming import print_streaming, stream_interleaved

SWITCHYARD = "gateway qa/plain"


def lua(headers: dict[str, str], body: dict[str, Any]) -> str:
    """A wrk script that POSTs `body` as JSON with `headers`."""
    lines = ['wrk.method = "POST"', f"wrk.body = {json.dumps(json.dumps(body))}"]
    lines.append('wrk.headers["Content-Type"] = "application/json"')
    lines += [f"wrk.headers[{json.dumps(k)}] = {json.dumps(v)}" for k, v in headers.items()]
    return "\n".join(lines) + "\n"


def tree_cpu_s(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc = psutil.Process(pid)
            for p in (proc, *proc.children(recursive=True)):
                with contextlib.suppress(psutil.NoSuchProcess):
                    t = p.cpu_times()
                    total += t.user + t.system
    return total


def _ms(text: str) -> float:
    value, unit = re.fullmatch(r"([\d.]+)(us|ms|s)", text).groups()  # type: ignore[union-attr]
    return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]


def wrk(binary: str, target: dict[str, Any], connections: int, seconds: float) -> dict[str, float]:
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
        script.write(lua(target["headers"], target["body"]))
    before = tree_cpu_s(target["pids"])
    out = subprocess.run(
        [binary, "-t1", f"-c{connections}", f"-d{seconds:g}s", "--latency", "-s", script.name, target["url"]],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    spent = tree_cpu_s(target["pids"]) - before
    os.unlink(script.name)
    requests = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return {
        "rps": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),  # type: ignore[union-attr]
        "p50": _ms(re.search(r"50%\s+(\S+)", out).group(1)),  # type: ignore[union-attr]
        "p99": _ms(re.search(r"99%\s+(\S+)", out).group(1)),  # type: ignore[union-attr]
        "errors": float(errors.group(1)) if errors else 0.0,
        "cpu_ms": spent / max(requests, 1) * 1000 if target["pids"] else float("nan"),
    }


def main(path: Path, binary: str, seconds: float, stream_rounds: int) -> None:
    targets: dict[str, dict[str, Any]] = json.loads(path.read_text())["targets"]
    results: dict[tuple[str, int], dict[str, float]] = {}
    for connections in (1, 16):
        for name, target in targets.items():
            results[(name, connections)] = wrk(binary, target, connections, seconds)
            r = results[(name, connections)]
            print(f"  {name} c={connections}: {r['rps']:.0f} req/s", file=sys.stderr, flush=True)
    print(f"wrk {seconds:g} s per cell, one thread; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print("| target | c=1 req/s | p50 ms | c=16 req/s | p50 ms | p99 ms | errors | CPU/request (c=16) |")
    print("|---|---|---|---|---|---|---|---|")
    for name in targets:
        one, many = results[(name, 1)], results[(name, 16)]
        cpu = "—" if many["cpu_ms"] != many["cpu_ms"] else f"{many['cpu_ms']:.2f} ms"
        print(
            f"| {name} | {one['rps']:,.0f} | {one['p50']:.2f} | {many['rps']:,.0f} | {many['p50']:.2f} |"
            f" {many['p99']:.2f} | {int(one['errors'] + many['errors'])} | {cpu} |"
        )
    print(f"ratios of {SWITCHYARD}'s throughput:")
    for name in targets:
        if name != SWITCHYARD:
            ratios = [results[(SWITCHYARD, c)]["rps"] / results[(name, c)]["rps"] for c in (1, 16)]
            print(f"  vs {name}: {ratios[0]:.2f}x (c=1), {ratios[1]:.2f}x (c=16)")
    if stream_rounds:  # the Serve passthrough reads the whole answer: it does not stream
        streamed = {n: (t["url"], t["headers"], t["body"]) for n, t in targets.items() if n != "serve passthrough"}
        print_streaming(stream_interleaved(streamed, stream_rounds), stream_rounds)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("targets", type=Path)
    ap.add_argument("wrk")
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--stream-rounds", type=int, default=100, help="streamed requests per target (0: none)")
    args = ap.parse_args()
    main(args.targets, args.wrk, args.seconds, args.stream_rounds)
