"""Step 1 of reading a DeepSpeed config: ``"auto"`` filled as transformers' Trainer fills it (see the
package docstring)."""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from dataclasses import field

from memfit.core.lean_dataclass import dataclass
from memfit.errors import MemfitError

AUTO = "auto"
INT64_MAX = 2**63 - 1

AUTO_FLAGS: dict[str, str] = {
    "micro_batch_size": "--micro-batch",
    "gradient_accumulation_steps": "--grad-accum",
    "world_size": "--gpus",
    "precision": "--precision",
    "hidden_size": "--model",
    "learning_rate": "TrainingArguments.learning_rate",
    "adam_betas": "TrainingArguments.adam_beta1/adam_beta2",
    "adam_epsilon": "TrainingArguments.adam_epsilon",
    "weight_decay": "TrainingArguments.weight_decay",
    "warmup_steps": "TrainingArguments.warmup_steps",
    "total_steps": "the number of training steps",
    "max_grad_norm": "TrainingArguments.max_grad_norm",
}
"""Where each ``AutoContext`` field comes from, as error messages name it: the ``memfit plan`` flag
for the values that change memory (a test checks each is a real option), else the Trainer
argument (``memfit plan`` fills those with ``TRAINER_DEFAULTS``; Python callers pass them in
``AutoContext``)."""

TRAINER_DEFAULTS: dict[str, tuple[object, tuple[str, ...]]] = {
    "learning_rate": (5e-5, ("optimizer.params.lr", "scheduler.params.warmup_max_lr")),
    "adam_betas": ((0.9, 0.999), ("optimizer.params.betas",)),
    "adam_epsilon": (1e-8, ("optimizer.params.eps",)),
    "weight_decay": (0.0, ("optimizer.params.weight_decay",)),
    "warmup_steps": (0, ("scheduler.params.warmup_num_steps",)),
    "total_steps": (1, ("scheduler.params.total_num_steps",)),
    "max_grad_norm": (1.0, ("gradient_clipping",)),
}
"""transformers ``TrainingArguments`` defaults (5.24) for the "auto" keys memory does not depend on,
and the keys each fills; ``trainer_defaults`` supplies them only where the config says "auto"."""

_WHOLE = ("micro_batch_size", "gradient_accumulation_steps", "world_size", "total_steps", "hidden_size")
_REAL = ("learning_rate", "adam_epsilon", "weight_decay", "warmup_steps", "max_grad_norm")


