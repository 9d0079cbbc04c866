"""Default ``target_modules`` per ``model_type`` for each tuner: copies of peft 0.21.2's
``TRANSFORMERS_MODELS_TO_<TUNER>_TARGET_MODULES_MAPPING`` (``peft/utils/constants.py``), built the
way that file builds them (most are LoRA's mapping, some with overrides). A tuple is a list of name
suffixes, a string one regular expression. ``tests/exact/test_peft_against_library.py`` compares
each tuner's mapping with the one its peft model class uses.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from memfit.core.peft.lora import LORA_DEFAULT_TARGET_MODULES

Targets = Mapping[str, "tuple[str, ...] | str"]


def _frozen(table: dict) -> Targets:
    return MappingProxyType(table)


def lora_with(**overrides: "tuple[str, ...]") -> Targets:
    """LoRA's mapping with entries replaced (``MAPPING = LORA.copy(); MAPPING[key] = [...]``)."""
    return _frozen({**LORA_DEFAULT_TARGET_MODULES, **overrides})


LORA = LORA_DEFAULT_TARGET_MODULES
FOURIERFT = lora_with(gpt_bigcode=("mlp.c_proj",), gpt2=("mlp.c_proj",))
C3A = FOURIERFT
SHIRA = lora_with(phi=("q_proj", "v_proj"))
VERA = SHIRA
FROD = lora_with(phi=("q_proj", "v_proj"), vit=("query", "value"))
PVERA = lora_with(phi=("q_proj", "v_proj"), dinov2=("query", "value"))
ADAMSS = lora_with(vit=("query", "value"))

