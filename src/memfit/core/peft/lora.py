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
    OUTPUT_HEAD_NAMES,
    SEQ_CLS_HEAD_NAMES,
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
from memfit.errors import MemfitError

LORA_BIAS_MODES: tuple[str, ...] = ("none", "all", "lora_only")
"""peft ``LoraConfig.bias`` values."""

ALL_LINEAR = "all-linear"
"""peft's ``INCLUDE_LINEAR_LAYERS_SHORTHAND``: every Linear/Conv1D layer but the output head."""

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
    kind: str, module: str, weight_shape: tuple[int, ...], spec: PeftSpec
) -> list[ParamSpec]:
    """The trainable parameters LoRA adds to one layer (``LoraLayer.update_layer`` and friends).

    - Linear ``weight (out, in)`` or Conv1D ``weight (in, out)``: ``lora_A`` = Linear(in, r, no bias),
      weight ``(r, in)``; ``lora_B`` = Linear(r, out, no bias), weight ``(out, r)``.
    - Embedding ``weight (rows, dim)``: ``lora_embedding_A (r, rows)``, ``lora_embedding_B (dim, r)``.
    - DoRA (``use_dora``): ``lora_magnitude_vector`` weight ``(out,)`` (``(dim,)`` for Embedding).
    """
    r = spec.lora_r
    at = f"{module}.%s.{ADAPTER_NAME}"
    if kind == "embedding":
        rows, dim = weight_shape
        out = [ParamSpec(at % "lora_embedding_A", (r, rows)), ParamSpec(at % "lora_embedding_B", (dim, r))]
        width = dim
    else:
        out_features, in_features = weight_shape if kind == "linear" else weight_shape[::-1]
        out = [
            ParamSpec(at % "lora_A" + ".weight", (r, in_features)),
            ParamSpec(at % "lora_B" + ".weight", (out_features, r)),
        ]
        width = out_features
    if spec.use_dora:
        out.append(ParamSpec(at % "lora_magnitude_vector" + ".weight", (width,)))
    return out


def lora_target_layers(shape: ModelShape, spec: PeftSpec) -> tuple[str, ...]:
    """Names of the layers LoRA adapts, in model order (``BaseTuner.inject_adapter``).

    Targets: ``spec.target_modules`` (a module matches a name if it equals it or ends with
    ``.name``), else ``spec.target_modules_pattern`` (``re.fullmatch``; ``all-linear`` expands as
    ``_maybe_include_all_linear_layers`` does), else ``LORA_DEFAULT_TARGET_MODULES[model_type]``.
    Modules under ``modules_to_save`` are never targets (``check_target_module_exists``).
    """
    arch = shape.arch
    own = own_params(shape.params)
    modules = module_names(shape.params)
    task = task_type(shape, spec)
    saved = (*spec.modules_to_save, *(TASK_MODULES_TO_SAVE.get(task, ()) if task != "QUESTION_ANS" else ()))

    names: tuple[str, ...] = spec.target_modules
    pattern: str | None = spec.target_modules_pattern
    if not names and pattern is None:
        default = LORA_DEFAULT_TARGET_MODULES.get(arch.model_type)
        if default is None:
            raise MemfitError(
                f"peft has no default LoRA target modules for model type {arch.model_type!r};"
                " give target modules"
            )
        if isinstance(default, str):
            pattern = default
        else:
            names = default
    if pattern is not None and pattern.lower() == ALL_LINEAR:
        names = all_linear_layers(shape, own, modules, task)
        pattern = None

    targets: list[str] = []
    for module in modules:
        if any(re.match(rf"(^|.*\.){m}($|\..*)", module) for m in saved):
            continue
        if pattern is not None:
            hit = re.fullmatch(pattern, module) is not None
        else:
            hit = module in names or any(module.endswith("." + n) for n in names)
        if not hit:
            continue
        if layer_kind(arch.model_type, module, own.get(module, {})) is None:
            raise MemfitError(
                f"LoRA target {module!r} is not a Linear, Conv1D or Embedding layer; peft cannot adapt it"
            )
        targets.append(module)
    if not targets:
        wanted = pattern if pattern is not None else ", ".join(names)
        raise MemfitError(f"LoRA target modules ({wanted}) match no layer of {shape.name}")
    return tuple(targets)


def all_linear_layers(
    shape: ModelShape, own: Mapping[str, Mapping[str, ParamSpec]], modules: list[str], task: str
) -> tuple[str, ...]:
    """``all-linear``: every Linear/Conv1D but the output head (``_maybe_include_all_linear_layers``).

    The head is ``get_output_embeddings()`` (``OUTPUT_HEAD_NAMES``); a model without one and task
    SEQ_CLS drops its first top-level ``score``/``classifier`` instead.
    """
    kinds = {m: layer_kind(shape.arch.model_type, m, own.get(m, {})) for m in modules}
    linear = [m for m in modules if kinds[m] in ("linear", "conv1d")]
    heads = [m for m in OUTPUT_HEAD_NAMES if m in own]
    if not heads and task == "SEQ_CLS":
        heads = [m for m in SEQ_CLS_HEAD_NAMES if m in kinds][:1]
    return tuple(m for m in linear if m not in heads)


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
                extra = lora_layer_params(kind, module, own[module]["weight"].shape, spec)
            paired.append((new, extra))
        else:
            paired.append((ParamSpec(p.name, p.shape, is_bias and spec.lora_bias == "all"), []))
    return flatten(with_modules_to_save(paired, wrapped), "base_model.model.")


# --- prompt learning: prompt and prefix tuning -----------------------------------------------


