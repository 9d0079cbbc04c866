"""The model as trained: which parameters exist and which train under a PEFT method.

``apply_peft(shape, spec)`` turns the base model's parameters into those of the model the optimizer
sees, named exactly as the real object's ``named_parameters()`` names them:

- ``full``: the transformers model, every parameter trainable.
- ``freeze``: the transformers model, trainability by glob patterns over parameter names.
- ``lora``: ``peft.get_peft_model(model, LoraConfig(...))``: names under ``base_model.model.``, each
  adapted layer's own parameters moved under ``.base_layer.``, plus ``lora_A``/``lora_B`` (or
  ``lora_embedding_A``/``_B``) and, with DoRA, ``lora_magnitude_vector``.
- ``prompt`` and ``prefix``: ``get_peft_model`` with a prompt-learning config: the frozen model under
  ``base_model.`` plus ``prompt_encoder.default.*``.
- any method but ``full``/``freeze``: ``modules_to_save`` keep a frozen ``.original_module.`` and
  gain a trainable copy under ``.modules_to_save.default.``.

Mirrors peft 0.21 (``peft_model.py``, ``tuners/tuners_utils.py``, ``tuners/lora/``,
``tuners/prefix_tuning/model.py``, ``tuners/prompt_tuning/model.py``, ``utils/other.py``); each
function names the code it mirrors, and ``tests/exact/test_peft_against_library.py`` checks the
result against the real library, name by name.

Glossary: a *module* is a dotted prefix of a parameter name (``transformer.h.0.attn.q_proj``); a
*layer* is a module that owns a 2-D ``weight`` (and maybe a ``bias``) and nothing else. A
``ModelShape`` carries no module classes, so a layer's kind (Linear, GPT-2's transposed Conv1D, or
Embedding) is read from its name: see ``layer_kind``.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from memfit.core.model import ArchSpec, ModelShape, ParamSpec
from memfit.core.peft.spec import PeftSpec
from memfit.errors import MemfitError

PEFT_METHODS: tuple[str, ...] = ("full", "freeze", "lora", "prompt", "prefix")
"""The methods ``apply_peft`` knows."""

LORA_BIAS_MODES: tuple[str, ...] = ("none", "all", "lora_only")
"""peft ``LoraConfig.bias`` values."""

TASK_TYPES: tuple[str, ...] = (
    "CAUSAL_LM",
    "SEQ_2_SEQ_LM",
    "SEQ_CLS",
    "TOKEN_CLS",
    "QUESTION_ANS",
    "FEATURE_EXTRACTION",
)
"""peft ``TaskType`` values memfit models (each picks a ``PeftModelFor...`` class)."""

ALL_LINEAR = "all-linear"
"""peft's ``INCLUDE_LINEAR_LAYERS_SHORTHAND``: every Linear/Conv1D layer but the output head."""

ADAPTER_NAME = "default"
"""The adapter name ``get_peft_model`` uses; it appears in every adapter parameter's name."""

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

# fmt: off
MODEL_TYPES_WITHOUT_KV_HEADS_KEY: frozenset[str] = frozenset({
    "bart", "bert", "bloom", "codegen", "deberta", "deberta-v2", "electra", "falcon", "gpt2", "gpt_neo",
    "gpt_neox", "gptj", "longt5", "mbart", "mpt", "mt5", "openai-gpt", "opt", "RefinedWeb",
    "RefinedWebModel", "roberta", "t5", "umt5", "xlm-roberta",
})
# fmt: on
"""``model_type``s whose ``config.to_dict()`` has no ``num_key_value_heads`` key, so peft sizes
their prefix by the hidden size even when the model has fewer key/value heads (falcon) or a head
width that does not multiply out to it (t5's ``d_kv``). Every other type is taken to have the key.
A test checks each entry against the installed transformers."""

CONV1D_MODEL_TYPES: frozenset[str] = frozenset({"gpt2", "openai-gpt", "imagegpt", "decision_transformer"})
"""``model_type``s built with transformers' ``Conv1D`` (weight stored as ``(in, out)``)."""

CONV1D_LAYER_NAMES: frozenset[str] = frozenset({"c_attn", "c_proj", "c_fc", "q_attn"})
"""Layer names that are ``Conv1D`` in the ``CONV1D_MODEL_TYPES`` (their ``lm_head``/``score`` are
``nn.Linear``)."""