@dataclass(frozen=True, slots=True, kw_only=True)
class AutoContext:
    """What transformers' Trainer knows when it fills ``"auto"``: its ``TrainingArguments``, the
    model's hidden size and the number of training steps. None means "not known"."""

    micro_batch_size: int | None = None
    """``per_device_train_batch_size``: fills ``train_micro_batch_size_per_gpu``."""
    gradient_accumulation_steps: int | None = None
    """Fills ``gradient_accumulation_steps``."""
    world_size: int | None = None
    """Data-parallel ranks: fills ``train_batch_size`` (with the two above) and checks the batch
    triple as DeepSpeed does."""
    learning_rate: float | None = None
    """Fills ``optimizer.params.lr`` and ``scheduler.params.warmup_max_lr``."""
    adam_betas: tuple[float, float] | None = None
    """``(adam_beta1, adam_beta2)``: fills ``optimizer.params.betas``."""
    adam_epsilon: float | None = None
    """Fills ``optimizer.params.eps``."""
    weight_decay: float | None = None
    """Fills ``optimizer.params.weight_decay``."""
    warmup_steps: float | None = None
    """As ``TrainingArguments.warmup_steps``: >= 1 a step count, below 1 a fraction of
    ``total_steps``; fills ``scheduler.params.warmup_num_steps`` with ``max(1, steps)``."""
    total_steps: int | None = None
    """``num_training_steps``: fills ``scheduler.params.total_num_steps``."""
    precision: str | None = None
    """``fp16``, ``bf16`` or ``fp32`` (the Trainer's ``--fp16``/``--bf16``): fills
    ``fp16.enabled`` and ``bf16.enabled``."""
    max_grad_norm: float | None = None
    """Fills ``gradient_clipping``."""
    hidden_size: int | None = None
    """The model's ``hidden_size``: fills ``reduce_bucket_size`` (h*h) and, for ZeRO-3,
    ``stage3_prefetch_bucket_size`` (int(0.9*h*h)) and ``stage3_param_persistence_threshold``
    (10*h)."""
    name: str = field(default="DeepSpeed config", compare=False)
    """How error messages name the config (its file, when it has one)."""
    sources: Mapping[str, str] = field(default_factory=dict, compare=False)
    """Why a field has its value, by field name, for the findings that list every "auto" resolved
    (e.g. ``"the Trainer's default"``); a field without an entry came from ``AUTO_FLAGS``' source."""

    def __post_init__(self) -> None:
        for name in _WHOLE:
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise MemfitError(f"{AUTO_FLAGS[name]} must be a whole number >= 1, got {value!r}")
        for name in _REAL:
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not math.isfinite(value) or value < 0):
                raise MemfitError(f"{AUTO_FLAGS[name]} must be a finite number >= 0, got {value!r}")
        if self.precision is not None and self.precision not in ("fp16", "bf16", "fp32"):
            raise MemfitError(f"--precision must be fp16, bf16 or fp32, got {self.precision!r}")
        if self.adam_betas is not None and (
                not isinstance(self.adam_betas, (tuple, list)) or len(self.adam_betas) != 2
                or not all(isinstance(b, (int, float)) and not isinstance(b, bool) and math.isfinite(b)
                           for b in self.adam_betas)):
            raise MemfitError(f"{AUTO_FLAGS['adam_betas']} needs two finite numbers, got {self.adam_betas!r}")
        if not isinstance(self.sources, Mapping):
            raise MemfitError(f"AutoContext.sources must be a mapping, got {self.sources!r}")

    def why(self, name: str) -> str:
        """Where the value of field ``name`` came from, in words."""
        return self.sources.get(name) or AUTO_FLAGS[name]


def trainer_defaults(raw: Mapping, *, precision: str, precision_why: str) -> tuple[dict[str, object], dict[str, str]]:
    """``AutoContext`` keyword arguments for the "auto" keys of ``raw`` that memory does not
    depend on (``TRAINER_DEFAULTS``) and for ``fp16/bf16.enabled`` ("auto" there: ``precision``),
    with their sources; a value is supplied only where the config says "auto", so a written value
    is never contradicted."""
    def get(dotted: str) -> object:
        node: object = raw
        for part in dotted.split("."):
            node = node.get(part) if isinstance(node, Mapping) else None
        return node

    fills: dict[str, object] = {}
    sources: dict[str, str] = {}
    for name, (value, keys) in TRAINER_DEFAULTS.items():
        if any(get(k) == AUTO for k in keys):
            fills[name] = value
            sources[name] = "transformers' TrainingArguments default (it does not change memory)"
    if get("fp16.enabled") == AUTO or get("bf16.enabled") == AUTO:
        written = [name for name in ("fp16", "bf16") if get(f"{name}.enabled") is True]
        if written:  # "auto" in one section, true written in the other: the written one is the precision
            fills["precision"], sources["precision"] = written[0], f"the config's {written[0]}.enabled: true"
        else:
            fills["precision"], sources["precision"] = precision, precision_why
    return fills, sources


def _is_number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _is_whole(v: object) -> bool:
    """A JSON number that is a finite whole number >= 1 (DeepSpeed's batch sizes)."""
    return _is_number(v) and math.isfinite(v) and v == int(v) and v >= 1  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------
# Step 1: "auto", as transformers' Trainer fills it
# --------------------------------------------------------------------------------------------

_PYDANTIC_SECTIONS = (("zero_optimization",), ("zero_optimization", "offload_param"),
                      ("zero_optimization", "offload_optimizer"), ("fp16",), ("bf16",), ("bfloat16",))
"""Sections DeepSpeed reads through ``DeepSpeedConfigModel``, which drops ``"auto"`` values
(``__init__``: ``data = {k: v for k, v in data.items() if v != "auto"}``)."""


