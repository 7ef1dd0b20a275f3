"""Threads for a provider whose client blocks (boto3, for Bedrock), owned by the provider.

On the event loop's default workers (`asyncio.to_thread`), as they were, a provider's calls
took threads every request needs (its audit record is built there), and there are only
min(32, CPUs + 4) of them: six on a 2-CPU replica. A seventh Bedrock call waited for a thread
while its timeout ran, and on timeout was charged at the bound though it was never sent
(stop 49). Here each provider has as many threads as its client has connections, and a call
that times out before a thread took it is withdrawn, and known never to have been sent.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")

MAX_CALLS = 50  # per provider: its boto3 client's connection pool (`max_pool_connections`) too


class BlockingCalls:
    def __init__(self, provider: str, max_calls: int = MAX_CALLS) -> None:
        self._pool = ThreadPoolExecutor(max_workers=max_calls, thread_name_prefix=f"provider-{provider}")

    def submit(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> Future[T]:
        """Start `fn` on one of the provider's threads (await it with `asyncio.wrap_future`)."""
        return self._pool.submit(fn, *args, **kwargs)

    def close(self) -> None:
        """Withdraw the calls not started; those under way finish on their threads."""
        self._pool.shutdown(wait=False, cancel_futures=True)


def withdraw(call: Future[Any]) -> bool:
    """Withdraw a call that is still waiting for a thread. True when it was sent all the same
    (a thread had taken it: it runs on, and the provider may bill its answer)."""
    return not call.cancel()
