"""FSDP1 CPU offload's host buffers in the core (``memfit.core.ledger.pytorch.fsdp``) against the ones real
``FullyShardedDataParallel(cpu_offload=CPUOffload(offload_params=True))`` asks for, in a fake world on this CPU.

``FlatParamHandle.init_flat_param_attributes`` (the root's lazy init, before the first forward) pins a copy
of every flat parameter's local shard and a ``_cpu_grad`` of the same size, for frozen flat parameters
too. This machine's CPU build of torch has no pinned allocator, so ``Tensor.pin_memory`` is replaced by a
recorder (a clone, its size noted) for the wrapped model's first forward: the sizes are what FSDP asks
torch to pin, in its order. The ledger's pinned allocations at its first forward (``fsdp.sharded_params``
and ``fsdp.cpu_grads``) must be those sizes, in that order; the pageable shards the constructor left
(``fsdp.sharded_params_unpinned``) must be the local shards. A CPU run cannot go further (FSDP's
offloaded unshard synchronizes a CUDA stream), so the device side of the recipe is read from
``_flat_param.py`` (its docstring) and not checked here.
"""

from __future__ import annotations

import json
import types

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

CASES = [("full", 2, False), ("full", 3, True), ("lora", 2, True)]


def _cfg():
    from memfit.replay.deepspeed.record_fixtures import TINY_LLAMA

    return dict(TINY_LLAMA, num_hidden_layers=2, hidden_size=126, num_attention_heads=3, num_key_value_heads=1,
                intermediate_size=170, vocab_size=1001)


def _memfit(cfg, method, W, use_orig, tmp_path):
    from memfit.core.ledger.build import build_events_timeline
    from memfit.core.scenario.build import build_scenario
    from memfit.core.scenario.inputs import ScenarioInputs

    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    peft = dict(peft_method="lora", peft_options={"r": 4, "target_modules": ["q_proj", "v_proj"]}) if method == "lora" else {}
    sc = build_scenario(ScenarioInputs(model=str(path), framework="fsdp", precision="fp32", optim="adamw_torch",
                                       fsdp={"use_orig_params": use_orig, "cpu_offload": True}, gpus=f"{W}x24GiB",
                                       accelerator="cpu", seq_len=16, micro_batch=1, **peft))
    t = build_events_timeline(sc)
    starts = dict(t.phase_starts)
    pinned, unpinned = [], []
    for k, (kind, key, _, n) in enumerate(t.events):
        if kind != "alloc":
            continue
        if key == "fsdp.sharded_params_unpinned":
            unpinned.append(n)
        elif k >= starts["forward"] and key in ("fsdp.sharded_params", "fsdp.cpu_grads"):
            pinned.append(n)
    return pinned, unpinned


def _torch(cfg, method, W, use_orig):
    import torch.distributed as dist
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from memfit.replay.model_build import build_model
    from memfit.replay.pytorch.fsdp import wrap_fsdp

    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=W)
    pinned: list[int] = []

    def pin_memory(self, *a, **k):
        copy = self.clone()
        pinned.append(copy.numel() * copy.element_size())
        return copy

    try:
        torch.manual_seed(0)
        model = build_model(cfg, dtype="fp32")
        if method == "lora":
            from peft import LoraConfig, get_peft_model

            model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
        spec = types.SimpleNamespace(fsdp={"use_orig_params": use_orig, "cpu_offload": True}, framework="fsdp",
                                     accelerator="cpu", world_size=W)
        wrapped = wrap_fsdp(model, spec, [])
        handles = [m._handle for m in wrapped.modules() if isinstance(m, FSDP) and m._handle is not None]
        shards = [h.flat_param.numel() * h.flat_param.element_size() for h in handles]
        frozen = [not h.flat_param.requires_grad for h in handles]
        mp = pytest.MonkeyPatch()
        mp.setattr(torch.Tensor, "pin_memory", pin_memory)
        try:
            wrapped(torch.zeros(1, 16, dtype=torch.long))  # the first forward: lazy init pins
        finally:
            mp.undo()
        cpu_grads = [h.flat_param._cpu_grad.numel() * h.flat_param._cpu_grad.element_size() for h in handles]
        return pinned, shards, cpu_grads, frozen
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("method,W,use_orig", CASES, ids=[f"{m}-W{w}-use_orig_params={u}" for m, w, u in CASES])
def test_offload_pins_each_shard_and_a_cpu_grad(method, W, use_orig, tmp_path):
    cfg = _cfg()
    pinned, unpinned = _memfit(cfg, method, W, use_orig, tmp_path)
    real_pinned, shards, cpu_grads, frozen = _torch(cfg, method, W, use_orig)
    print(f"{method} W={W}: memfit pinned {pinned} unpinned {unpinned}; torch pinned {real_pinned}, "
          f"shards {shards}, _cpu_grad {cpu_grads}, frozen {frozen}")
    assert cpu_grads == shards  # zeros_like(_local_shard), whether the flat param trains or not
    assert real_pinned == [n for s in shards for n in (s, s)]
    assert pinned == real_pinned
    assert sorted(unpinned) == sorted(shards)
