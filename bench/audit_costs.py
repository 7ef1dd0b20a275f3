"""What redaction and auditing add to one request, stage by stage, in-process (no Ray).

    .venv/bin/python bench/audit_costs.py [--requests 400]

Stages, each timed per request over the same messages (a system prompt and a ~600-character
customer message with an email, a phone number, a card number and an IBAN):
  redact       PresidioRedactor.redact, class `personal` (what the gateway calls before sending)
  redact-clean the same on a message with no personal data (the common case)
  restore      PlaceholderRestorer over the answer streamed in 8-character chunks
  build        RecordBuilder.build: scrub for storage + AES-GCM + the record (the sink does it);
               the input's analysis is reused from the redactor (cached by digest)
  build-cold   the same when nothing is cached (a class that sends raw but stores redacted)
  durable      AuditStore.append of one record (SQLite WAL, synchronous=FULL): high-risk path
  spool-put    AuditSpool.put of one record: the low/medium-risk path's cost on the request
  drain        AuditSpool drain: records moved from spool to SQLite per second (background)
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "platform"), str(ROOT / "tests" / "audit")]

from _audit_helpers import make_exchange, make_flow  # noqa: E402

from switchyard.audit.builder import RecordBuilder  # noqa: E402
from switchyard.audit.data_policy import load_data_policies  # noqa: E402
from switchyard.audit.redaction import PresidioRedactor, TextScrubber  # noqa: E402
from switchyard.audit.spool import AuditSpool  # noqa: E402
from switchyard.audit.store import AuditStore  # noqa: E402
from switchyard.audit.subject_keys import SubjectKeyring  # noqa: E402

CUSTOMER = (
    "Hello, my order 88123 arrived damaged and the courier left it in the rain. I paid with my "
    "card 4111 1111 1111 1111 and would like a refund to my account GB82 WEST 1234 5698 7654 32 "
    "instead of store credit. You can reach me at jane.doe@example.com or on +1 415-555-0132 "
    "between nine and five. The box was crushed on one side, the packing slip was missing, and "
    "the product itself has a cracked screen. I have photos if you need them. I have been a "
    "customer for six years and this is the first time something like this has happened."
)
CLEAN = CUSTOMER.split(" I paid")[0] + " The box was crushed on one side and the screen is cracked."
SYSTEM = "You are a helpful support agent for an online shop. Answer briefly and politely."


def timed(fn: Callable[[int], object], n: int, before: Callable[[int], object] | None = None) -> list[float]:
    """Time fn(i) for i in 1..n, each a distinct request; `before(i)` runs untimed first."""
    fn(0)  # warm
    out = []
    for i in range(1, n + 1):
        if before is not None:
            before(i)
        t = time.perf_counter()
        fn(i)
        out.append((time.perf_counter() - t) * 1000)
    return out


def customer(i: int, text: str = "") -> list[dict[str, str]]:
    """A distinct request per i (the order number changes), so nothing is served from cache."""
    body = (text or CUSTOMER).replace("88123", f"{88123 + i}")
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": body}]


def report(name: str, ms: list[float]) -> None:
    q = statistics.quantiles(ms, n=100)
    print(f"{name:<13} median {statistics.median(ms):7.3f} ms   p95 {q[94]:7.3f} ms   n={len(ms)}")


async def spool_costs(tmp: Path, builder: RecordBuilder, n: int) -> None:
    store = AuditStore.in_state_dir(tmp / "spool-state")
    spool = AuditSpool(tmp / "spool", store, drain_interval_s=3600, max_backlog=10 * n)
    await spool.start()
    pendings = [builder.build(make_exchange()) for _ in range(n)]
    ms = []
    for p in pendings:
        t = time.perf_counter()
        await spool.put(p)
        ms.append((time.perf_counter() - t) * 1000)
    report("spool-put", ms)
    t = time.perf_counter()
    drained = await spool.drain_once()
    elapsed = time.perf_counter() - t
    print(f"{'drain':<13} {drained.lines / elapsed:9.0f} records/s ({drained.lines} in {elapsed * 1000:.0f} ms)")
    await spool.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=400)
    n = parser.parse_args().requests
    policies = load_data_policies(ROOT / "policies")
    t = time.perf_counter()
    scrubber = TextScrubber()
    print(f"analyzer build: {(time.perf_counter() - t) * 1000:.0f} ms (once per process)")
    redactor = PresidioRedactor(policies, scrubber)
    report("redact", timed(lambda i: redactor.redact(customer(i), "personal"), n))
    report("redact-clean", timed(lambda i: redactor.redact(customer(i, CLEAN), "personal"), n))
    redacted = redactor.redact(customer(0), "personal")
    answer = "Sorry! We will refund <IBAN_CODE_1> and write to <EMAIL_ADDRESS_1> today. " * 4
    chunks = [answer[i : i + 8] for i in range(0, len(answer), 8)]

    def restore(_: int) -> None:
        r = redactor.restorer(redacted)
        "".join(r.feed(c) for c in chunks) + r.flush()

    report("restore", timed(restore, n))
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        builder = RecordBuilder(policies, scrubber, SubjectKeyring.in_state_dir(tmp))
        flow = make_flow()
        # As in the gateway: the input was analysed by the redactor just before (cached by
        # digest), the output is new text.
        exchanges = [
            make_exchange(flow=flow, text=customer(i)[1]["content"], output=f"{answer} #{i}") for i in range(n + 1)
        ]
        report(
            "build",
            timed(
                lambda i: builder.build(exchanges[i]),
                n,
                before=lambda i: redactor.redact(exchanges[i].input_messages, "personal"),
            ),
        )
        cold = [
            make_exchange(flow=flow, text=customer(10_000 + i)[1]["content"], output=f"{answer} #{i}")
            for i in range(n + 1)
        ]
        report("build-cold", timed(lambda i: builder.build(cold[i]), n))
        store = AuditStore.in_state_dir(tmp)
        pend = [builder.build(make_exchange(request_id=uuid.uuid4().hex)) for _ in range(n + 1)]
        report("durable", timed(lambda i: store.append([pend[i]]), n))
        asyncio.run(spool_costs(tmp, builder, n))
    print(f"reproduce: .venv/bin/python bench/audit_costs.py --requests {n}")


if __name__ == "__main__":
    main()
