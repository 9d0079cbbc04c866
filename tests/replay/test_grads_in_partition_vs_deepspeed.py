"""``grads_in_partition_numel`` (shared by the ledger and the recommender's fast estimator, so their
equality cannot catch a bug in it) against DeepSpeed's own partition bookkeeping.

DeepSpeed 0.19.8 stage_1_and_2.py ``DeepSpeedZeroOptimizer.get_partition_info`` decides which params
are rank r's ``params_in_partition``; ``copy_grads_in_partition`` then sizes ``grads_in_partition``
as the sum of their whole ``numel()``. ``get_partition_info`` reads nothing from ``self``; it is called
here unbound on stand-in tensors, for rank 0 of a W-rank world whose flat buffer is aligned to 2W
(the last param padded, as ``round_robin_bit16_padding``)."""

from __future__ import annotations

import types

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memfit.core.ledger.context import ceil_div
from memfit.core.ledger.deepspeed.zero012 import grads_in_partition_numel

stage12 = pytest.importorskip("deepspeed.runtime.zero.stage_1_and_2")


class _Tensor:
    def __init__(self, n: int) -> None:
        self.n = n

    def numel(self) -> int:
        return self.n


def deepspeed_grads_in_partition(numels: list[int], world: int) -> int:
    flat = ceil_div(sum(numels), 2 * world) * 2 * world
    padding = [0] * (len(numels) - 1) + [flat - sum(numels)]
    in_part, _, _ = stage12.DeepSpeedZeroOptimizer.get_partition_info(
        types.SimpleNamespace(), [_Tensor(n) for n in numels], flat // world, 0, padding)
    return sum(t.numel() for t in in_part)


@settings(max_examples=400, deadline=None, database=None)
@given(numels=st.lists(st.integers(min_value=1, max_value=5000), min_size=1, max_size=30),
       world=st.integers(min_value=1, max_value=8))
def test_grads_in_partition_is_deepspeeds(numels, world):
    part = ceil_div(sum(numels), 2 * world) * 2
    assert grads_in_partition_numel(numels, part) == deepspeed_grads_in_partition(numels, world)


@pytest.mark.parametrize(("numels", "world", "expected"), [
    ([1024, 8192, 64, 32768, 512], 2, 42048),  # the GPT-J prefix replay: the 32,768 param straddles, counted whole
    ([100, 100], 1, 200),                      # W = 1: everything
    ([10, 10, 10, 10], 2, 20),                 # the boundary falls between params
])
def test_edges(numels, world, expected):
    part = ceil_div(sum(numels), 2 * world) * 2
    assert grads_in_partition_numel(numels, part) == deepspeed_grads_in_partition(numels, world) == expected