# fmt: off
EMBEDDING_LAYER_NAMES: frozenset[str] = frozenset({
    "wte", "wpe", "embed_tokens", "embed_positions", "word_embeddings", "position_embeddings",
    "token_type_embeddings", "shared", "embed_in", "relative_attention_bias", "tokens_embed",
    "positions_embed",
})
# fmt: on
"""Layer names that are ``nn.Embedding`` in transformers models (``weight`` is ``(rows, dim)``)."""

OUTPUT_HEAD_NAMES: tuple[str, ...] = ("lm_head", "embed_out", "cls.predictions.decoder")
"""What ``get_output_embeddings()`` returns in transformers models: ``all-linear`` skips it."""

SEQ_CLS_HEAD_NAMES: tuple[str, ...] = ("score", "classifier")
"""peft's ``SEQ_CLS_HEAD_NAMES``: heads ``all-linear`` skips in a sequence classifier."""

_TASK_MODULES_TO_SAVE: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "SEQ_CLS": ("classifier", "score"),
        "TOKEN_CLS": ("classifier", "score"),
        "QUESTION_ANS": ("qa_outputs",),
    }
)
"""Heads the ``PeftModelFor<task>`` classes add to ``modules_to_save`` (``peft_model.py``)."""

_ARCHITECTURE_TASKS: tuple[tuple[str, str], ...] = (
    ("ForCausalLM", "CAUSAL_LM"),
    ("LMHeadModel", "CAUSAL_LM"),
    ("ForSeq2SeqLM", "SEQ_2_SEQ_LM"),
    ("ForSequenceClassification", "SEQ_CLS"),
    ("ForTokenClassification", "TOKEN_CLS"),
    ("ForQuestionAnswering", "QUESTION_ANS"),
)


def validate_peft_spec(spec: PeftSpec) -> PeftSpec:
    """Raise ``MemfitError`` naming the first bad setting of ``spec``; return it unchanged."""
    if spec.method not in PEFT_METHODS:
        raise MemfitError(f"unknown PEFT method {spec.method!r}; choose one of {', '.join(PEFT_METHODS)}")
    if spec.task_type is not None and spec.task_type not in TASK_TYPES:
        raise MemfitError(f"unknown peft task_type {spec.task_type!r}; choose one of {', '.join(TASK_TYPES)}")
    if spec.method in ("prompt", "prefix"):
        if spec.num_virtual_tokens <= 0:
            raise MemfitError(f"num_virtual_tokens must be positive, got {spec.num_virtual_tokens}")
        for field in ("encoder_hidden_size", "token_dim", "num_layers", "num_transformer_submodules"):
            value = getattr(spec, field)
            if value is not None and value <= 0:
                raise MemfitError(f"{field} must be positive, got {value}")
    if spec.method == "lora":
        if spec.lora_r <= 0:
            raise MemfitError(f"LoRA rank r must be positive, got {spec.lora_r}")
        if spec.lora_bias not in LORA_BIAS_MODES:
            raise MemfitError(
                f"unknown LoRA bias {spec.lora_bias!r}; choose one of {', '.join(LORA_BIAS_MODES)}"
            )
        if spec.target_modules_pattern is not None and spec.target_modules:
            raise MemfitError("give LoRA target modules either as names or as one pattern, not both")
        if spec.target_modules_pattern is not None and spec.target_modules_pattern.lower() != ALL_LINEAR:
            try:
                re.compile(spec.target_modules_pattern)
            except re.error as exc:
                raise MemfitError(f"bad LoRA target pattern {spec.target_modules_pattern!r}: {exc}") from None
    for name in spec.modules_to_save:
        try:
            re.compile(name)  # peft uses each entry inside a regular expression
        except re.error as exc:
            raise MemfitError(f"bad modules_to_save entry {name!r}: {exc}") from None
    if spec.method == "freeze" and not (spec.freeze_patterns or spec.train_patterns):
        raise MemfitError("method 'freeze' needs freeze_patterns or train_patterns")
    return spec


def apply_peft(shape: ModelShape, spec: PeftSpec) -> ModelShape:
    """The model as trained under ``spec``: its parameters, names and trainability (see module doc)."""
    validate_peft_spec(spec)
    if spec.method == "full":
        params = tuple(ParamSpec(p.name, p.shape, True) for p in shape.params)
    elif spec.method == "freeze":
        params = tuple(ParamSpec(p.name, p.shape, trained_under_freeze(p.name, spec)) for p in shape.params)
        _check_patterns_match(shape, spec)
    elif spec.method == "lora":
        params = _lora_params(shape, spec)
    else:
        params = _prompt_learning_params(shape, spec)
    return shape.with_params(params)


