"""The analytic activation model on its own (pure Python; the comparison with the traced model code
is tests/trace/test_activations_vs_trace.py)."""

from __future__ import annotations

import pytest

from memfit.core.activations.analytic import estimate_activation_bytes
from memfit.core.model import ArchSpec
from memfit.core.peft.spec import PeftSpec
from memfit.errors import MemfitError

GPT2_XL = ArchSpec(model_type="gpt2", num_layers=48, hidden_size=1600, num_heads=25, num_kv_heads=25, head_dim=64,
                   intermediate_size=6400, vocab_size=50257)
LLAMA3_8B = ArchSpec(model_type="llama", num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=8, head_dim=128,
                     intermediate_size=14336, vocab_size=128256, mlp_kind="gated")
GPTJ_6B = ArchSpec(model_type="gptj", num_layers=28, hidden_size=4096, num_heads=16, num_kv_heads=16, head_dim=256,
                   intermediate_size=16384, vocab_size=50400)


def est(arch=LLAMA3_8B, peft=None, **kw):
    args = {"seq_len": 2048, "micro_batch": 1, "dtype_bytes": 2, **kw}
    return estimate_activation_bytes(arch, peft or PeftSpec(), **args)


def test_score_matrix_bytes_match_korthikanti_et_al():
    """Korthikanti et al. 2022, sec. 4.1: eager attention with dropout keeps 5 bytes per score
    element (fp16 softmax 2 B, dropout mask 1 B, dropout output 2 B): 5·a·s²·b per layer. The
    second difference over s isolates the s² term; sdpa (flash) has none."""
    for b in (2, 3):
        f = [est(GPT2_XL, seq_len=n, micro_batch=b, attention="eager").layer_bytes for n in (256, 512, 768)]
        assert (f[2] - 2 * f[1] + f[0]) == 2 * 5 * GPT2_XL.num_heads * b * 256**2
        g = [est(GPT2_XL, seq_len=n, micro_batch=b, attention="sdpa").layer_bytes for n in (256, 512, 768)]
        assert g[2] - 2 * g[1] + g[0] == 0


def test_frozen_linears_keep_less_than_full_fine_tuning():
    full = est(peft=PeftSpec(method="full"))
    lora = est(peft=PeftSpec(method="lora"))
    prefix = est(peft=PeftSpec(method="prefix", num_virtual_tokens=10))
    assert lora.total_bytes < full.total_bytes
    assert prefix.layer_bytes < full.layer_bytes
    assert lora.first_layer_bytes < lora.layer_bytes  # frozen embeddings: the first norm keeps nothing


def test_zero3_linear_keeps_frozen_inputs():
    """DeepSpeed ZeRO-3's Linear saves every input: LoRA then keeps what full fine-tuning keeps in
    its Linear layers; GPT-2's Conv1D is not affected."""
    plain = est(peft=PeftSpec(method="lora"))
    zero3 = est(peft=PeftSpec(method="lora"), linear_saves_frozen_inputs=True)
    assert zero3.total_bytes > plain.total_bytes
    assert est(GPT2_XL, peft=PeftSpec(method="lora"), linear_saves_frozen_inputs=True) == \
        est(GPT2_XL, peft=PeftSpec(method="lora"))


def test_prefix_and_prompt_tokens_add_memory():
    few = est(GPTJ_6B, peft=PeftSpec(method="prefix", num_virtual_tokens=10))
    many = est(GPTJ_6B, peft=PeftSpec(method="prefix", num_virtual_tokens=100))
    assert many.layer_bytes > few.layer_bytes
    prompt = est(GPTJ_6B, peft=PeftSpec(method="prompt", num_virtual_tokens=100))
    assert prompt.logits_bytes > est(GPTJ_6B).logits_bytes  # the virtual tokens get logits too


def test_checkpointing_keeps_layer_inputs_and_recomputes_one_layer():
    plain = est(GPTJ_6B)
    ckpt = est(GPTJ_6B, gradient_checkpointing=True)
    assert ckpt.total_bytes < plain.total_bytes / 5
    assert ckpt.recompute_bytes == plain.layer_bytes
    assert plain.recompute_bytes == 0