class _Filler:
    """``HfTrainerDeepSpeedConfig.fill_match`` / ``fill_only`` over a copy of the config."""

    def __init__(self, config: dict) -> None:
        self.config = config
        self.mismatches: list[str] = []
        self.resolved: list[str] = []
        """One line per "auto" replaced: the key, its value and why."""

    def _node(self, key: str) -> tuple[dict | None, str]:
        # accelerate/utils/deepspeed.py: HfDeepSpeedConfig.find_config_node
        *path, leaf = key.split(".")
        node: object = self.config
        for part in path:
            node = node.get(part) if isinstance(node, dict) else None
            if node is None:
                return None, leaf
        return (node if isinstance(node, dict) else None), leaf

    def is_auto(self, key: str) -> bool:
        node, leaf = self._node(key)
        return node is not None and node.get(leaf) == AUTO

    def get(self, key: str) -> object:
        node, leaf = self._node(key)
        return None if node is None else node.get(leaf)

    def fill(self, key: str, value: object, flag: str, *, must_match: bool = True, why: str = "",
             who: str | None = None) -> None:
        node, leaf = self._node(key)
        if node is None:
            return
        if node.get(leaf) == AUTO:
            if value is None:
                how = f"pass {flag}" if flag.startswith("--") else f"give {flag}"
                raise MemfitError(f'DeepSpeed config {key} is "auto": {how} (transformers\' Trainer '
                                  f"fills it from its arguments), or write a value in the config")
            node[leaf] = value
            self.resolved.append(f"{key} = {value!r} ({why or flag})")
            return
        if must_match and value is not None and node.get(leaf) is not None and node[leaf] != value:
            self.mismatches.append(f"{key}={node[leaf]!r} vs {who or flag} {value!r}")


def resolve_auto(raw: Mapping, context: AutoContext | None = None) -> dict:
    """``resolve_auto_record`` without the record."""
    return resolve_auto_record(raw, context)[0]


