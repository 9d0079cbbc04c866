"""``memfit.check`` with wrong arguments: every one is a ``MemfitError`` naming the argument (the
Python API's version of "one line, exit 2"); nothing else ever leaves it."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

import memfit  # noqa: E402
from memfit.errors import MemfitError  # noqa: E402

DS = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2}, "bf16": {"enabled": True}}


class Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(16, 16)


class Exploding(torch.nn.Module):
    def named_parameters(self, *args, **kwargs):
        raise RuntimeError("boom")


GOOD = dict(gpus="1xa100-80gb", cpu_ram="64GiB", warn=False)

BAD = {
    "model None": (None, {}),
    "model object()": (object(), {}),
    "model a string": ("gpt2", {}),
    "model without parameters": (torch.nn.Module(), {}),
    "model that raises": (Exploding(), {}),
    "ds_config None": (Tiny(), {"ds_config": None}),
    "ds_config a number": (Tiny(), {"ds_config": 5}),
    "ds_config an empty path": (Tiny(), {"ds_config": ""}),
    "ds_config a missing file": (Tiny(), {"ds_config": "/nonexistent/ds.json"}),  # guard: allowed (never exists)
    "ds_config not JSON-typed": (Tiny(), {"ds_config": {**DS, "x": object()}}),
    "ds_config non-string key": (Tiny(), {"ds_config": {**DS, 1: 2}}),
    "gpus a number": (Tiny(), {"gpus": 5}),
    "gpus empty": (Tiny(), {"gpus": ""}),
    "gpus unknown": (Tiny(), {"gpus": "2xfoo"}),
    "nodes a string": (Tiny(), {"nodes": "2"}),
    "nodes zero": (Tiny(), {"nodes": 0}),
    "nodes True": (Tiny(), {"nodes": True}),
    "cpu_ram a list": (Tiny(), {"cpu_ram": [64]}),
    "cpu_ram nonsense": (Tiny(), {"cpu_ram": "lots"}),
    "cpu_ram negative": (Tiny(), {"cpu_ram": -1}),
    "seq_len NaN": (Tiny(), {"seq_len": math.nan}),
    "seq_len a fraction": (Tiny(), {"seq_len": 100.5}),
    "seq_len True": (Tiny(), {"seq_len": True}),
    "seq_len huge": (Tiny(), {"seq_len": 10**40}),
    "micro_batch zero": (Tiny(), {"micro_batch": 0}),
    "gradient_checkpointing 'no'": (Tiny(), {"gradient_checkpointing": "no"}),
    "model_parameters unknown": (Tiny(), {"model_parameters": "some"}),
    "deepspeed_version a float": (Tiny(), {"deepspeed_version": 0.19}),
    "raise_on_failure a string": (Tiny(), {"raise_on_failure": "yes"}),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_a_wrong_argument_is_a_memfit_error(name):
    model, change = BAD[name]
    kwargs = {**GOOD, **change}
    ds = kwargs.pop("ds_config", DS)
    with pytest.raises(MemfitError) as err:
        memfit.check(model, ds, **kwargs)
    assert "\n" not in str(err.value)


def test_the_right_arguments_plan_and_a_failure_is_both_a_memfit_error_and_a_memory_error():
    plan = memfit.check(Tiny(), DS, **GOOD)
    assert plan.verdict.fits and all(isinstance(p.gpu_peak_bytes, int) and p.gpu_peak_bytes >= 0 for p in plan.phases)
    with pytest.raises(memfit.MemfitCheckError) as err:
        memfit.check(Tiny(), DS, gpus="1x1GiB", cpu_ram="1GiB", seq_len=2**20, warn=False)
    assert isinstance(err.value, MemfitError) and isinstance(err.value, MemoryError)
