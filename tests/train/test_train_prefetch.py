from __future__ import annotations

from collections import namedtuple

import pytest
import torch

from switchyard.train.prefetch import DevicePrefetcher, map_tensors

Pair = namedtuple("Pair", "x y")


def test_cpu_prefetcher_yields_in_order_and_stops() -> None:
    source = iter([torch.tensor([i]) for i in range(5)])
    out = [int(t) for t in DevicePrefetcher(source, torch.device("cpu"))]
    assert out == [0, 1, 2, 3, 4]


def test_nested_batches_keep_their_structure() -> None:
    batch = {"ids": torch.ones(2), "pair": (torch.zeros(1), [torch.ones(1), "label"]), "nt": Pair(torch.ones(1), 3)}
    seen: list[torch.Tensor] = []
    out = map_tensors(batch, lambda t: seen.append(t) or t * 2)  # type: ignore[func-returns-value]
    assert len(seen) == 4
    assert out["pair"][1][1] == "label" and isinstance(out["nt"], Pair) and out["nt"].y == 3
    assert torch.equal(out["ids"], torch.full((2,), 2.0))
    got = next(DevicePrefetcher(iter([batch]), torch.device("cpu")))
    assert got.keys() == batch.keys() and isinstance(got["pair"], tuple)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_prefetcher_matches_source_values() -> None:  # pragma: no cover - GPU machines
    batches = [{"x": torch.full((256, 256), float(i))} for i in range(4)]
    got = [b["x"] for b in DevicePrefetcher(iter(batches), torch.device("cuda"))]
    assert all(g.is_cuda and float(g[0, 0]) == i for i, g in enumerate(got))
