"""The analytic activations of every family against the trace of its transformers code.

For each family of issue 10 a small config (hidden 64, 4 heads of width 24, 2 key/value heads where
the family has them, MLP 160, 3 layers, vocabulary 1000; MoE: 4 experts, top 2) is traced on fake
tensors (``memfit.trace``, CUDA kernel choices) at two sequence lengths and compared with
``estimate_activation_bytes`` of the ArchSpec the pure builder makes from the same config:
full fine-tuning with the family's default attention; then eager attention at batch 2, gradient
checkpointing, the task heads, an encoder-decoder with a target length of its own, LoRA; and the
loss peaks (section 5) on a 32k vocabulary where the logits dominate.

Tolerances: next to each constant below (``pytest -s`` prints every row).
"""

from __future__ import annotations

import pytest

from memfit.core.activations.analytic import estimate_activation_bytes
from memfit.core.catalog import source_from_config
from memfit.core.families.attention import resolve
from memfit.core.peft.spec import PeftSpec
from memfit.core.shapes import build_model_shape
from tests.installed_stack import TRANSFORMERS_LINE

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

TOLERANCE = 0.007
"""Analytic (CUDA kernels) vs traced activations, every case but LoRA. Not modelled by the trace:
LayerNorm's mean and rstd, which the CUDA kernel saves in fp32 (what the model counts) and the CPU
fake kernel the trace runs saves in the input dtype: 4 B per token per LayerNorm; everything else
agrees to <0.1%. Worst observed +0.615% (BERT token-classification, b=2 s=96: +6,908 B = 7
LayerNorms x 192 tokens x 4 B + 8 B per token in the classification head; the causal/masked LM
cases at most +0.31%); 2x that is 1.23%, the tolerance is below it (the issue asks for 2%)."""
LOSS_TOLERANCE = 0.00055
"""The forward/backward peaks of a 32k-vocabulary step (the logits and the loss dominate). Worst
observed +0.0272% (BERT without the fp32 upcast, forward, s=64 and 128: +36 B per token, the
LayerNorm statistics of ``TOLERANCE`` among them; the causal LMs within 0.011%); 2x that."""

_B = {"vocab_size": 1000, "hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 3,
      "num_attention_heads": 4}
_G = {**_B, "num_key_value_heads": 2, "head_dim": 24}
_T5 = {"vocab_size": 1000, "d_model": 64, "d_kv": 24, "d_ff": 160, "num_layers": 3, "num_heads": 4,
       "decoder_start_token_id": 0}
CONFIGS = {
    "llama": {**_G, "model_type": "llama"},
    "qwen2": {**_G, "model_type": "qwen2"},
    "qwen3": {**_G, "model_type": "qwen3"},
    "gemma": {**_G, "model_type": "gemma"},
    "gemma2": {**_G, "model_type": "gemma2"},
    "gemma3": {**_G, "model_type": "gemma3_text", "sliding_window": 16},  # masked sliding layers at s > 16
    "olmo2": {**_G, "model_type": "olmo2"},
    "phi3": {**_G, "model_type": "phi3", "pad_token_id": 0},
    "mistral": {**_G, "model_type": "mistral", "sliding_window": None},
    "mixtral": {**_G, "model_type": "mixtral", "num_local_experts": 4, "num_experts_per_tok": 2},
    "qwen2_moe": {**_G, "model_type": "qwen2_moe", "num_experts": 4, "num_experts_per_tok": 2,
                  "moe_intermediate_size": 40, "shared_expert_intermediate_size": 80},
    "qwen3_moe": {**_G, "model_type": "qwen3_moe", "num_experts": 4, "num_experts_per_tok": 2,
                  "moe_intermediate_size": 40, "norm_topk_prob": True},
    "deepseek_v3": {**_B, "model_type": "deepseek_v3", "num_key_value_heads": 4, "moe_intermediate_size": 40,
                    "n_routed_experts": 4, "num_experts_per_tok": 2, "n_group": 2, "topk_group": 1,
                    "first_k_dense_replace": 1, "kv_lora_rank": 32, "q_lora_rank": 48, "qk_rope_head_dim": 8,
                    "qk_nope_head_dim": 16, "v_head_dim": 16},
    "llama4_text": {**_G, "model_type": "llama4_text", "intermediate_size_mlp": 120, "num_local_experts": 2,
                    "interleave_moe_layer_step": 2},
    "bert": {**_B, "model_type": "bert", "max_position_embeddings": 128},
    "roberta": {**_B, "model_type": "roberta", "max_position_embeddings": 130},
    "deberta-v2": {**_B, "model_type": "deberta-v2", "max_position_embeddings": 128, "relative_attention": True,
                   "pos_att_type": "p2c|c2p", "position_buckets": 16, "norm_rel_ebd": "layer_norm",
                   "share_att_key": True, "position_biased_input": False, "type_vocab_size": 0},
    "gpt_neox": {**_B, "model_type": "gpt_neox"},
    "falcon-7b-style": {**_B, "model_type": "falcon"},  # multi-query: sdpa's math kernel
    "falcon-40b-style": {**_B, "model_type": "falcon", "new_decoder_architecture": True, "num_kv_heads": 2},
    "t5": {**_T5, "model_type": "t5"},
    "mt5": {**_T5, "model_type": "mt5", "tie_word_embeddings": False},
    "umt5": {**_T5, "model_type": "umt5"},
}
SEQS = (48, 96)
ROWS: list[str] = []


