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
    "deepspeed_version not modelled": (Tiny(), {"deepspeed_version": "0.9.1"}),
    "deepspeed_version not a version": (Tiny(), {"deepspeed_version": "latest"}),
    "raise_on_failure a string": (Tiny(), {"raise_on_failure": "yes"}),
    # issue 24 item 6: these raised raw exceptions or were silently ignored/misread
    "ddp a string": (Tiny(), {"ds_config": None, "framework": "ddp", "ddp": "x", "gpus": "2xa100-80gb"}),
    "ddp a list": (Tiny(), {"ds_config": None, "framework": "ddp", "ddp": [1, 2], "gpus": "2xa100-80gb"}),
    "fsdp a number": (Tiny(), {"ds_config": None, "framework": "fsdp", "fsdp": 5, "gpus": "2xa100-80gb"}),
    "ddp bucket NaN": (Tiny(), {"ds_config": None, "framework": "ddp", "ddp": {"bucket_cap_mb": math.nan},
                                "gpus": "2xa100-80gb"}),
    "fsdp min_num_params text": (Tiny(), {"ds_config": None, "framework": "fsdp", "gpus": "2xa100-80gb",
                                          "fsdp": {"wrap_policy": "size", "min_num_params": "many"}}),
    "fsdp unknown key": (Tiny(), {"ds_config": None, "framework": "fsdp", "fsdp": {"ofload": True},
                                  "gpus": "2xa100-80gb"}),
    "grad_accum zero": (Tiny(), {"ds_config": None, "framework": "torch", "grad_accum": 0}),
    "grad_accum zero with DeepSpeed": (Tiny(), {"grad_accum": 0}),
    "precision amp_bf16 with DeepSpeed": (Tiny(), {"precision": "amp_bf16"}),
    "precision contradicting the config": (Tiny(), {"precision": "fp16"}),
    "grad_accum contradicting the config": (Tiny(), {"ds_config": {**DS, "gradient_accumulation_steps": 2},
                                                     "grad_accum": 4}),
    "optim not a client AdamW under DeepSpeed": (Tiny(), {"optim": "sgd"}),
    "optim unknown": (Tiny(), {"ds_config": None, "framework": "torch", "optim": "adam_x"}),
    "precision unknown": (Tiny(), {"ds_config": None, "framework": "torch", "precision": "fp8"}),
    "framework a number": (Tiny(), {"framework": 5}),
    "ddp with DeepSpeed": (Tiny(), {"ddp": {"bucket_cap_mb": 10}}),
    "an accelerate YAML as ds_config": (Tiny(), {"ds_config": "accelerate.yaml"}),
    "training_args a number": (Tiny(), {"training_args": 5}),
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


def test_grad_accum_and_precision_fill_deepspeed_auto_as_the_cli_does():
    auto = {**DS, "gradient_accumulation_steps": "auto", "bf16": {"enabled": "auto"}}
    plan = memfit.check(Tiny(), auto, grad_accum=4, precision="fp16", **GOOD)
    assert "accum.forward" in {p.name for p in plan.phases}
    assert "accum.forward" not in {p.name for p in memfit.check(Tiny(), auto, **GOOD).phases}


def test_warnings_point_at_the_callers_line():
    """Issue 23 item 5: the warnings pointed at memfit's check.py, not the user's line."""
    with pytest.warns(memfit.MemfitWarning) as seen:
        memfit.check(Tiny(), {**DS, "zero_optimisation": {"stage": 2}}, gpus="1xa100-80gb", cpu_ram="64GiB")
    assert seen and all(w.filename == __file__ for w in seen), [w.filename for w in seen]


def test_accelerates_own_fsdp_key_names_and_files_are_read(tmp_path):
    """Issue 23 item 5: memfit.check refused accelerate's key names (fsdp_sharding_strategy)."""
    import yaml

    plan = memfit.check(Tiny(), framework="fsdp", gpus="2xa100-80gb", cpu_ram="64GiB", warn=False,
                        fsdp={"fsdp_sharding_strategy": "SHARD_GRAD_OP", "fsdp_offload_params": True})
    assert plan.verdict.fits
    acc = tmp_path / "acc.yaml"
    acc.write_text(yaml.safe_dump({"compute_environment": "LOCAL_MACHINE", "distributed_type": "FSDP",
                                   "mixed_precision": "bf16", "num_machines": 1, "num_processes": 2,
                                   "fsdp_config": {"fsdp_version": 2, "fsdp_offload_params": False}}))
    plan = memfit.check(Tiny(), accelerate_config=str(acc), gpus="2xa100-80gb", cpu_ram="64GiB", warn=False)
    assert plan.verdict.fits


class HalfFrozen(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.frozen = torch.nn.Linear(256, 256)
        self.trained = torch.nn.Linear(256, 256)
        self.frozen.requires_grad_(False)


def test_check_plans_the_deepspeed_release_given():
    """``deepspeed_version`` is any release memfit models, planned with its line's allocations: ZeRO-3
    optimizes the frozen params too before 0.8 (0.8.0 stage3.py: _get_trainable_parameter_groups),
    as the 0.6 model does; 0.19.8 is the 0.19 model."""
    zero3 = {**DS, "zero_optimization": {"stage": 3}}

    def figures(version):
        plan = memfit.check(HalfFrozen(), zero3, deepspeed_version=version, model_parameters="all", **GOOD)
        return [(p.name, p.gpu_allocated_bytes, p.cpu_locked_peak_bytes) for p in plan.phases]

    assert figures("0.7.7") == figures("0.6")
    assert figures("0.19.8") == figures("0.19")
    old, new = ({n: a for n, a, _ in figures(v)} for v in ("0.7.7", "0.8.0"))
    # the frozen Linear's 65,792 params in the optimizer before 0.8: 14 B each at initialize.optimizer
    # (fp32 master, Adam's two fp32 states, the 16-bit gradient partition, as the ledger books them)
    assert old["initialize.optimizer"] - new["initialize.optimizer"] == 65_792 * 14
    with pytest.raises(MemfitError, match=r"deepspeed_version: unknown DeepSpeed version '0\.9\.1'; memfit knows "
                                          r"DeepSpeed 0\.3, 0\.5-0\.8, 0\.13-0\.19"):
        memfit.check(Tiny(), DS, deepspeed_version="0.9.1", **GOOD)
