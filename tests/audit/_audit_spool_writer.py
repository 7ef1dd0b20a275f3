"""A gateway-like writer for the crash test: records exchanges until it is killed.

Usage: python _audit_spool_writer.py STATE_DIR ACK_FILE
Every 4th request is high-risk (durable); the rest are spooled. After `record` returns
(the moment a gateway would send the response) the request id is appended to ACK_FILE.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from _audit_helpers import make_exchange, make_flow

from switchyard.audit.data_policy import load_data_policies
from switchyard.audit.sink import open_sink
from switchyard.paths import repo_root
from switchyard.policy.models import RiskTier


async def main(state: Path, ack_path: Path) -> None:
    interval = float(os.environ.get("SWITCHYARD_AUDIT_DRAIN_INTERVAL", "0.2"))
    sink = await open_sink(state, load_data_policies(repo_root() / "policies"), drain_interval_s=interval)
    high = make_flow(team="payments", flow="dispute-review", data_class="confidential", risk=RiskTier.HIGH)
    low = make_flow()
    ack = os.open(ack_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    n = 0
    while True:
        n += 1
        is_high = n % 4 == 0
        exchange = make_exchange(flow=high if is_high else low, request_id=f"{os.getpid()}-{n}")
        await sink.record(exchange, durable=is_high)
        backlog = sink.spool.backlog if sink.spool else 0
        tier = "high" if is_high else "low"
        os.write(ack, f"{exchange.ctx.request_id} {tier} {backlog}\n".encode())


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), Path(sys.argv[2])))
