"""The model as trained: which parameters exist and which train under a PEFT method.

``apply_peft(shape, spec)`` turns the base model's parameters into those of the model the optimizer
sees, named exactly as the real object's ``named_parameters()`` names them. Each method is a module
beside this one:

- ``full``: the transformers model, every parameter trainable (here).
- ``freeze``: the transformers model, trainability by glob patterns over parameter names (here).
- ``lora`` (``lora.py``): ``peft.get_peft_model(model, LoraConfig(...))``.
- ``prompt`` and ``prefix`` (``prompt_learning.py``): ``get_peft_model`` with a prompt-learning config.
- any method but ``full``/``freeze``: ``modules_to_save`` keep a frozen ``.original_module.`` and
  gain a trainable copy under ``.modules_to_save.default.`` (``modules.py``, with the other naming
  rules every method shares).

Mirrors peft 0.21 (``peft_model.py``, ``tuners/tuners_utils.py``, ``tuners/lora/``,
``tuners/prefix_tuning/model.py``, ``tuners/prompt_tuning/model.py``, ``utils/other.py``); each
function names the code it mirrors, and ``tests/exact/test_peft_against_library.py`` checks the
result against the real library, name by name.
"""

from __future__ import annotations

import fnmatch
import re

from memfit.core.model import ModelShape, ParamSpec
from memfit.core.peft.lora import ALL_LINEAR, LORA_BIAS_MODES, lora_params
from memfit.core.peft.modules import TASK_TYPES
from memfit.core.peft.prompt_learning import prompt_learning_params
from memfit.core.peft.spec import PeftSpec
from memfit.core.peft.tuners import TUNERS, apply_tuner
from memfit.errors import MemfitError

PEFT_METHODS: tuple[str, ...] = ("full", "freeze", "lora", "prompt", "prefix", *TUNERS)
"""The methods ``apply_peft`` knows (the tuners of ``memfit.core.peft.tuners`` by their lower-case
``peft_type``)."""

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
    if spec.method in TUNERS:
        known = TUNERS[spec.method].keys
        unknown = [k for k, _ in spec.settings if k not in known]
        if unknown:
            raise MemfitError(f"{spec.method} has no setting {unknown[0]!r}")
    elif spec.settings:
        raise MemfitError(f"method {spec.method!r} takes no tuner settings ({spec.settings[0][0]!r})")
    if spec.method == "lora":
        if not 0 <= spec.lora_dropout < 1:
            raise MemfitError(f"lora_dropout must be in [0, 1), got {spec.lora_dropout}")
        if any(r <= 0 for _, r in spec.rank_pattern):
            raise MemfitError(f"rank_pattern ranks must be positive, got {dict(spec.rank_pattern)}")
        if spec.target_modules_pattern is not None and (spec.layers_to_transform or spec.layers_pattern):
            raise MemfitError("layers_to_transform / layers_pattern cannot be used when target_modules is a string "
                              "(LoraConfig raises)")
        if spec.layers_pattern and not spec.layers_to_transform:
            raise MemfitError("layers_pattern needs layers_to_transform (LoraConfig raises)")
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
        params = lora_params(shape, spec)
    elif spec.method in TUNERS:
        return apply_tuner(shape, spec).with_notes(spec.notes)
    else:
        params = prompt_learning_params(shape, spec)
    return shape.with_params(params).with_notes(spec.notes)


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


