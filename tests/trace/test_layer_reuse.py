"""A trace written out from the first 5 and 6 layers (``memfit.trace.layer_reuse``) is the full trace,
byte for byte: every field of the ``TraceResult`` but the timings and the note saying how it was traced
(peaks, breakdowns, per-module rows, the ZeRO-3 event order, params, modules). Where the layers are not
identical, or the 6-layer trace is not the 5-layer one written out for 6 layers, the full trace is
taken, and the result says so.

The models are small (8 layers, 32 tokens) so that the full trace they are compared with runs in a
second; the fake-tensor trace is deterministic, so equality is exact.
"""

from __future__ import annotations

import dataclasses

import pytest
from trace_models import TINY  # noqa: F401  (skips without torch/transformers/peft)

from memfit.core.peft.spec import PeftSpec
from memfit.trace.results import TraceOptions
from memfit.trace.step import trace_training_step

LLAMA8 = dict(model_type="llama", vocab_size=1000, hidden_size=64, intermediate_size=172, num_hidden_layers=8,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
GPTJ8 = dict(model_type="gptj", vocab_size=1000, n_embd=64, n_layer=8, n_head=4, rotary_dim=8, n_positions=256)
T5 = dict(model_type="t5", vocab_size=1000, d_model=64, d_kv=16, d_ff=128, num_layers=8, num_decoder_layers=7,
          num_heads=4, decoder_start_token_id=0, pad_token_id=0)
QWEN2_WINDOWS = dict(model_type="qwen2", vocab_size=1000, hidden_size=64, intermediate_size=172, num_hidden_layers=8,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                     use_sliding_window=True, sliding_window=16, max_window_layers=4)
"""Qwen2 with sliding-window attention above layer 4: ``layer_types`` is 4 x full then 4 x sliding."""

REUSED = {
    "llama-lora": (LLAMA8, PeftSpec(method="lora"), {}),
    "llama-full-checkpointing": (LLAMA8, PeftSpec(), {"gradient_checkpointing": True}),
    "llama-lora-checkpointing-fp32-adapters": (LLAMA8, PeftSpec(method="lora"),
                                               {"gradient_checkpointing": True, "adapter_dtype": "fp32"}),
    "llama-full-autocast": (LLAMA8, PeftSpec(), {"dtype": "fp32", "autocast": "bf16"}),
    "gptj-lora": (GPTJ8, PeftSpec(method="lora"), {}),
    "llama-full-zero3-linear": (LLAMA8, PeftSpec(), {"zero3_linear": True}),
    "llama-lora-amp-bf16-base-fp32-adapters": (
        {**LLAMA8, "vocab_size": 32000}, PeftSpec(method="lora", lora_r=16, target_modules=("q_proj", "k_proj", "v_proj", "o_proj")),
        {"seq_len": 64, "micro_batch": 1, "adapter_dtype": "fp32", "autocast": "bf16"}),
    "t5-encoder-decoder": (T5, PeftSpec(), {"target_len": 16}),
    "t5-lora-checkpointing": (T5, PeftSpec(method="lora", task_type="SEQ_2_SEQ_LM"),
                              {"target_len": 16, "gradient_checkpointing": True}),
}
"""Written out from the short traces. The AMP case is examples/frameworks/lora-ampbf16-llama2-7b-1gpu.yaml's
step in small: autocast frees its weight casts at the end of the region in a hash map's order, which
differs between the short traces (``layer_reuse._sorted_frees``)."""

FULL = {
    "gptj-prefix": (GPTJ8, PeftSpec(method="prefix", num_virtual_tokens=5, prefix_projection=True,
                                    encoder_hidden_size=64), {}, "prefix tuning"),
    "qwen2-sliding-and-full-layers": (QWEN2_WINDOWS, PeftSpec(), {}, "layer_types differs from layer to layer"),
}
"""Traced in full, and why: peft's prefix gives the cut layers zero gradients outside the stacks (the
short traces see them, the full one does not); Qwen2's layers are not all the same."""


def _figures(result):
    return dataclasses.replace(result, timings=None, layer_reuse="")


def _options(kw: dict) -> TraceOptions:
    return TraceOptions(**{"seq_len": 32, "micro_batch": 2, "dtype": "bf16", **kw})


@pytest.mark.parametrize("name", sorted(REUSED))
def test_reused_layers_give_the_full_trace_byte_for_byte(name):
    config, peft, kw = REUSED[name]
    full = trace_training_step(config, peft, _options(kw), reuse_layers=False)
    reused = trace_training_step(config, peft, _options(kw), reuse_layers=True)
    assert "written out from traces of the first 5 and 6" in reused.layer_reuse, reused.layer_reuse
    assert full.layer_reuse.startswith("full trace")
    for field in dataclasses.fields(full):
        if field.name not in ("timings", "layer_reuse"):
            assert getattr(reused, field.name) == getattr(full, field.name), field.name
    assert _figures(reused) == _figures(full)
    assert len(reused.params) == len(full.params) and reused.backward.peak_bytes > 0


@pytest.mark.parametrize("name", sorted(FULL))
def test_the_full_trace_is_taken_where_layers_cannot_be_reused(name):
    config, peft, kw, why = FULL[name]
    full = trace_training_step(config, peft, _options(kw), reuse_layers=False)
    tried = trace_training_step(config, peft, _options(kw), reuse_layers=True)
    assert tried.layer_reuse.startswith("full trace") and why in tried.layer_reuse, tried.layer_reuse
    assert _figures(tried) == _figures(full)


def test_a_shallow_model_is_traced_in_full_by_default():
    result = trace_training_step(LLAMA8, PeftSpec(), _options({}))
    assert result.layer_reuse.startswith("full trace (8 layers"), result.layer_reuse


def test_layers_that_differ_in_their_params_are_not_reused():
    """LoRA on some layers only (a regular expression naming layers 0-5): layer 6 has no adapter."""
    from memfit.trace import layer_reuse
    from memfit.trace.model_build import apply_peft, build_meta_model

    model = apply_peft(build_meta_model(LLAMA8, attention="sdpa"),
                       PeftSpec(method="lora", target_modules_pattern=r".*layers\.[0-5]\.self_attn\.q_proj"))
    decision = layer_reuse.decide(model, min_layers=6)
    assert decision.stacks == () and "layers.6 differs from" in decision.reason, decision.reason