# --- full fine-tuning with frozen parts ------------------------------------------------------


def trained_under_freeze(name: str, spec: PeftSpec) -> bool:
    """Whether parameter ``name`` trains under method ``freeze``.

    With ``train_patterns``: it trains iff it matches one of them and none of ``freeze_patterns``.
    Without: it trains iff it matches none of ``freeze_patterns``. Patterns are shell globs over the
    whole dotted name (``fnmatch.fnmatchcase``; ``*`` also crosses dots).
    """
    frozen = any(fnmatch.fnmatchcase(name, pattern) for pattern in spec.freeze_patterns)
    if spec.train_patterns:
        return not frozen and any(fnmatch.fnmatchcase(name, pattern) for pattern in spec.train_patterns)
    return not frozen


def _check_patterns_match(shape: ModelShape, spec: PeftSpec) -> None:
    for pattern in (*spec.freeze_patterns, *spec.train_patterns):
        if not any(fnmatch.fnmatchcase(p.name, pattern) for p in shape.params):
            raise MemfitError(f"pattern {pattern!r} matches no parameter of {shape.name}")


# --- task types and modules_to_save ----------------------------------------------------------


def resolve_task_type(architecture: str, *, is_encoder_decoder: bool, spec: PeftSpec) -> str:
    """peft ``TaskType`` for a model class: ``spec.task_type`` if given, else read from the class name.

    ``...ForConditionalGeneration`` is SEQ_2_SEQ_LM for encoder-decoder models (T5, BART) and
    CAUSAL_LM otherwise; any other class (a bare ``...Model``, a masked LM) gets
    FEATURE_EXTRACTION, which adds no head and which prompt learning accepts (it needs a task type).
    """
    if spec.task_type is not None:
        return spec.task_type
    if architecture.endswith("ForConditionalGeneration"):
        return "SEQ_2_SEQ_LM" if is_encoder_decoder else "CAUSAL_LM"
    for suffix, task in _ARCHITECTURE_TASKS:
        if architecture.endswith(suffix):
            return task
    return "FEATURE_EXTRACTION"


def _task_type(shape: ModelShape, spec: PeftSpec) -> str:
    return resolve_task_type(
        shape.architecture, is_encoder_decoder=shape.arch.num_encoder_layers > 0, spec=spec
    )


def _module_names(params: Iterable[ParamSpec]) -> list[str]:
    """Every module that holds a parameter, parents first (the order of ``named_modules()``)."""
    seen: dict[str, None] = {}
    for p in params:
        parts = p.name.split(".")[:-1]
        for i in range(1, len(parts) + 1):
            seen.setdefault(".".join(parts[:i]), None)
    return list(seen)


def _modules_to_save(modules: list[str], names: Iterable[str], *, required: Iterable[str]) -> list[str]:
    """Modules a ``ModulesToSaveWrapper`` wraps: those whose name ends with one of ``names``.

    Mirrors ``peft.utils.other._set_trainable``: a plain ``str.endswith`` over ``named_modules()``
    (``classifier`` also matches ``foo_classifier``). Only the outermost of nested matches is kept.
    A name in ``required`` (the user's) that matches nothing raises ``MemfitError``; peft ignores it
    silently, but it is usually a typo or a tied module (a tied ``lm_head`` owns no parameter here).
    """
    names = tuple(names)
    wrapped: list[str] = []
    for module in modules:
        if any(module.endswith(n) for n in names) and not _under_any(module, wrapped):
            wrapped.append(module)
    for name in required:
        if not any(module.endswith(name) for module in modules):
            raise MemfitError(f"modules_to_save entry {name!r} matches no module with parameters")
    return wrapped


def _under_any(name: str, modules: Iterable[str]) -> str | None:
    for module in modules:
        if name == module or name.startswith(module + "."):
            return module
    return None