def resolve_auto_record(raw: Mapping, context: AutoContext | None = None) -> tuple[dict, tuple[str, ...]]:
    """A deep copy of ``raw`` with ``"auto"`` replaced as transformers' Trainer replaces it.

    ``trainer_config_process`` (at ``TrainingArguments`` creation) fills
    ``train_micro_batch_size_per_gpu``, ``gradient_accumulation_steps``, ``train_batch_size``
    (world x micro x accumulation), ``gradient_clipping``, ``optimizer.params.{lr, betas, eps,
    weight_decay}``, ``scheduler.params.warmup_min_lr`` (0) and ``warmup_max_lr``,
    ``fp16.enabled``, ``bf16.enabled``; ``trainer_config_finalize`` (in ``deepspeed_init``) fills
    ``zero_optimization.reduce_bucket_size`` = h*h and, for ZeRO-3 only,
    ``zero_optimization.stage3_prefetch_bucket_size`` = int(0.9*h*h) and
    ``zero_optimization.stage3_param_persistence_threshold`` = 10*h (h = the model's hidden size;
    the unprefixed aliases are not filled), ``scheduler.params.total_num_steps`` and
    ``scheduler.params.warmup_num_steps`` = max(1, warmup steps).

    Any ``"auto"`` left inside a section DeepSpeed reads through pydantic is removed (DeepSpeed
    drops it and uses its default, so the result is the same); one left anywhere memfit reads
    (top-level sizes, ``optimizer``, ``scheduler``, ``data_types``, ``communication_data_type``) is
    an error, since DeepSpeed would fail on it.

    The record says, one line per "auto", what replaced it and why (for a finding).
    """
    ctx = context or AutoContext()
    cfg = copy.deepcopy(dict(raw))
    f = _Filler(cfg)
    flag = AUTO_FLAGS

    # trainer_config_process
    f.fill("train_micro_batch_size_per_gpu", ctx.micro_batch_size, flag["micro_batch_size"],
           why=ctx.why("micro_batch_size"), who=ctx.sources.get("micro_batch_size"))
    f.fill("gradient_accumulation_steps", ctx.gradient_accumulation_steps, flag["gradient_accumulation_steps"],
           why=ctx.why("gradient_accumulation_steps"), who=ctx.sources.get("gradient_accumulation_steps"))
    if f.is_auto("train_batch_size"):
        f.fill("train_batch_size", _trainer_train_batch_size(f, ctx), _train_batch_flag(f, ctx),
               why="world size x micro batch x accumulation, as the Trainer computes it")
    elif None not in (ctx.world_size, ctx.micro_batch_size, ctx.gradient_accumulation_steps):
        f.fill("train_batch_size", ctx.world_size * ctx.micro_batch_size * ctx.gradient_accumulation_steps,
               "world x micro x accumulation")
    f.fill("gradient_clipping", ctx.max_grad_norm, flag["max_grad_norm"], why=ctx.why("max_grad_norm"),
           who=ctx.sources.get("max_grad_norm"))
    f.fill("optimizer.params.lr", ctx.learning_rate, flag["learning_rate"], why=ctx.why("learning_rate"))
    f.fill("optimizer.params.betas", None if ctx.adam_betas is None else list(ctx.adam_betas),
           flag["adam_betas"], why=ctx.why("adam_betas"))
    f.fill("optimizer.params.eps", ctx.adam_epsilon, flag["adam_epsilon"], why=ctx.why("adam_epsilon"))
    f.fill("optimizer.params.weight_decay", ctx.weight_decay, flag["weight_decay"], why=ctx.why("weight_decay"),
           who=ctx.sources.get("weight_decay"))
    f.fill("scheduler.params.warmup_min_lr", 0, "", must_match=False, why="the Trainer always writes 0")
    f.fill("scheduler.params.warmup_max_lr", ctx.learning_rate, flag["learning_rate"], why=ctx.why("learning_rate"))
    precision = ctx.precision
    said = f"{ctx.sources.get('precision') or flag['precision']} {precision}, i.e."
    f.fill("fp16.enabled", None if precision is None else precision == "fp16", said if precision else flag["precision"],
           why=f"precision {precision}: {ctx.why('precision')}")
    f.fill("bf16.enabled", None if precision is None else precision == "bf16", said if precision else flag["precision"],
           why=f"precision {precision}: {ctx.why('precision')}")

    # trainer_config_finalize
    hidden_keys = ("zero_optimization.reduce_bucket_size", "zero_optimization.stage3_prefetch_bucket_size",
                   "zero_optimization.stage3_param_persistence_threshold")
    auto_hidden = [k for k in hidden_keys if f.is_auto(k)]
    if auto_hidden:
        h = ctx.hidden_size
        if h is None:
            raise MemfitError(f'DeepSpeed config {", ".join(auto_hidden)} is "auto": it is sized from the '
                              f"model's hidden_size; pass {flag['hidden_size']} or write a number")
        f.fill("zero_optimization.reduce_bucket_size", h * h, "", must_match=False,
               why=f"hidden_size x hidden_size = {h} x {h}, as the Trainer sizes it")
        if f.get("zero_optimization.stage") == 3:  # HfDeepSpeedConfig.is_zero3
            f.fill("zero_optimization.stage3_prefetch_bucket_size", int(0.9 * h * h), "", must_match=False,
                   why=f"int(0.9 x {h} x {h}), as the Trainer sizes it")
            f.fill("zero_optimization.stage3_param_persistence_threshold", 10 * h, "", must_match=False,
                   why=f"10 x hidden_size {h}, as the Trainer sizes it")
    f.fill("scheduler.params.total_num_steps", ctx.total_steps, flag["total_steps"], why=ctx.why("total_steps"))
    f.fill("scheduler.params.warmup_num_steps", _trainer_warmup_steps(f, ctx), _warmup_flag(ctx),
           why=ctx.why("warmup_steps"))

    if f.mismatches:
        raise MemfitError(f"{ctx.name} disagrees with the training arguments (transformers' Trainer "
                          f"refuses this): {'; '.join(f.mismatches)}; set these config values to \"auto\"")

    for path in _PYDANTIC_SECTIONS:
        node = f.get(".".join(path)) if len(path) > 1 else cfg.get(path[0])
        if isinstance(node, dict):
            for key in [k for k, v in node.items() if v == AUTO and not (path == ("zero_optimization",)
                                                                            and k == "stage")]:
                del node[key]
                f.resolved.append(f"{'.'.join(path)}.{key}: left to DeepSpeed's default (DeepSpeedConfigModel drops "
                                  '"auto" and the Trainer does not fill it)')
    _reject_leftover_auto(cfg)
    return cfg, tuple(f.resolved)