LNTUNING = _frozen({
    'llama': ('input_layernorm', 'post_attention_layernorm', 'norm'),
    'bloom': ('input_layernorm', 'post_attention_layernorm', 'ln_f'),
    'llava': ('multi_modal_projector', 'input_layernorm', 'post_attention_layernorm', 'norm', 'embed_tokens', 'lm_head'),
    't5': ('layer_norm', 'final_layer_norm'),
    'mt5': ('layer_norm', 'final_layer_norm'),
    'bart': ('self_attn_layer_norm', 'encoder_attn_layer_norm', 'final_layer_norm'),
    'gpt2': ('ln_1', 'ln_2', 'ln_f'),
    'blip-2': ('layernorm', 'LayerNorm', 'final_layer_norm', 'self_attn_layer_norm'),
    'gptj': ('ln_1', 'ln_f'),
    'falcon': ('input_layernorm', 'post_attention_layernorm', 'ln_f'),
    'mistral': ('input_layernorm', 'post_attention_layernorm', 'norm'),
    'phi': ('input_layernorm', 'final_layernorm'),
    'gemma': ('input_layernorm', 'post_attention_layernorm', 'norm'),
    'gemma2': ('input_layernorm', 'post_attention_layernorm', 'pre_feedforward_layernorm', 'post_feedforward_layernorm', 'norm'),
    'gemma3_text': ('input_layernorm', 'post_attention_layernorm', 'pre_feedforward_layernorm', 'post_feedforward_layernorm', 'norm'),
    'qwen2': ('post_attention_layernorm',),
    'qwen3': ('post_attention_layernorm',),
})
IA3 = _frozen({
    't5': ('k', 'v', 'wo'),
    'mt5': ('k', 'v', 'wi_1'),
    'gpt2': ('c_attn', 'mlp.c_proj'),
    'bloom': ('query_key_value', 'mlp.dense_4h_to_h'),
    'roberta': ('key', 'value', 'output.dense'),
    'opt': ('q_proj', 'k_proj', 'fc2'),
    'gptj': ('q_proj', 'v_proj', 'fc_out'),
    'gpt_neox': ('query_key_value', 'dense_4h_to_h'),
    'gpt_neo': ('q_proj', 'v_proj', 'c_proj'),
    'bart': ('q_proj', 'v_proj', 'fc2'),
    'gpt_bigcode': ('c_attn', 'mlp.c_proj'),
    'llama': ('k_proj', 'v_proj', 'down_proj'),
    'llama4': ('q_proj', 'v_proj', 'down_proj'),
    'mistral': ('k_proj', 'v_proj', 'down_proj'),
    'mixtral': ('k_proj', 'v_proj', 'w2'),
    'bert': ('key', 'value', 'output.dense'),
    'deberta-v2': ('key_proj', 'value_proj', 'output.dense'),
    'deberta': ('in_proj', 'output.dense'),
    'RefinedWebModel': ('query_key_value', 'dense_4h_to_h'),
    'RefinedWeb': ('query_key_value', 'dense_4h_to_h'),
    'falcon': ('query_key_value', 'dense_4h_to_h'),
    'phi': ('q_proj', 'v_proj', 'fc2'),
    'gemma': ('q_proj', 'v_proj', 'down_proj'),
    'gemma2': ('q_proj', 'v_proj', 'down_proj'),
    'gemma3_text': ('q_proj', 'v_proj', 'down_proj'),
    'qwen2': ('q_proj', 'v_proj', 'down_proj'),
    'qwen3': ('q_proj', 'v_proj', 'down_proj'),
})
IA3_FEEDFORWARD = _frozen({
    't5': ('wo',),
    'mt5': (),
    'gpt2': ('mlp.c_proj',),
    'bloom': ('mlp.dense_4h_to_h',),
    'roberta': ('output.dense',),
    'opt': ('fc2',),
    'gptj': ('fc_out',),
    'gpt_neox': ('dense_4h_to_h',),
    'gpt_neo': ('c_proj',),
    'bart': ('fc2',),
    'gpt_bigcode': ('mlp.c_proj',),
    'llama': ('down_proj',),
    'llama4': ('down_proj',),
    'mistral': ('down_proj',),
    'mixtral': ('w2',),
    'bert': ('output.dense',),
    'deberta-v2': ('output.dense',),
    'deberta': ('output.dense',),
    'RefinedWeb': ('dense_4h_to_h',),
    'RefinedWebModel': ('dense_4h_to_h',),
    'falcon': ('dense_4h_to_h',),
    'phi': ('fc2',),
    'gemma': ('down_proj',),
    'gemma2': ('down_proj',),
    'gemma3_text': ('down_proj',),
    'qwen2': ('down_proj',),
    'qwen3': ('down_proj',),
})
BEFT = _frozen({
    't5': ('v',),
    'mt5': ('v',),
    'roberta': ('value',),
    'opt': ('v_proj',),
    'gptj': ('v_proj',),
    'gpt_neo': ('v_proj',),
    'bart': ('v_proj',),
    'llama': ('v_proj',),
    'llama4': ('v_proj',),
    'mistral': ('v_proj',),
    'mixtral': ('v_proj',),
    'bert': ('value',),
    'deberta-v2': ('value_proj',),
    'phi': ('v_proj',),
    'gemma': ('v_proj',),
    'gemma2': ('v_proj',),
    'gemma3_text': ('v_proj',),
    'qwen2': ('v_proj',),
    'qwen3': ('v_proj',),
})
ADALORA = _frozen({
    't5': ('q', 'k', 'v', 'o', 'wi', 'wo'),
    'mt5': ('q', 'k', 'v', 'o', 'wi_0', 'wi_1', 'wo'),
    'bart': ('q_proj', 'k_proj', 'v_proj', 'out_proj', 'fc1', 'fc2'),
    'gpt2': ('c_attn',),
    'bloom': ('query_key_value',),
    'opt': ('q_proj', 'k_proj', 'v_proj', 'out_proj', 'fc1', 'fc2'),
    'gptj': ('q_proj', 'v_proj'),
    'gpt_neox': ('query_key_value',),
    'gpt_neo': ('q_proj', 'v_proj'),
    'llama': ('q_proj', 'v_proj'),
    'llama4': ('q_proj', 'v_proj'),
    'bert': ('query', 'value'),
    'roberta': ('query', 'key', 'value', 'dense'),
    'deberta-v2': ('query_proj', 'key_proj', 'value_proj', 'dense'),
    'gpt_bigcode': ('c_attn',),
    'deberta': ('in_proj',),
    'gemma': ('q_proj', 'v_proj'),
    'gemma2': ('q_proj', 'v_proj'),
    'gemma3_text': ('q_proj', 'v_proj'),
    'gemma4': '.*language_model\\..*\\.(q_proj|v_proj)',
    'qwen2': ('q_proj', 'v_proj'),
    'qwen3': ('q_proj', 'v_proj'),
    'nemotron_h': ('q_proj', 'k_proj', 'v_proj', 'o_proj'),
})
VBLORA = _frozen({
    't5': ('q', 'k', 'v', 'o', 'wi', 'wo'),
    'mt5': ('q', 'k', 'v', 'o', 'wi_0', 'wi_1', 'wo'),
    'bart': ('q_proj', 'k_proj', 'v_proj', 'out_proj', 'fc1', 'fc2'),
    'gpt2': ('c_attn',),
    'bloom': ('query_key_value',),
    'opt': ('q_proj', 'k_proj', 'v_proj', 'out_proj', 'fc1', 'fc2'),
    'gptj': ('q_proj', 'v_proj'),
    'gpt_neox': ('query_key_value',),
    'gpt_neo': ('q_proj', 'v_proj'),
    'llama': ('q_proj', 'v_proj'),
    'llama4': ('q_proj', 'v_proj'),
    'bert': ('query', 'value'),
    'roberta': ('query', 'value'),
    'deberta-v2': ('query_proj', 'key_proj', 'value_proj', 'dense'),
    'gpt_bigcode': ('c_attn',),
    'deberta': ('in_proj',),
    'gemma': ('q_proj', 'v_proj'),
    'gemma2': ('q_proj', 'v_proj'),
    'gemma3_text': ('q_proj', 'v_proj'),
    'gemma4': '.*language_model\\..*\\.(q_proj|v_proj)',
    'qwen2': ('q_proj', 'v_proj'),
    'qwen3': ('q_proj', 'v_proj'),
    'nemotron_h': ('q_proj', 'k_proj', 'v_proj', 'o_proj'),
})
OSF = _frozen({
    'llama': ('q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'down_proj', 'up_proj'),
    'llama4': ('q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'down_proj', 'up_proj'),
    'mistral': ('q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'down_proj', 'up_proj'),
    'mixtral': ('q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'down_proj', 'up_proj'),
    'gemma': ('q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'down_proj', 'up_proj'),
    'gemma2': ('q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'down_proj', 'up_proj'),
    'gemma3_text': ('q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'down_proj', 'up_proj'),
    'qwen2': ('q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'down_proj', 'up_proj'),
    'qwen3': ('q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'down_proj', 'up_proj'),
    'phi': ('q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'down_proj', 'up_proj'),
    'gpt2': ('c_attn', 'c_proj'),
    'bloom': ('query_key_value', 'dense_4h_to_h'),
    'opt': ('q_proj', 'k_proj', 'v_proj', 'out_proj', 'fc1', 'fc2'),
    'gptj': ('q_proj', 'k_proj', 'v_proj', 'out_proj', 'fc_in', 'fc_out'),
    'gpt_neox': ('query_key_value', 'dense_4h_to_h'),
    'falcon': ('query_key_value', 'dense_4h_to_h'),
    'gpt_bigcode': ('c_attn', 'c_proj'),
})
WAVEFT = _frozen({
    't5': ('q', 'v'),
    'mt5': ('q', 'v'),
    'bart': ('q_proj', 'v_proj'),
    'gpt2': ('mlp.c_proj',),
    'bloom': ('query_key_value',),
    'blip-2': ('q', 'v', 'q_proj', 'v_proj'),
    'opt': ('q_proj', 'v_proj'),
    'gptj': ('q_proj', 'v_proj'),
    'gpt_neox': ('query_key_value',),
    'gpt_neo': ('q_proj', 'v_proj'),
    'bert': ('query', 'value'),
    'roberta': ('query', 'value'),
    'xlm-roberta': ('query', 'value'),
    'electra': ('query', 'value'),
    'deberta-v2': ('query_proj', 'value_proj'),
    'deberta': ('in_proj',),
    'layoutlm': ('query', 'value'),
    'llama': ('q_proj', 'v_proj'),
    'llama4': ('q_proj', 'v_proj'),
    'chatglm': ('query_key_value',),
    'gpt_bigcode': ('mlp.c_proj',),
    'mpt': ('Wqkv',),
    'RefinedWebModel': ('query_key_value',),
    'RefinedWeb': ('query_key_value',),
    'falcon': ('query_key_value',),
    'codegen': ('qkv_proj',),
    'mistral': ('q_proj', 'v_proj'),
    'mixtral': ('q_proj', 'v_proj'),
    'stablelm': ('q_proj', 'v_proj'),
    'phi': ('q_proj', 'v_proj', 'fc1', 'fc2'),
    'gemma': ('q_proj', 'v_proj'),
    'gemma2': ('q_proj', 'v_proj'),
    'gemma3_text': ('q_proj', 'v_proj'),
    'gemma4': '.*language_model\\..*\\.(q_proj|v_proj)',
    'qwen2': ('q_proj', 'v_proj'),
    'qwen3': ('q_proj', 'v_proj'),
    'nemotron_h': ('q_proj', 'k_proj', 'v_proj', 'o_proj'),
})