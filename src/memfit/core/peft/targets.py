"""Which modules a tuner adapts: peft's target matching, shared by every tuner that injects layers.

Mirrors peft 0.21 ``tuners/tuners_utils.py``: ``BaseTuner.inject_adapter`` walks ``named_modules()``
and adapts each module ``check_target_module_exists`` accepts:

- ``exclude_modules`` first (a list: the name or a ``.``-suffix; a string: ``re.fullmatch``), then
  the ``modules_to_save`` modules (``(^|.*\\.){m}($|\\..*)``), never targets;
- ``target_modules`` as a string: ``re.fullmatch`` (``utils/other.py:match_target_against_key``),
  ``all-linear`` expanded first by ``_maybe_include_all_linear_layers`` (every Linear/Conv1D but
  the output head); as a list: the name itself, or any name ending with ``.<entry>``, and then,
  for suffix matches only, ``layers_to_transform`` / ``layers_pattern`` (the first numbered
  segment of the name, ``.*?\\.[^.]*\\.(\\d+)\\.`` or ``(?:^|.*?\\.){pattern}\\.(\\d+)\\.``);
- no ``target_modules``: the tuner's default for the ``model_type`` (its
  ``TRANSFORMERS_MODELS_TO_<TUNER>_TARGET_MODULES_MAPPING``; no entry is an error in peft).

A module is a *layer* here when it owns parameters directly; its kind (``linear``, ``conv1d``,
``embedding``, ``norm`` or ``other``) is read from its name and parameters (``modules.layer_kind``):
``ModelShape`` carries no classes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from memfit.core.lean_dataclass import dataclass
from memfit.core.model import ModelShape, ParamSpec
from memfit.core.peft.modules import (
    OUTPUT_HEAD_NAMES,
    SEQ_CLS_HEAD_NAMES,
    TASK_MODULES_TO_SAVE,
    layer_kind,
    module_names,
    own_params,
    task_type,
)
from memfit.core.peft.spec import PeftSpec
from memfit.errors import MemfitError

ALL_LINEAR = "all-linear"
"""peft's ``INCLUDE_LINEAR_LAYERS_SHORTHAND``: every Linear/Conv1D layer but the output head."""

_FIRST_INDEX = re.compile(r".*?\.[^.]*\.(?P<idx>\d+)\.")


@dataclass(frozen=True, slots=True)
class Layer:
    """One module a tuner adapts, as its ``base_layer`` holds it."""

    module: str
    """Dotted module name in the transformers model (``model.layers.0.self_attn.q_proj``)."""
    kind: str
    """``linear`` (``nn.Linear``), ``conv1d`` (transformers' ``Conv1D``, weight ``(in, out)``),
    ``embedding``, ``norm`` (a 1-D weight: LayerNorm/RMSNorm) or ``other``."""
    in_features: int
    """Linear/Conv1D: input width; Embedding: rows (vocabulary); norm: width."""
    out_features: int
    """Linear/Conv1D: output width; Embedding: embedding width; norm: width."""
    params: tuple[ParamSpec, ...]
    """The module's own parameters (``weight``, maybe ``bias``), in order."""

    @property
    def has_bias(self) -> bool:
        return any(p.name.endswith(".bias") for p in self.params)

    @property
    def leaf(self) -> str:
        return self.module.rsplit(".", 1)[-1]


def module_kind(model_type: str, module: str, own: Mapping[str, ParamSpec]) -> str:
    """``layer_kind`` extended with ``norm`` (a 1-D ``weight``) and ``other``."""
    kind = layer_kind(model_type, module, own)
    if kind is not None:
        return kind
    weight = own.get("weight")
    if weight is not None and len(weight.shape) == 1 and not set(own) - {"weight", "bias"}:
        return "norm"
    return "other"


def make_layer(model_type: str, module: str, own: Mapping[str, ParamSpec]) -> Layer:
    kind = module_kind(model_type, module, own)
    weight = own.get("weight")
    shape = weight.shape if weight is not None else ()
    if kind == "linear":
        out_f, in_f = shape
    elif kind == "conv1d":
        in_f, out_f = shape
    elif kind == "embedding":
        in_f, out_f = shape
    elif kind == "norm":
        in_f = out_f = shape[0]
    else:
        in_f = out_f = 0
    return Layer(module=module, kind=kind, in_features=in_f, out_features=out_f, params=tuple(own.values()))