def _trainer_train_batch_size(f: _Filler, ctx: AutoContext) -> int | None:
    """``args.world_size * args.per_device_train_batch_size * args.gradient_accumulation_steps``;
    a micro batch or accumulation the context lacks is taken from the config when it is written
    there (the Trainer's own value must equal it, or it refuses the config)."""
    micro = ctx.micro_batch_size if ctx.micro_batch_size is not None else f.get("train_micro_batch_size_per_gpu")
    accum = (ctx.gradient_accumulation_steps if ctx.gradient_accumulation_steps is not None
             else f.get("gradient_accumulation_steps"))
    if ctx.world_size is None or not _is_whole(micro) or not _is_whole(accum):
        return None
    return ctx.world_size * int(micro) * int(accum)


def _train_batch_flag(f: _Filler, ctx: AutoContext) -> str:
    missing = [AUTO_FLAGS["world_size"]] if ctx.world_size is None else []
    if ctx.micro_batch_size is None and not _is_whole(f.get("train_micro_batch_size_per_gpu")):
        missing.append(AUTO_FLAGS["micro_batch_size"])
    if ctx.gradient_accumulation_steps is None and not _is_whole(f.get("gradient_accumulation_steps")):
        missing.append(AUTO_FLAGS["gradient_accumulation_steps"])
    if missing:
        return " and ".join(missing)
    return "whole numbers >= 1 for train_micro_batch_size_per_gpu and gradient_accumulation_steps"


def _trainer_warmup_steps(f: _Filler, ctx: AutoContext) -> int | None:
    """``max(1, args.get_warmup_steps(num_training_steps))`` (transformers ``training_args.py``:
    ``int(warmup_steps)`` if >= 1, else ``ceil(num_training_steps * warmup_steps)``)."""
    w = ctx.warmup_steps
    if w is None:
        return None
    if w == 0:  # max(1, ceil(steps x 0)) whatever the number of steps
        return 1
    if w >= 1:
        return max(1, int(w))
    total = ctx.total_steps  # the Trainer always knows it; without it, the config's own figure
    written = f.get("scheduler.params.total_num_steps") if f is not None else None
    if total is None and _is_whole(written):
        total = int(written)  # type: ignore[arg-type]
    if total is None:
        return None
    return max(1, math.ceil(total * w))


def _warmup_flag(ctx: AutoContext) -> str:
    if ctx.warmup_steps is not None and ctx.warmup_steps < 1 and ctx.total_steps is None:
        return f"{AUTO_FLAGS['total_steps']} (the warmup is a fraction of it)"
    return AUTO_FLAGS["warmup_steps"]


def _reject_leftover_auto(cfg: dict) -> None:
    for key in ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
                "gradient_clipping", "communication_data_type"):
        if cfg.get(key) == AUTO:  # the batch keys and clipping are filled above; this catches the rest
            raise MemfitError(f'DeepSpeed config {key} is "auto", which nothing fills; write a value')
    for section in ("optimizer", "scheduler"):
        params = cfg.get(section, {}).get("params") if isinstance(cfg.get(section), dict) else None
        if isinstance(params, dict):
            for key, value in params.items():
                if value == AUTO:
                    raise MemfitError(f'DeepSpeed config {section}.params.{key} is "auto", which transformers\' '
                                      "Trainer does not fill (DeepSpeed would pass the string on); write a value")
    data_types = cfg.get("data_types")
    if isinstance(data_types, dict):
        for key in ("grad_accum_dtype", "param_dtype", "buffer_dtype"):
            if data_types.get(key) == AUTO:
                raise MemfitError(f'DeepSpeed config data_types.{key} is "auto", which nothing fills; '
                                  "write fp16, bf16 or fp32")
