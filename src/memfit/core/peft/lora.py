"""LoRA: ``peft.get_peft_model(model, LoraConfig(...))``: names under ``base_model.model.``, each adapted
layer's own parameters moved under ``.base_layer.``, plus ``lora_A``/``lora_B`` (or
``lora_embedding_A``/``_B``) and, with DoRA, ``lora_magnitude_vector`` (peft 0.21 ``tuners/lora/``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from types import MappingProxyType

from memfit.core.model import ModelShape, ParamSpec
from memfit.core.peft.modules import (
    ADAPTER_NAME,
    TASK_MODULES_TO_SAVE,
    flatten,
    layer_kind,
    module_names,
    modules_to_save,
    own_params,
    task_type,
    under_any,
    with_modules_to_save,
)
from memfit.core.peft.spec import PeftSpec
from memfit.core.peft.targets import ALL_LINEAR, all_linear_layers, find_targets  # noqa: F401 (re-exported)
from memfit.errors import MemfitError

LORA_BIAS_MODES: tuple[str, ...] = ("none", "all", "lora_only")
"""peft ``LoraConfig.bias`` values."""

LORA_KINDS = frozenset({"linear", "conv1d", "embedding"})
"""Layers ``LoraModel._create_new_module`` adapts here (``nn.Linear``, ``Conv1D``, ``nn.Embedding``)."""

LORA_DEFAULT_TARGET_MODULES: Mapping[str, tuple[str, ...] | str] = MappingProxyType(
    {
        "t5": ("q", "v"),
        "mt5": ("q", "v"),
        "bart": ("q_proj", "v_proj"),
        "gpt2": ("c_attn",),
        "bloom": ("query_key_value",),
        "blip-2": ("q", "v", "q_proj", "v_proj"),
        "opt": ("q_proj", "v_proj"),
        "gptj": ("q_proj", "v_proj"),
        "gpt_neox": ("query_key_value",),
        "gpt_neo": ("q_proj", "v_proj"),
        "bert": ("query", "value"),
        "roberta": ("query", "value"),
        "xlm-roberta": ("query", "value"),
        "electra": ("query", "value"),
        "deberta-v2": ("query_proj", "value_proj"),
        "deberta": ("in_proj",),
        "layoutlm": ("query", "value"),
        "llama": ("q_proj", "v_proj"),
        "llama4": ("q_proj", "v_proj"),
        "chatglm": ("query_key_value",),
        "gpt_bigcode": ("c_attn",),
        "mpt": ("Wqkv",),
        "RefinedWebModel": ("query_key_value",),
        "RefinedWeb": ("query_key_value",),
        "falcon": ("query_key_value",),
        "btlm": ("c_proj", "c_attn"),
        "codegen": ("qkv_proj",),
        "mistral": ("q_proj", "v_proj"),
        "mixtral": ("q_proj", "v_proj"),
        "stablelm": ("q_proj", "v_proj"),
        "phi": ("q_proj", "v_proj", "fc1", "fc2"),
        "gemma": ("q_proj", "v_proj"),
        "gemma2": ("q_proj", "v_proj"),
        "gemma3_text": ("q_proj", "v_proj"),
        "gemma4": r".*language_model\..*\.(q_proj|v_proj)",
        "qwen2": ("q_proj", "v_proj"),
        "qwen3": ("q_proj", "v_proj"),
        "nemotron_h": ("q_proj", "k_proj", "v_proj", "o_proj"),
        "rwkv": ("key", "value", "receptance", "output"),
        "rwkv7": ("r_proj", "k_proj", "v_proj", "o_proj", "key", "value"),
    }
)
"""LoRA's default targets per ``model_type`` when ``target_modules`` is empty: a copy of peft's
``TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING`` (``peft/utils/constants.py``; a string is a
regular expression, a tuple a list of name suffixes). A test compares it with the installed peft."""

def lora_layer_params(
    kind: str, module: str, weight_shape: tuple[int, ...], spec: PeftSpec, r: int | None = None
) -> list[ParamSpec]:
    """The trainable parameters LoRA adds to one layer (``LoraLayer.update_layer`` and friends).

    - Linear ``weight (out, in)`` or Conv1D ``weight (in, out)``: ``lora_A`` = Linear(in, r, no bias),
      weight ``(r, in)``; ``lora_B`` = Linear(r, out, no bias), weight ``(out, r)``.
    - Embedding ``weight (rows, dim)``: ``lora_embedding_A (r, rows)``, ``lora_embedding_B (dim, r)``.
    - DoRA (``use_dora``): ``lora_magnitude_vector`` weight ``(out,)`` (``(dim,)`` for Embedding).

    ``r``: this module's rank (``lora_rank``; default ``spec.lora_r``). LoRA-FA
    (``spec.lora_fa``): ``create_lorafa_optimizer`` sets ``requires_grad_(False)`` on every
    parameter named ``lora_A`` (peft/optimizers/lorafa.py).
    """
    r = spec.lora_r if r is None else r
    at = f"{module}.%s.{ADAPTER_NAME}"
    if kind == "embedding":
        rows, dim = weight_shape
        out = [ParamSpec(at % "lora_embedding_A", (r, rows)), ParamSpec(at % "lora_embedding_B", (dim, r))]
        width = dim
    else:
        out_features, in_features = weight_shape if kind == "linear" else weight_shape[::-1]
        out = [
            ParamSpec(at % "lora_A" + ".weight", (r, in_features), not spec.lora_fa),
            ParamSpec(at % "lora_B" + ".weight", (out_features, r)),
        ]
        width = out_features
    if spec.use_dora:
        out.append(ParamSpec(at % "lora_magnitude_vector" + ".weight", (width,)))
    return out


def lora_target_layers(shape: ModelShape, spec: PeftSpec) -> tuple[str, ...]:
    """Names of the layers LoRA adapts, in model order (``BaseTuner.inject_adapter``).

    Targets: ``spec.target_modules`` (a module matches a name if it equals it or ends with
    ``.name``, within ``layers_to_transform``), else ``spec.target_modules_pattern``
    (``re.fullmatch``; ``all-linear`` expands as ``_maybe_include_all_linear_layers`` does), else
    ``LORA_DEFAULT_TARGET_MODULES[model_type]``; ``exclude_modules`` and modules under
    ``modules_to_save`` are never targets (``check_target_module_exists``; ``memfit.core.peft.targets``).
    """
    return tuple(layer.module for layer in find_targets(shape, spec, what="LoRA", defaults=LORA_DEFAULT_TARGET_MODULES,
                                                        kinds=LORA_KINDS))


def lora_rank(module: str, spec: PeftSpec) -> int:
    r"""The rank of one adapted module: the first ``rank_pattern`` key ``k`` with
    ``re.match(rf"(.*\.)?({k})$", module)``, else ``r`` (``utils/other.py:get_pattern_key``,
    ``LoraModel._create_and_replace``)."""
    for key, r in spec.rank_pattern:
        if re.match(rf"(.*\.)?({key})$", module):
            return r
    return spec.lora_r


def lora_params(shape: ModelShape, spec: PeftSpec) -> tuple[ParamSpec, ...]:
    """LoRA (``LoraModel``): base frozen, adapted layers under ``.base_layer.``, adapters trainable.

    Trainability (``BaseTuner._mark_only_adapters_as_trainable``): adapters train; with bias
    ``all`` every parameter named ``*.bias`` trains, with ``lora_only`` the adapted layers' biases;
    then ``modules_to_save`` originals are frozen and their copies train.
    """
    targets = set(lora_target_layers(shape, spec))
    own = own_params(shape.params)
    task = task_type(shape, spec)
    user_saved = spec.modules_to_save
    saved_names = (*user_saved, *TASK_MODULES_TO_SAVE.get(task, ()))
    modules = module_names(shape.params)
    wrapped = modules_to_save(modules, saved_names, required=user_saved)
    for module in wrapped:
        inside = [t for t in targets if under_any(t, [module]) or under_any(module, [t])]
        if inside:
            raise MemfitError(
                f"modules_to_save {module!r} overlaps LoRA target {inside[0]!r}; memfit does not model that"
            )

    last_of: dict[str, int] = {}
    for i, p in enumerate(shape.params):
        module = p.name.rpartition(".")[0]
        if module in targets:
            last_of[module] = i
    paired: list[tuple[ParamSpec, list[ParamSpec]]] = []
    for i, p in enumerate(shape.params):
        module, _, leaf = p.name.rpartition(".")
        is_bias = leaf == "bias"
        if module in targets:
            trains = is_bias and spec.lora_bias in ("all", "lora_only")
            new = ParamSpec(f"{module}.base_layer.{leaf}", p.shape, trains)
            extra = []
            if last_of[module] == i:
                kind = layer_kind(shape.arch.model_type, module, own[module])
                assert kind is not None  # lora_target_layers checked it
                extra = lora_layer_params(kind, module, own[module]["weight"].shape, spec, lora_rank(module, spec))
            paired.append((new, extra))
        else:
            paired.append((ParamSpec(p.name, p.shape, is_bias and spec.lora_bias == "all"), []))
    return flatten(with_modules_to_save(paired, wrapped), "base_model.model.")


# --- prompt learning: prompt and prefix tuning -----------------------------------------------


