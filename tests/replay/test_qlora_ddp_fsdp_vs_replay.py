"""QLoRA under DDP, FSDP2 and FSDP1 against CPU replays of the real libraries (fake 2-rank world, rank 0).

Each replay (``memfit.replay.pytorch.child``) builds a tiny Llama, quantizes it as transformers'
loader does with bitsandbytes' CPU backend (``memfit.replay.pytorch.quantize``: NF4, double
quantization), wraps LoRA by peft, then the real wrapper: ``DistributedDataParallel``,
``fully_shard`` as accelerate's ``fsdp2_prepare_model`` applies it, or ``FullyShardedDataParallel``
with peft's ``fsdp_auto_wrap_policy`` (what the Trainer sets for a PEFT model), and runs two steps.
The tensors read off the objects equal memfit's ledger items byte for byte: ``model.params``,
``quant.weights`` (packed storage and every quant-state tensor), ``torch.grads``/``ddp.buckets``
(DDP), ``fsdp.sharded_params``/``fsdp.sharded_grads`` (FSDP), ``optimizer.state.total``.

The FSDP runs are set as the sharded-QLoRA recipe sets them (PEFT docs, TRL): ``bnb_4bit_quant_storage``
bf16 and a bf16 load dtype, so the packed weights flatten with the other bf16 params, and no
``prepare_model_for_kbit_training`` (TRL skips it for sharded QLoRA; under FSDP1 its fp32 norms in a
bf16 flat parameter are refused by torch). FSDP1 runs under AMP bf16 (with fp32 compute the LoRA
layer casts its input to the fp32 adapter weight while FSDP1 hands it the bf16 one).

Phase peaks are not compared here: bitsandbytes' CPU kernels keep other temporaries than the CUDA
kernels the ledger models (the load phase's ``quantize_4bit`` float temporaries, tests/replay/
test_examples.py TOL_QUANT_CACHE and the load tolerance), and its 4-bit matmul is not traced.
"""

from __future__ import annotations

from unittest import mock

import pytest

pytest.importorskip("torch")
pytest.importorskip("bitsandbytes")
pytest.importorskip("peft")

from memfit.replay.pytorch import record_fixtures as rf  # noqa: E402

Q = {**rf.QLORA, "quant_storage": "bf16", "prepare_kbit": False}
QLORA_CASES = {
    "llama_ddp_w2_qlora_ampbf16": dict(precision="amp_bf16", optim="adamw_torch", peft_method="lora",
                                       peft_options=rf.LORA, load_dtype="bf16", quantization=rf.QLORA,
                                       gpus="2x24GiB", launcher="fake"),
    "llama_fsdp2_w2_qlora_mpbf16": dict(framework="fsdp2", precision="fp32", optim="adamw_torch", gpus="2x24GiB",
                                        peft_method="lora", peft_options=rf.LORA, load_dtype="bf16", quantization=Q,
                                        fsdp={"mixed_precision": "bf16"}),
    "llama_fsdp1_w2_qlora_peftwrap": dict(framework="fsdp", precision="amp_bf16", optim="adamw_torch",
                                          gpus="2x24GiB", peft_method="lora", peft_options=rf.LORA, load_dtype="bf16",
                                          quantization=Q, save="never",
                                          fsdp={"mixed_precision": "bf16", "wrap_policy": "peft"}),
}
"""Not in ``record_fixtures.CASES`` (those have recorded fixtures): replayed live here."""
WRAPPER_ITEMS = {"ddp": {"torch.grads", "ddp.buckets"}, "fsdp": {"fsdp.sharded_params", "fsdp.sharded_grads"}}


@pytest.mark.parametrize("name", sorted(QLORA_CASES))
def test_qlora_replay_items_equal_the_plan(name):
    from memfit.core.plan import make_plan
    from memfit.replay.compare import compare, scenario_of
    from memfit.replay.runner import run_replay

    with mock.patch.dict(rf.CASES, {name: QLORA_CASES[name]}):
        spec = rf.case_spec(name, layers=2)
    m = run_replay(spec, timeout_s=600)
    assert m.ok, f"{m.error.kind} in {m.error.phase}: {m.error.message}\n{m.error.traceback}"
    c = compare(make_plan(scenario_of(m)), m)
    keys = {i.key for i in c.items}
    wrapper = WRAPPER_ITEMS["ddp" if "ddp" in name else "fsdp"]
    assert {"model.params", "quant.weights", "optimizer.state.total"} | wrapper <= keys, keys
    assert all(i.measured_bytes > 0 for i in c.items if i.key in wrapper | {"quant.weights"})
    assert c.exact_items_match, [(i.key, i.diff_bytes) for i in c.items]