def _with_modules_to_save(
    params: list[tuple[ParamSpec, list[ParamSpec]]], wrapped: list[str]
) -> list[tuple[ParamSpec, list[ParamSpec]]]:
    """Rename the wrapped modules' params to ``.original_module.`` (frozen) and add trainable copies.

    ``params`` pairs each base parameter with the adapter parameters that follow it; the copy of a
    wrapped module (``copy.deepcopy`` in ``ModulesToSaveWrapper.update``) follows its last parameter.
    """
    last_index = {
        module: i for i, (p, _) in enumerate(params) for module in wrapped if _under_any(p.name, [module])
    }
    out: list[tuple[ParamSpec, list[ParamSpec]]] = []
    copies: dict[str, list[ParamSpec]] = {module: [] for module in wrapped}
    for i, (p, extra) in enumerate(params):
        module = _under_any(p.name, wrapped)
        if module is None:
            out.append((p, extra))
            continue
        rest = p.name[len(module) :]
        copies[module].append(ParamSpec(f"{module}.modules_to_save.{ADAPTER_NAME}{rest}", p.shape, True))
        after = [*extra, *copies[module]] if last_index[module] == i else extra
        out.append((ParamSpec(f"{module}.original_module{rest}", p.shape, False), after))
    return out


def _flatten(params: list[tuple[ParamSpec, list[ParamSpec]]], prefix: str) -> tuple[ParamSpec, ...]:
    return tuple(ParamSpec(prefix + q.name, q.shape, q.trainable) for p, extra in params for q in (p, *extra))


# --- LoRA -------------------------------------------------------------------------------------


def layer_kind(model_type: str, module: str, own: Mapping[str, ParamSpec]) -> str | None:
    """``linear``, ``conv1d``, ``embedding``, or ``None`` (not a layer LoRA can adapt).

    A layer owns exactly a 2-D ``weight`` and maybe a ``bias``. It is an Embedding if its last name
    part is in ``EMBEDDING_LAYER_NAMES``, a Conv1D if the model type is in ``CONV1D_MODEL_TYPES`` and
    the name in ``CONV1D_LAYER_NAMES``, and a Linear otherwise.
    """
    weight = own.get("weight")
    if weight is None or len(weight.shape) != 2 or set(own) - {"weight", "bias"}:
        return None
    leaf = module.rsplit(".", 1)[-1]
    if leaf in EMBEDDING_LAYER_NAMES:
        return "embedding"
    if model_type in CONV1D_MODEL_TYPES and leaf in CONV1D_LAYER_NAMES:
        return "conv1d"
    return "linear"


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
    own = _own_params(shape.params)
    modules = _module_names(shape.params)
    task = _task_type(shape, spec)
    saved = (*spec.modules_to_save, *(_TASK_MODULES_TO_SAVE.get(task, ()) if task != "QUESTION_ANS" else ()))

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
        names = _all_linear_layers(shape, own, modules, task)
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


def _own_params(params: Iterable[ParamSpec]) -> dict[str, dict[str, ParamSpec]]:
    own: dict[str, dict[str, ParamSpec]] = {}
    for p in params:
        module, _, leaf = p.name.rpartition(".")
        own.setdefault(module, {})[leaf] = p
    return own