def saved_modules(shape: ModelShape, spec: PeftSpec) -> tuple[str, ...]:
    """The ``modules_to_save`` names peft's config holds when it injects (the task's heads are added
    to it by ``PeftModelFor<task>``, except question answering's, added after injection)."""
    task = task_type(shape, spec)
    extra = TASK_MODULES_TO_SAVE.get(task, ()) if task != "QUESTION_ANS" else ()
    return (*spec.modules_to_save, *extra)


def all_linear_layers(shape: ModelShape, own: Mapping[str, Mapping[str, ParamSpec]], modules: list[str],
                      task: str) -> tuple[str, ...]:
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


_KIND_NAMES = {"linear": "Linear", "conv1d": "Conv1D", "embedding": "Embedding", "norm": "LayerNorm/RMSNorm",
               "other": "other"}


def _kinds_text(kinds: frozenset[str]) -> str:
    shown = [_KIND_NAMES[k] for k in ("linear", "conv1d", "embedding", "norm", "other") if k in kinds]
    return ", ".join(shown[:-1]) + " or " + shown[-1] if len(shown) > 1 else shown[0]


def _excluded(module: str, spec: PeftSpec, saved: Iterable[str]) -> bool:
    if spec.exclude_pattern is not None and re.fullmatch(spec.exclude_pattern, module):
        return True
    if module in spec.exclude_modules or any(module.endswith("." + e) for e in spec.exclude_modules):
        return True
    return any(re.match(rf"(^|.*\.){m}($|\..*)", module) for m in saved)


def _in_layers(module: str, spec: PeftSpec) -> bool:
    if not spec.layers_to_transform:
        return True
    match = None
    if not spec.layers_pattern:
        match = _FIRST_INDEX.match(module + ".")
    else:
        for pattern in spec.layers_pattern:
            match = re.match(rf"(?:^|.*?\.){pattern}\.(?P<idx>\d+)\.", module + ".")
            if match is not None:
                break
    return match is not None and int(match.group("idx")) in spec.layers_to_transform


def find_targets(
    shape: ModelShape,
    spec: PeftSpec,
    *,
    what: str,
    defaults: Mapping[str, tuple[str, ...] | str],
    kinds: frozenset[str],
    names: tuple[str, ...] | None = None,
    pattern: str | None = None,
    allow_empty: bool = False,
) -> tuple[Layer, ...]:
    """The layers a tuner called ``what`` adapts, in ``named_modules()`` order (see module doc).

    ``names``/``pattern`` default to ``spec.target_modules``/``spec.target_modules_pattern``; with
    neither, ``defaults[model_type]``. A matched module whose kind is not in ``kinds`` is refused,
    as peft refuses it (``_create_new_module``: "Target module ... is not supported").
    """
    arch = shape.arch
    own = own_params(shape.params)
    modules = module_names(shape.params)
    task = task_type(shape, spec)
    saved = saved_modules(shape, spec)
    names = spec.target_modules if names is None else names
    pattern = spec.target_modules_pattern if pattern is None else pattern
    if not names and pattern is None:
        default = defaults.get(arch.model_type)
        if default is None:
            raise MemfitError(f"peft has no default {what} target modules for model type {arch.model_type!r};"
                              " give target_modules")
        if isinstance(default, str):
            pattern = default
        else:
            names = default
    by_suffix = pattern is None
    if pattern is not None and pattern.lower() == ALL_LINEAR:
        names, pattern = all_linear_layers(shape, own, modules, task), None
        by_suffix = False
    targets: list[Layer] = []
    for module in modules:
        if _excluded(module, spec, saved):
            continue
        if pattern is not None:
            hit = re.fullmatch(pattern, module) is not None
        elif module in names:
            hit = True
        else:
            hit = any(module.endswith("." + n) for n in names) and (not by_suffix or _in_layers(module, spec))
        if not hit:
            continue
        layer = make_layer(arch.model_type, module, own.get(module, {}))
        if layer.kind not in kinds:
            raise MemfitError(f"{what} target {module!r} is not a {_kinds_text(kinds)} layer; peft cannot adapt it")
        targets.append(layer)
    if not targets and not allow_empty:
        wanted = pattern if pattern is not None else ", ".join(names)
        raise MemfitError(f"{what} target modules ({wanted}) match no layer of {shape.name}")
    return tuple(targets)