def compare(name: str, *, method="full", b=1, attention=None, gc=False, task=None, target=None, tolerance=TOLERANCE):
    from memfit.trace.results import TraceOptions
    from memfit.trace.step import trace_training_step

    config = CONFIGS[name]
    shape = build_model_shape(source_from_config(config), task=task, transformers_line=TRANSFORMERS_LINE)
    attention = attention or resolve(config["model_type"], None)
    spec = PeftSpec(method=method)
    for seq in SEQS:
        options = TraceOptions(seq_len=seq, micro_batch=b, dtype="bf16", attention=attention,
                               gradient_checkpointing=gc, granularity_bytes=1, task=task, target_len=target)
        traced = trace_training_step(config, spec, options).activation_bytes
        model = estimate_activation_bytes(shape.arch, spec, seq_len=seq, micro_batch=b, dtype_bytes=2,
                                          gradient_checkpointing=gc, attention=attention, target_len=target)
        err = (model.total_bytes - traced) / traced
        row = (f"{name:17s} {shape.arch.task:24s} {method:5s} {attention:6s} b={b} s={seq:3d} ckpt={gc!s:5s} "
               f"target={target} trace {traced:>11,} B model {model.total_bytes:>11,} B {err:+.2%}")
        ROWS.append(row)
        print(row)
        assert abs(err) <= tolerance, row


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CONFIGS))
def test_every_family_full_fine_tuning_default_attention(name):
    compare(name)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["llama", "gemma2", "qwen3", "mixtral", "gpt_neox", "bert", "t5", "mt5"])
def test_eager_attention_batch_2(name):
    compare(name, b=2, attention="eager")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["llama", "gemma3", "deepseek_v3", "falcon-40b-style", "bert", "mt5", "umt5"])
def test_gradient_checkpointing(name):
    compare(name, gc=True)


@pytest.mark.slow
@pytest.mark.parametrize(("name", "task"), [
    ("llama", "sequence-classification"), ("llama", "token-classification"), ("llama", "question-answering"),
    ("gpt_neox", "token-classification"), ("gpt_neox", "question-answering"), ("bert", "sequence-classification"),
    ("bert", "token-classification"), ("bert", "question-answering"), ("t5", "token-classification"),
    ("t5", "question-answering"), ("deberta-v2", "token-classification"), ("gemma2", "token-classification"),
    ("falcon-7b-style", "token-classification"),
])
def test_task_heads(name, task):
    compare(name, task=task, b=2)


@pytest.mark.slow
@pytest.mark.parametrize("gc", [False, True])
def test_encoder_decoder_with_its_own_target_length(gc):
    compare("mt5", target=20, gc=gc)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["qwen3", "gemma3", "llama"])
def test_lora_on_llama_style_families(name):
    compare(name, method="lora")  # worst observed -0.003% (the +1.39% q/k-norm gap is closed)


LOSS_CONFIGS = {
    "llama": {"model_type": "llama", "vocab_size": 32000, "hidden_size": 64, "intermediate_size": 160,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2},
    "gemma2-softcap": {"model_type": "gemma2", "vocab_size": 32000, "hidden_size": 64, "intermediate_size": 160,
                       "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16},
    "bert-no-upcast": {"model_type": "bert", "vocab_size": 32000, "hidden_size": 64, "intermediate_size": 160,
                       "num_hidden_layers": 2, "num_attention_heads": 4},
    "mt5-seq2seq": {"model_type": "mt5", "vocab_size": 32000, "d_model": 64, "d_kv": 16, "d_ff": 160,
                    "num_layers": 2, "num_heads": 4},
}


def _activation_peaks(trace) -> tuple[int, int]:
    """Highest activation-side bytes (inputs excluded) in the forward and in the backward."""
    forward = backward = 0
    in_backward = False
    for event in trace.events:
        if event.kind == "end_forward":
            forward = max(forward, event.act_peak_bytes)
            in_backward = True
        elif in_backward:
            backward = max(backward, event.act_peak_bytes)
        else:
            forward = max(forward, event.act_peak_bytes)
    inputs = trace.end_of_forward.input_bytes
    return forward - inputs, backward - inputs


@pytest.mark.slow
@pytest.mark.parametrize("name", list(LOSS_CONFIGS))
def test_logits_and_loss_peaks_agree_with_the_trace(name):
    """With a 32k vocabulary the forward peaks inside the loss (fp32 upcast next to the log-softmax)
    and the backward at its start (the log-softmax's gradients): analytic and traced agree."""
    from memfit.trace.results import TraceOptions
    from memfit.trace.step import trace_training_step

    config = LOSS_CONFIGS[name]
    arch = build_model_shape(source_from_config(config), transformers_line=TRANSFORMERS_LINE).arch
    attention = resolve(config["model_type"], None)
    for seq in (64, 128):
        trace = trace_training_step(config, PeftSpec(), TraceOptions(seq_len=seq, micro_batch=2, dtype="bf16",
                                                                     attention=attention, granularity_bytes=1))
        model = estimate_activation_bytes(arch, PeftSpec(), seq_len=seq, micro_batch=2, dtype_bytes=2,
                                          attention=attention)
        forward, backward = _activation_peaks(trace)
        for what, ours, theirs in (("forward", model.forward_peak_bytes, forward),
                                   ("backward", model.backward_peak_bytes, backward)):
            err = (ours - theirs) / theirs
            print(f"{name:15s} s={seq} {what:8s} peak trace {theirs:>12,} B model {ours:>12,} B {err:+.3%}")
            assert abs(err) <= LOSS_TOLERANCE
        assert model.loss_forward_bytes > 0 or name in ("bert-no-upcast", "mt5-seq2seq")
