"""FSDP1 with peft's ``fsdp_auto_wrap_policy`` (memfit's ``wrap_policy: peft``, what the Trainer sets for
a PEFT model from transformers 4.39) against real ``FullyShardedDataParallel`` wrapping a real peft
LoRA model with that policy, in a fake world on this CPU.

The policy makes every LoRA Linear a unit of its own, nested in its decoder block's unit: per FSDP
unit, to the element, the padded flat size and rank 0's local shard; and, with ``use_orig_params``
off, which flat parameters the optimizer gets (those that require grad: the LoRA units only, not the
blocks' frozen weights, which memfit would otherwise give gradients and optimizer states).
"""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

LORA = {"r": 4, "target_modules": ["q_proj", "v_proj", "down_proj"]}


def _memfit(cfg, W, tmp_path):
    from memfit.core.ledger.pytorch.fsdp_units import build_units, optimizer_params
    from memfit.core.ledger.pytorch.params import build_torch_model
    from memfit.core.scenario.build import build_scenario
    from memfit.core.scenario.inputs import ScenarioInputs

    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    sc = build_scenario(ScenarioInputs(model=str(path), framework="fsdp", precision="fp32", optim="adamw_torch",
                                       peft_method="lora", peft_options={"lora_r": LORA["r"],
                                                                         "target_modules": ",".join(LORA["target_modules"])},
                                       fsdp={"use_orig_params": False, "wrap_policy": "peft"}, gpus=f"{W}x24GiB",
                                       accelerator="cpu", seq_len=16, micro_batch=1))
    units = build_units(sc, build_torch_model(sc))
    flats = sorted((pc.numel, pc.shard_numel) for u in units for pc in u.pieces)
    trained = sorted(p.numel for p in optimizer_params(sc, units, W))
    return flats, trained, len(units)


def _torch(cfg, W):
    import torch.distributed as dist
    from peft import LoraConfig, get_peft_model
    from peft.utils.other import fsdp_auto_wrap_policy
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from memfit.replay.model_build import build_model

    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=W)
    try:
        torch.manual_seed(0)
        model = get_peft_model(build_model(cfg, dtype="fp32"), LoraConfig(r=LORA["r"], target_modules=LORA["target_modules"]))
        wrapped = FSDP(model, auto_wrap_policy=fsdp_auto_wrap_policy(model), use_orig_params=False,
                       device_id=torch.device("cpu"))
        flats, trained = [], []
        for m in wrapped.modules():
            if isinstance(m, FSDP) and m._handle is not None:
                fp = m._handle.flat_param
                flats.append((fp.numel() * W, fp.numel()))
                if fp.requires_grad:
                    trained.append(fp.numel())
        n_units = sum(1 for m in wrapped.modules() if isinstance(m, FSDP))
        return sorted(flats), sorted(trained), n_units
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("W", [2, 3])
def test_peft_wrap_policy_units_match_fsdp1(W, tmp_path):
    from memfit.replay.deepspeed.record_fixtures import TINY_LLAMA

    cfg = dict(TINY_LLAMA, num_hidden_layers=2, hidden_size=126, num_attention_heads=3, num_key_value_heads=1,
               intermediate_size=170, vocab_size=1001)
    mine, real = _memfit(cfg, W, tmp_path), _torch(cfg, W)
    print(f"W={W}: memfit {mine}, torch {real}")
    assert mine[0] == real[0]  # every unit's padded flat size and local shard
    assert mine[1] == real[1]  # what the optimizer gets: the LoRA units' shards only
    assert mine[2] == real[2]  # 2 blocks x 3 targets x (lora_A, lora_B) + 2 blocks + the root = 15


def test_mixed_requires_grad_without_use_orig_params_is_refused_as_torch_refuses_it(tmp_path):
    """Wrapping per decoder block (accelerate's transformer policy, no PEFT policy) with use_orig_params
    off puts a block's LoRA weights and its frozen base weights in one FlatParameter: torch raises, so
    memfit refuses in one line naming the fix, instead of planning a run that cannot start."""
    import functools

    import torch.distributed as dist
    from peft import LoraConfig, get_peft_model
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    from memfit.core.ledger.pytorch.fsdp_units import build_units
    from memfit.core.ledger.pytorch.params import build_torch_model
    from memfit.core.scenario.build import build_scenario
    from memfit.core.scenario.inputs import ScenarioInputs
    from memfit.errors import MemfitError
    from memfit.replay.deepspeed.record_fixtures import TINY_LLAMA
    from memfit.replay.model_build import build_model

    cfg = dict(TINY_LLAMA, num_hidden_layers=2)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    sc = build_scenario(ScenarioInputs(model=str(path), framework="fsdp", precision="fp32", optim="adamw_torch",
                                       peft_method="lora", peft_options={"lora_r": LORA["r"],
                                                                         "target_modules": ",".join(LORA["target_modules"])},
                                       fsdp={"use_orig_params": False, "wrap_policy": "transformer"}, gpus="2x24GiB",
                                       accelerator="cpu", seq_len=16, micro_batch=1))
    with pytest.raises(MemfitError, match="uniform requires_grad") as err:
        build_units(sc, build_torch_model(sc))
    assert "wrap_policy peft" in str(err.value) and "\n" not in str(err.value)
    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    try:
        model = get_peft_model(build_model(cfg, dtype="fp32"), LoraConfig(r=LORA["r"], target_modules=LORA["target_modules"]))
        policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={LlamaDecoderLayer})
        with pytest.raises(ValueError, match="uniform `requires_grad`"):
            FSDP(model, auto_wrap_policy=policy, use_orig_params=False, device_id=torch.device("cpu"))
    finally:
        dist.destroy_process_group()
