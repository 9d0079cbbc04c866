"""``LoraConfig``'s fields (peft 0.21.2 ``tuners/lora/config.py``), each with the role it plays in memory
(``memfit.core.peft.tuners.base.Key``). ``parse.py`` reads LoRA's adapter_config.json through this
table, and ``tests/exact/test_peft_against_library.py`` checks it lists exactly LoraConfig's fields
with peft's defaults. AdaLoRA's config extends it (``tuners/adalora.py``)."""

from __future__ import annotations

from memfit.core.peft.keys import (EXCLUDE, FAN_IN_FAN_OUT, LAYERS, LAYERS_PATTERN, MODULES_TO_SAVE, TARGETS,
                                          free, keys, note, only, sized)

_SETUP = ("runs once at get_peft_model (an SVD, QR or a pass over data in fp32 per layer; its transient memory at "
          "setup is not modelled) and rewrites the base weights in place: the trained model has LoRA's shapes")

LORA_KEYS = keys(
    r=sized("int", 8, "rank of lora_A (r, in) and lora_B (out, r)"),
    target_modules=TARGETS,
    exclude_modules=EXCLUDE,
    lora_alpha=free("float", 8, "scales the delta (alpha / r) only"),
    lora_dropout=sized("float", 0.0, "dropout on the adapter's input: a mask and a dropped copy per adapted layer"),
    fan_in_fan_out=FAN_IN_FAN_OUT,
    bias=sized("str", "none", "none, all (every bias trains) or lora_only (the adapted layers' biases)",
               choices=("none", "all", "lora_only")),
    use_rslora=free("bool", False, "scales the delta by alpha / sqrt(r) instead of alpha / r"),
    modules_to_save=MODULES_TO_SAVE,
    init_lora_weights=note("any", True, "init_lora_weights " + _SETUP),
    layers_to_transform=LAYERS,
    layers_pattern=LAYERS_PATTERN,
    rank_pattern=sized("dict", {}, "per-module ranks (peft's get_pattern_key)"),
    alpha_pattern=free("dict", {}, "per-module alphas: scales only"),
    megatron_config=only(None, "Megatron-LM's parallel linear layers"),
    megatron_core=free("str", "megatron.core", "the module megatron_config names (unused without it)"),
    trainable_token_indices=only(None, "trainable token rows of the embedding beside LoRA"),
    loftq_config=note("dict", {}, "LoftQ's settings, used with init_lora_weights='loftq' (which " + _SETUP + ")"),
    eva_config=note("dict", None, "EVA's settings (init_lora_weights='eva' " + _SETUP + ")"),
    corda_config=note("dict", None, "CorDA's settings (init_lora_weights='corda' " + _SETUP + ")"),
    lora_ga_config=note("dict", None, "LoRA-GA's settings (init_lora_weights='lora_ga' " + _SETUP + ")"),
    use_dora=sized("bool", False, "DoRA: a magnitude vector per layer and the weight norm in every forward"),
    velora_config=only(None, "VeLoRA's compressed activations"),
    alora_invocation_tokens=only(None, "activated LoRA (the adapter on the tokens after the invocation only)"),
    use_qalora=only(False, "QA-LoRA's pooled inputs"),
    qalora_group_size=free("int", 16, "used with use_qalora only"),
    monteclora_config=only(None, "MonteCLoRA's sampled adapters"),
    layer_replication=only(None, "layers duplicated before adapting"),
    runtime_config=free("any", {"ephemeral_gpu_offload": False}, "loading-time offload of adapters (not training)"),
    lora_bias=only(False, "a trainable bias on lora_B"),
    target_parameters=only(None, "LoRA on bare parameters (MoE expert weights) rather than modules"),
    use_bdlora=only(None, "BD-LoRA's block-diagonal adapters"),
    arrow_config=only(None, "Arrow routing over several LoRA adapters"),
    kasa_config=only(None, "KaSA's singular-value adapters"),
    ensure_weight_tying=free("bool", False, "keeps tied embeddings tied when both are adapted or saved"),
)
