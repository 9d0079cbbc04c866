"""Autocast's 16-bit weight copies in the ledger (``memfit.core.ledger.pytorch.step``: ``amp.weight_casts``)
against what ``torch.autocast`` really makes and autograd really keeps, on this CPU.

A tiny model runs one forward under ``torch.autocast("cpu", dtype=torch.bfloat16)`` (CPU autocast
casts the same matmul ops to 16 bits as the CUDA one: ``linear``, ``addmm``, ``mm``). Every
``aten::_to_copy`` whose input is a parameter is a cast copy, watched through a weak reference: once
autocast has exited, only autograd's graph (what it saved for backward) keeps one alive. Three
figures, each to the byte, for the ledger's stage casts:

- every cast made in the forward (``(bytes, saved, cached)`` entries of the stages);
- cast copies alive at the end of the forward, still inside autocast (the saved ones, plus the
  trained fp32 leaves autocast caches until the region ends);
- cast copies alive after autocast exits, before backward (the saved ones; with gradient
  checkpointing a block saves none, its casts are made again in the recompute).
"""

from __future__ import annotations

import json
import weakref

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

CASES = [
    ("llama", {}, False),
    ("llama", {"peft_method": "lora", "peft_options": {"lora_r": 4, "target_modules": "q_proj,v_proj"}}, False),
    ("gpt2", {}, False),                     # Conv1D (addmm with a bias), head tied to the embedding
    ("llama", {}, True),                     # gradient checkpointing
]


def _ledger(cfg, extra, ckpt, tmp_path):
    from memfit.core.ledger.pytorch.params import build_torch_model
    from memfit.core.ledger.pytorch.step_context import GradSink, build_step_context
    from memfit.core.optimizers import resolve_optimizer
    from memfit.core.scenario.build import build_scenario
    from memfit.core.scenario.inputs import ScenarioInputs

    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    sc = build_scenario(ScenarioInputs(model=str(path), framework="torch", precision="amp_bf16", optim="adamw_torch",
                                       accelerator="cpu", seq_len=16, micro_batch=1, gradient_checkpointing=ckpt,
                                       **extra))
    c = build_step_context(sc, build_torch_model(sc), resolve_optimizer(sc.torch, "cpu"), GradSink())
    last = len(c.stages) - 1
    made = kept = cached = 0
    for i, st in enumerate(c.stages):
        block = ckpt and 0 < i < last
        for n, saved, cache in st.casts:
            made += n
            keep = saved and not block
            kept += n if keep else 0
            cached += n if cache and not keep else 0
    return sc, made, kept + cached, kept


def _real(cfg, sc, ckpt):
    from torch.utils._python_dispatch import TorchDispatchMode

    from memfit.replay.model_build import apply_peft, build_model

    torch.manual_seed(0)
    model = build_model(cfg, dtype="fp32")
    if sc.peft.method != "full":
        model = apply_peft(model, sc.peft)
    if ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    owners = {p.untyped_storage().data_ptr() for p in model.parameters()}
    casts: list[tuple[weakref.ref, int, int]] = []

    class Casts(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func is torch.ops.aten._to_copy.default and args[0].untyped_storage().data_ptr() in owners:
                casts.append((weakref.ref(out), out.untyped_storage().data_ptr(), out.untyped_storage().nbytes()))
            return out

    def live() -> int:
        return sum(n for ref, _, n in casts if ref() is not None)

    ids = torch.randint(0, cfg["vocab_size"], (1, 16))
    with Casts(), torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(input_ids=ids, labels=ids).loss
        in_region = live()
    after = live()  # what still holds a cast now is autograd's graph of the loss (saved for backward)
    del loss
    return sum(n for _, _, n in casts), in_region, after


@pytest.mark.parametrize("family,extra,ckpt", CASES, ids=["llama", "llama-lora", "gpt2-tied", "llama-ckpt"])
def test_weight_casts_match_autocast(family, extra, ckpt, tmp_path):
    from memfit.replay.deepspeed.record_fixtures import TINY_LLAMA
    from memfit.replay.pytorch.record_fixtures import TINY_GPT2

    cfg = dict(TINY_LLAMA, num_hidden_layers=2) if family == "llama" else dict(TINY_GPT2, n_layer=2)
    sc, made, at_end, kept = _ledger(cfg, extra, ckpt, tmp_path)
    real_made, real_end, real_kept = _real(cfg, sc, ckpt)
    print(f"{family} {extra} ckpt={ckpt}: made {real_made:,} (ledger {made:,}), alive in autocast {real_end:,} "
          f"(ledger {at_end:,}), kept for backward {real_kept:,} (ledger {kept:,})")
    assert (made, at_end, kept) == (real_made, real_end, real_kept)
