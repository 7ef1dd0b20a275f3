"""The background batch thread: same order as reading synchronously, a producer's error
raised in the loop as itself, and a clean stop while the producer waits on a full queue."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
import torch

from switchyard.train.batch_thread import BackgroundBatches
from switchyard.train.data import TokenBatches
from switchyard.train.loop import step_batches


def _batches() -> TokenBatches:
    tokens = torch.randint(0, 256, (4_001,), generator=torch.Generator().manual_seed(0))
    return TokenBatches(tokens, 16, 2, rank=1, world_size=2, seed=5)


def test_batches_arrive_in_the_synchronous_order_with_their_data_positions() -> None:
    steps = 150  # past an epoch (125 windows / 4 per step = 31 steps an epoch)
    synchronous = step_batches(_batches(), 2)
    expected = [next(synchronous) for _ in range(steps)]
    with BackgroundBatches(step_batches(_batches(), 2), depth=2) as prepared:
        got = [next(prepared) for _ in range(steps)]
    for (want_state, want), (state, micro) in zip(expected, got, strict=True):
        assert state == want_state
        pairs = [(a, b) for mine, theirs in zip(micro, want, strict=True) for a, b in zip(mine, theirs, strict=True)]
        assert all(torch.equal(a, b) for a, b in pairs)


@pytest.mark.timeout(20)  # a lost error would leave the loop waiting forever
def test_a_producer_error_is_raised_in_the_loop_as_the_original_exception() -> None:
    failure = OSError("shard-00003.bin: truncated")

    def source() -> Iterator[int]:
        yield from (1, 2, 3)
        raise failure

    prepared = BackgroundBatches(source(), depth=2)
    assert [next(prepared), next(prepared), next(prepared)] == [1, 2, 3]
    with pytest.raises(OSError, match="truncated") as raised:
        next(prepared)
    assert raised.value is failure
    assert any(frame.name == "source" for frame in raised.traceback)  # where it happened
    with pytest.raises(StopIteration):
        next(prepared)
    prepared.close()
    assert not prepared.alive


@pytest.mark.timeout(20)
def test_close_stops_a_producer_blocked_on_a_full_queue() -> None:
    made: list[int] = []

    def endless() -> Iterator[int]:
        i = 0
        while True:
            made.append(i)
            yield i
            i += 1

    prepared = BackgroundBatches(endless(), depth=2)
    assert next(prepared) == 0
    deadline = time.monotonic() + 5
    while len(made) < 4 and time.monotonic() < deadline:  # 2 queued + 1 waiting to be put
        time.sleep(0.01)
    time.sleep(0.2)
    assert len(made) == 4  # bounded: it read ahead by the queue's depth and one more, no further
    started = time.monotonic()
    prepared.close()
    assert not prepared.alive and time.monotonic() - started < 2
    assert "batch-producer" not in {t.name for t in threading.enumerate()}