def test_outputs_dropped_before_backward_free_the_logits():
    kept = est(GPTJ_6B, keep_outputs=True)
    dropped = est(GPTJ_6B, keep_outputs=False)
    assert kept.total_bytes - dropped.total_bytes >= 2 * 2048 * GPTJ_6B.vocab_size  # at least the kept fp16 logits
    assert dropped.logits_bytes == 4 * 2048 * GPTJ_6B.vocab_size  # the loss's fp32 log-softmax


def test_scales_with_micro_batch_and_dtype():
    one = est(LLAMA3_8B, micro_batch=1, attention="eager")
    # linear in the micro-batch but for a few batch-independent terms (measured ratio 3.9999; 3.9 catches a
    # term that does not scale)
    assert est(LLAMA3_8B, micro_batch=4, attention="eager").total_bytes > 3.9 * one.total_bytes
    assert est(LLAMA3_8B, dtype_bytes=4).total_bytes > est(LLAMA3_8B, dtype_bytes=2).total_bytes


def test_bad_input_is_a_memfit_error():
    for kw in (dict(seq_len=0), dict(micro_batch=0), dict(dtype_bytes=0), dict(attention="flash"),
               dict(dtype_bytes=4, float16=True)):  # float16 is a 2-byte stream
        with pytest.raises(MemfitError):
            est(**kw)


# The recommender's speed target (more than 10,000 configurations per second through
# estimate_activation_bytes) is printed by benchmarks/bench_trace.py (bench_analytic), not asserted here:
# a loaded machine stretches wall time (issue 24 item 10).


def test_a_trained_input_embedding_makes_the_first_block_keep_what_the_others_keep():
    """Issue 21: LoRA on the input embedding (or the embedding in ``modules_to_save``) makes the embedding's
    output require grad, so the first block keeps its input norm and the rest as every later block does;
    a LoRA on the blocks only leaves the first block lighter (whole-model traces:
    tests/trace/test_tuner_activations_vs_trace.py)."""
    from memfit.core.activations.adapters import adapter_activations, first_block_input_trains
    from memfit.core.catalog import ModelConfigSource
    from memfit.core.peft.params import apply_peft
    from memfit.core.shapes import build_model_shape

    config = dict(model_type="llama", vocab_size=2000, hidden_size=384, intermediate_size=1024, num_hidden_layers=3,
                  num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=1024,
                  tie_word_embeddings=False, architectures=["LlamaForCausalLM"])
    linears = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    source = ModelConfigSource(name="llama-384", config=config, path=None, origin="local")
    figures = {}
    for name, spec in {"blocks": PeftSpec(method="lora", target_modules=linears),
                       "embedding": PeftSpec(method="lora", target_modules=(*linears, "embed_tokens")),
                       "saved": PeftSpec(method="lora", target_modules=linears, modules_to_save=("embed_tokens",))
                       }.items():
        shape = apply_peft(build_model_shape(source), spec)
        acts = adapter_activations(shape, spec, adapter_bytes=2, base_bytes=2)
        e = estimate_activation_bytes(shape.arch, spec, seq_len=96, micro_batch=1, dtype_bytes=2,
                                      attention="eager", adapters=acts)
        figures[name] = (acts.embedding_trains, e.first_layer_bytes, e.layer_bytes)
    assert figures["blocks"][0] is False and figures["blocks"][1] < figures["blocks"][2]
    for name in ("embedding", "saved"):
        trains, first, layer = figures[name]
        assert trains and first == layer, name
    # without the adapters (the grid's calls): the spec's modules_to_save and LoRA targets say it
    assert first_block_input_trains(PeftSpec(method="prefix", modules_to_save=("model.embed_tokens",)), None)
    assert first_block_input_trains(PeftSpec(method="lora", target_modules=("q_proj", "wte")), None)
    assert not first_block_input_trains(PeftSpec(method="lora", target_modules=("q_proj", "v_proj")), None)
    assert not first_block_input_trains(PeftSpec(method="lora", modules_to_save=("lm_head",)), None)
