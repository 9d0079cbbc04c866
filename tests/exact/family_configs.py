"""Tiny config.json mappings of every family memfit builds, and the options each family has.

Shared by the shape tests (tests/exact/test_meta_build.py, test_families.py) and the activation
tests (tests/trace/test_family_activations.py). Every model here builds on the meta device in
milliseconds and for real on the CPU in well under a second.
"""

from __future__ import annotations

_DECODER = {
    "hidden_size": 32, "intermediate_size": 48, "num_attention_heads": 4, "num_hidden_layers": 2,
    "vocab_size": 97,
}
_GQA = {**_DECODER, "num_key_value_heads": 2}
_T5 = {"vocab_size": 97, "d_model": 32, "d_kv": 8, "d_ff": 48, "num_layers": 2, "num_heads": 4}
_ENCODER = {**_DECODER, "max_position_embeddings": 64}

TINY: dict[str, dict] = {
    "gptj": {"n_embd": 32, "n_head": 4, "n_layer": 2, "vocab_size": 97, "rotary_dim": 4},
    "gpt2": {"n_embd": 32, "n_head": 4, "n_layer": 2, "vocab_size": 97, "n_positions": 64},
    "llama": dict(_DECODER),
    "mistral": dict(_GQA),
    "mixtral": dict(_GQA),
    "qwen2": dict(_GQA),
    "qwen3": {**_GQA, "head_dim": 8},
    "qwen2_moe": {**_GQA, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16,
                  "shared_expert_intermediate_size": 24},
    "qwen3_moe": {**_GQA, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16, "head_dim": 8},
    "gemma": {**_DECODER, "num_key_value_heads": 1, "head_dim": 8},
    "gemma2": {**_GQA, "head_dim": 8},
    "gemma3_text": {**_GQA, "head_dim": 8, "num_hidden_layers": 7},  # 6 sliding + 1 full layer
    "phi3": {**_DECODER, "pad_token_id": 0},
    "olmo2": dict(_DECODER),
    "deepseek_v3": {**_DECODER, "num_hidden_layers": 3, "num_key_value_heads": 4, "moe_intermediate_size": 16,
                    "n_routed_experts": 4, "num_experts_per_tok": 2, "n_group": 2, "topk_group": 1,
                    "first_k_dense_replace": 1, "kv_lora_rank": 8, "q_lora_rank": 12, "qk_rope_head_dim": 4,
                    "qk_nope_head_dim": 8, "v_head_dim": 8},
    "llama4_text": {**_GQA, "num_hidden_layers": 3, "intermediate_size_mlp": 40, "num_local_experts": 2,
                    "head_dim": 8, "interleave_moe_layer_step": 2},
    "opt": {"hidden_size": 32, "ffn_dim": 48, "num_attention_heads": 4, "num_hidden_layers": 2,
            "vocab_size": 97, "max_position_embeddings": 64},
    "bloom": {"n_layer": 2, "n_head": 4, "vocab_size": 97},
    "gpt_neox": dict(_DECODER),
    "falcon": {"hidden_size": 32, "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 97},
    "t5": dict(_T5),
    "mt5": dict(_T5),
    "umt5": dict(_T5),
    "bert": dict(_ENCODER),
    "roberta": {**_ENCODER, "max_position_embeddings": 66},
    "deberta-v2": dict(_ENCODER),
}

VARIANTS: dict[str, tuple[str, dict]] = {
    "gptj-tied-n_inner-aliases": ("gptj", {
        "hidden_size": 32, "n_embd": None, "n_inner": 40, "tie_word_embeddings": True,
    }),
    "gpt2-untied-cross-attention": ("gpt2", {
        "tie_word_embeddings": False, "n_inner": 40, "add_cross_attention": True,
    }),
    "llama-biases-head_dim-tied": ("llama", {
        "attention_bias": True, "mlp_bias": True, "head_dim": 16, "tie_word_embeddings": True,
    }),
    "llama-gqa": ("llama", {"num_key_value_heads": 1}),
    "mistral-head_dim-tied": ("mistral", {"head_dim": 12, "tie_word_embeddings": True}),
    "mixtral-4-experts-top-1": ("mixtral", {"num_local_experts": 4, "num_experts_per_tok": 1}),
    "mixtral-num_experts-alias-tied": ("mixtral", {"num_experts": 3, "tie_word_embeddings": True}),
    "qwen2-tied": ("qwen2", {"tie_word_embeddings": True}),
    "opt-350m-style-projection": ("opt", {
        "word_embed_proj_dim": 16, "do_layer_norm_before": False, "tie_word_embeddings": False,
    }),
    "opt-no-bias-no-affine-no-final": ("opt", {
        "enable_bias": False, "layer_norm_elementwise_affine": False,
        "_remove_final_layer_norm": True,
    }),
    "bloom-n_embed-untied": ("bloom", {"n_embed": 48, "tie_word_embeddings": False}),
    "bloom-hidden-size": ("bloom", {"hidden_size": 40}),
    "t5-relu-tied": ("t5", {"feed_forward_proj": "relu"}),
    "t5-gated-untied-deeper-decoder": ("t5", {
        "feed_forward_proj": "gated-silu", "tie_word_embeddings": False, "num_decoder_layers": 3,
    }),
    "bert-untied-one-token-type": ("bert", {"tie_word_embeddings": False, "type_vocab_size": 1}),
    "bert-decoder-cross-attention": ("bert", {"is_decoder": True, "add_cross_attention": True}),
    "gptj-odd-rotary_dim": ("gptj", {"rotary_dim": 5, "n_positions": 48}),
    "gptj-rotary_dim-absent-is-64": ("gptj", {"rotary_dim": None}),
    "llama-llama3-rope": ("llama", {"rope_scaling": {
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 1024,
    }, "rope_theta": 500000.0}),
    "llama-linear-rope-partial-factor": ("llama", {
        "head_dim": 12, "rope_scaling": {"type": "linear", "factor": 2.0},
        "partial_rotary_factor": 0.5,
    }),
    "qwen2-rope_parameters-own-partial-factor": ("qwen2", {"rope_parameters": {
        "rope_type": "linear", "factor": 2.0, "rope_theta": 1e4, "partial_rotary_factor": 0.25,
    }}),
    "mistral-default-rope-ignores-partial-factor": ("mistral", {"partial_rotary_factor": 0.5}),
    "mixtral-proportional-rope": ("mixtral", {"rope_scaling": {
        "rope_type": "proportional", "partial_rotary_factor": 0.5,
    }}),
    # families added for issue 10
    "phi3-partial-rotary-gqa-tied": ("phi3", {
        "partial_rotary_factor": 0.5, "num_key_value_heads": 2, "tie_word_embeddings": True,
    }),
    "deepseek-q_proj-no-dense-two-shared-bias": ("deepseek_v3", {
        "q_lora_rank": None, "first_k_dense_replace": 0, "n_shared_experts": 2, "attention_bias": True,
    }),
    "deepseek-yarn-rope": ("deepseek_v3", {"rope_scaling": {
        "type": "yarn", "factor": 4, "original_max_position_embeddings": 16, "beta_fast": 32, "beta_slow": 1,
        "mscale": 1.0, "mscale_all_dim": 1.0,
    }, "max_position_embeddings": 64}),
    "qwen2_moe-dense-layers-no-qkv-bias-tied": ("qwen2_moe", {
        "mlp_only_layers": [1], "decoder_sparse_step": 2, "qkv_bias": False, "tie_word_embeddings": True,
    }),
    "qwen2_moe-no-experts": ("qwen2_moe", {"num_experts": 0}),
    "qwen3_moe-dense-layers-bias": ("qwen3_moe", {"mlp_only_layers": [0], "attention_bias": True}),
    "llama4-moe_layers-listed": ("llama4_text", {"moe_layers": [0, 2]}),
    "llama4-all-moe-bias": ("llama4_text", {"interleave_moe_layer_step": 1, "attention_bias": True}),
    "gemma3-all-full-attention": ("gemma3_text", {"layer_types": ["full_attention"] * 7}),
    "gemma3-linear-rope-scaling": ("gemma3_text", {"rope_scaling": {"rope_type": "linear", "factor": 8.0}}),
    "gemma-untied": ("gemma", {"tie_word_embeddings": False}),
    "gemma2-attention-bias": ("gemma2", {"attention_bias": True}),
    "olmo2-gqa-bias-tied": ("olmo2", {"num_key_value_heads": 2, "attention_bias": True, "tie_word_embeddings": True}),
    "qwen3-head_dim-default-128-tied": ("qwen3", {"head_dim": None, "tie_word_embeddings": True}),
    "gpt_neox-rotary_pct-no-bias-tied": ("gpt_neox", {
        "rotary_pct": 0.5, "attention_bias": False, "tie_word_embeddings": True,
    }),
    "gpt_neox-linear-rope": ("gpt_neox", {"rope_scaling": {"rope_type": "linear", "factor": 2.0}}),
    "falcon-40b-style-new-architecture": ("falcon", {"new_decoder_architecture": True, "num_kv_heads": 2}),
    "falcon-sequential-mha-bias": ("falcon", {"multi_query": False, "parallel_attn": False, "bias": True}),
    "falcon-alibi-untied": ("falcon", {"alibi": True, "tie_word_embeddings": False}),
    "falcon-new-architecture-one-norm": ("falcon", {
        "new_decoder_architecture": True, "num_ln_in_parallel_attn": 1, "num_kv_heads": 1, "ffn_hidden_size": 40,
    }),
    "falcon-n_embed": ("falcon", {"n_embed": 48}),
    "mt5-untied": ("mt5", {"tie_word_embeddings": False}),
    "umt5-untied-deeper-decoder": ("umt5", {"tie_word_embeddings": False, "num_decoder_layers": 3}),
    "deberta-v3-style-relative-buckets-conv": ("deberta-v2", {
        "relative_attention": True, "pos_att_type": "p2c|c2p", "position_buckets": 8, "norm_rel_ebd": "layer_norm",
        "conv_kernel_size": 3, "type_vocab_size": 2, "position_biased_input": False,
    }),
    "deberta-v2-separate-pos-proj-embedding-size-untied": ("deberta-v2", {
        "relative_attention": True, "pos_att_type": ["p2c", "c2p"], "max_relative_positions": 16,
        "embedding_size": 16, "tie_word_embeddings": False,
    }),
    "deberta-v2-shared-keys": ("deberta-v2", {"relative_attention": True, "pos_att_type": "c2p", "share_att_key": True}),
    "deberta-v2-not-legacy-head": ("deberta-v2", {"legacy": False}),
    "roberta-untied": ("roberta", {"tie_word_embeddings": False, "type_vocab_size": 1}),
    "bert-three-labels": ("bert", {"id2label": {"0": "a", "1": "b", "2": "c"}}),
}
