"""``split_sub_groups`` (shared by the ledger and the recommender's fast estimator, so their
equality cannot catch a bug in it) against DeepSpeed's own ``_create_fp16_sub_groups``.

DeepSpeed 0.19.8 stage3.py ``DeepSpeedZeroOptimizer_Stage3._create_fp16_sub_groups`` reads only
``self.sub_group_size`` and each param's ``partition_numel()``; it is called here unbound, on
stand-ins for both, over generated partition sizes and sub-group sizes.
"""

from __future__ import annotations

import types

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memfit.core.ledger.deepspeed.zero3 import split_sub_groups

stage3 = pytest.importorskip("deepspeed.runtime.zero.stage3")


class _Param:
    def __init__(self, n: int) -> None:
        self.n = n

    def partition_numel(self) -> int:
        return self.n


def deepspeed_sub_groups(parts: list[int], sub_group_size: int | None) -> list[int]:
    fake_self = types.SimpleNamespace(sub_group_size=sub_group_size)
    groups = stage3.DeepSpeedZeroOptimizer_Stage3._create_fp16_sub_groups(fake_self, [_Param(n) for n in parts])
    return [sum(p.n for p in g) for g in groups]


@settings(max_examples=400, deadline=None, database=None)
@given(parts=st.lists(st.integers(min_value=1, max_value=5000), min_size=1, max_size=40),  # ceil(p/W) >= 1
       sub_group_size=st.integers(min_value=1, max_value=60_000))
def test_sub_groups_are_deepspeeds(parts, sub_group_size):
    assert split_sub_groups(parts, sub_group_size) == deepspeed_sub_groups(parts, sub_group_size)


@pytest.mark.parametrize(("parts", "size"), [
    ([10, 20, 30], 10**9),        # everything fits: one group
    ([10, 20, 30], 30),           # closes at 30, then at 30
    ([10, 20, 30], 25),           # a param is never split
    ([7] * 10, 7),                # one param per group
])
def test_edges(parts, size):
    assert split_sub_groups(parts, size) == deepspeed_sub_groups(parts, size)