def _all_linear_layers(
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


def _lora_params(shape: ModelShape, spec: PeftSpec) -> tuple[ParamSpec, ...]:
    """LoRA (``LoraModel``): base frozen, adapted layers under ``.base_layer.``, adapters trainable.

    Trainability (``BaseTuner._mark_only_adapters_as_trainable``): adapters train; with bias
    ``all`` every parameter named ``*.bias`` trains, with ``lora_only`` the adapted layers' biases;
    then ``modules_to_save`` originals are frozen and their copies train.
    """
    targets = set(lora_target_layers(shape, spec))
    own = _own_params(shape.params)
    task = _task_type(shape, spec)
    user_saved = spec.modules_to_save
    saved_names = (*user_saved, *_TASK_MODULES_TO_SAVE.get(task, ()))
    modules = _module_names(shape.params)
    wrapped = _modules_to_save(modules, saved_names, required=user_saved)
    for module in wrapped:
        inside = [t for t in targets if _under_any(t, [module]) or _under_any(module, [t])]
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
    return _flatten(_with_modules_to_save(paired, wrapped), "base_model.model.")


# --- prompt learning: prompt and prefix tuning -----------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class PromptLearningDims:
    """The sizes peft's ``_prepare_prompt_learning_config`` fills into a prompt-learning config."""

    token_dim: int
    """Width of one virtual token: the hidden size, except for prefix tuning on a config with
    ``num_key_value_heads``, where it is ``head_dim * num_key_value_heads`` (peft #1901)."""
    num_layers: int
    """``config.num_hidden_layers`` (the encoder's count for encoder-decoder models)."""
    encoder_hidden_size: int
    """Prefix projection MLP width (peft default: ``token_dim``)."""
    num_transformer_submodules: int
    """2 for SEQ_2_SEQ_LM (encoder and decoder each get the prompt), else 1."""


def prompt_learning_dims(shape: ModelShape, spec: PeftSpec) -> PromptLearningDims:
    """Mirror of ``peft.utils.other._prepare_prompt_learning_config`` plus ``_setup_prompt_encoder``.

    Values saved in an adapter_config.json (``spec.token_dim``, ...) win, except that prefix tuning
    on a model whose config has ``num_key_value_heads`` always recomputes ``token_dim``.
    """
    arch: ArchSpec = shape.arch
    token_dim = spec.token_dim or arch.hidden_size
    num_layers = spec.num_layers or (arch.num_encoder_layers or arch.num_layers)
    if spec.method == "prefix" and arch.model_type not in MODEL_TYPES_WITHOUT_KV_HEADS_KEY:
        token_dim = arch.head_dim * arch.num_kv_heads
    submodules = spec.num_transformer_submodules or (2 if _task_type(shape, spec) == "SEQ_2_SEQ_LM" else 1)
    return PromptLearningDims(
        token_dim=token_dim,
        num_layers=num_layers,
        encoder_hidden_size=spec.encoder_hidden_size or token_dim,
        num_transformer_submodules=submodules,
    )


def prefix_encoder_params(dims: PromptLearningDims, spec: PeftSpec) -> tuple[ParamSpec, ...]:
    """peft's ``PrefixEncoder`` (``tuners/prefix_tuning/model.py``), training mode.

    With ``L = num_layers``, ``d = token_dim``, ``h = encoder_hidden_size``, ``n = num_virtual_tokens``:
    plain: ``Embedding(n, 2*L*d)``; with ``prefix_projection``: ``Embedding(n, d)`` then
    ``Linear(d, h)``, ``Tanh``, ``Linear(h, 2*L*d)``, i.e. ``n*d + (d+1)*h + (h+1)*2*L*d`` params
    (the seed case, GPT-J 6B with n=10, h=4096: 956,575,744).
    """
    n, d, h = spec.num_virtual_tokens, dims.token_dim, dims.encoder_hidden_size
    kv = dims.num_layers * 2 * d
    at = f"prompt_encoder.{ADAPTER_NAME}."
    if not spec.prefix_projection:
        return (ParamSpec(at + "embedding.weight", (n, kv)),)
    return (
        ParamSpec(at + "embedding.weight", (n, d)),
        ParamSpec(at + "transform.0.weight", (h, d)),
        ParamSpec(at + "transform.0.bias", (h,)),
        ParamSpec(at + "transform.2.weight", (kv, h)),
        ParamSpec(at + "transform.2.bias", (kv,)),
    )


def prompt_embedding_params(dims: PromptLearningDims, spec: PeftSpec) -> tuple[ParamSpec, ...]:
    """peft's ``PromptEmbedding`` (``tuners/prompt_tuning/model.py``).

    ``Embedding(num_virtual_tokens * num_transformer_submodules, token_dim)``.
    """
    rows = spec.num_virtual_tokens * dims.num_transformer_submodules
    return (ParamSpec(f"prompt_encoder.{ADAPTER_NAME}.embedding.weight", (rows, dims.token_dim)),)


def _prompt_learning_params(shape: ModelShape, spec: PeftSpec) -> tuple[ParamSpec, ...]:
    """Prompt/prefix tuning: base frozen under ``base_model.`` (``PeftModel._setup_prompt_encoder``),
    the ``modules_to_save`` copies and the prompt encoder (``prompt_encoder.default.``) trainable."""
    dims = prompt_learning_dims(shape, spec)
    task = _task_type(shape, spec)
    wrapped = _modules_to_save(
        _module_names(shape.params),
        (*spec.modules_to_save, *_TASK_MODULES_TO_SAVE.get(task, ())),
        required=spec.modules_to_save,
    )
    # _setup_prompt_encoder freezes the parameters of the model's children: a parameter held by the
    # model object itself (no dot in its name) keeps its requires_grad.
    paired = [(ParamSpec(p.name, p.shape, p.trainable and "." not in p.name), []) for p in shape.params]
    base = _flatten(_with_modules_to_save(paired, wrapped), "base_model.")
    encoder = (
        prefix_encoder_params(dims, spec) if spec.method == "prefix" else prompt_embedding_params(dims, spec)
    )
    return base + encoder
