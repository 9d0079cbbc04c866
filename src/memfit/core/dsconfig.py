"""Read a user's DeepSpeed JSON into ``DeepSpeedSettings``, the way DeepSpeed 0.19.8 reads it.

Three steps, each mirroring the code that does it for real:

1. ``"auto"`` values are filled as transformers' Trainer fills them (transformers 5.24,
   ``transformers/integrations/deepspeed.py``: ``HfTrainerDeepSpeedConfig.trainer_config_process``
   and ``trainer_config_finalize``), from an ``AutoContext``; a value the Trainer would have to
   invent (or refuse) is a ``MemfitError`` naming the key and the memfit flag that supplies it.
   Where the Trainer finds a written value that disagrees with its own arguments it refuses to start
   ("Please correct the following DeepSpeed config values that mismatch TrainingArguments"); so
   does memfit, for the context values given.
2. Every section DeepSpeed reads through a pydantic model (``zero_optimization`` and its
   ``offload_*`` sections, ``fp16``, ``bf16``) is checked like ``DeepSpeedConfigModel`` checks it
   (``runtime/config_utils.py``): unknown keys are errors (``extra="forbid"``), an ``"auto"`` left
   over is dropped so DeepSpeed's default applies, ZeRO-3 keys are accepted with or without their
   ``stage3_`` prefix but not both, deprecated keys are mapped to their replacements, and the field
   constraints (``gt=0``, ``ge=0``, ...) and cross-field validators are enforced. The field tables
   below are checked against DeepSpeed's own models in the tests.
3. The batch triple is completed and checked as ``DeepSpeedConfig._set_batch_related_parameters``
   and ``_batch_assertion`` do (``runtime/config.py``), with the world size from the context.

memfit is stricter than DeepSpeed in a few places, each a clear error instead of a late crash or a
silent coercion: values must have their JSON type (pydantic turns ``"3"`` into 3 and ``"yes"`` into
True; memfit does not), ``zero_optimization.stage`` cannot be ``"auto"`` (DeepSpeed alone reads 0,
accelerate fills 2), NVMe offload needs ``nvme_path``, ``gradient_clipping`` cannot be negative,
and optimizers whose memory memfit does not model are refused. Pure Python: no pydantic, no
deepspeed.
"""

from __future__ import annotations

import copy
import difflib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path

from memfit.core.ds_settings import (
    Bf16Settings,
    DeepSpeedSettings,
    Fp16Settings,
    OffloadSettings,
    OptimizerSettings,
    ZeroSettings,
)
from memfit.errors import MemfitError

AUTO = "auto"
INT64_MAX = 2**63 - 1

AUTO_FLAGS: dict[str, str] = {
    "micro_batch_size": "--micro-batch",
    "gradient_accumulation_steps": "--grad-accum",
    "world_size": "--gpus",
    "learning_rate": "--lr",
    "adam_betas": "--adam-betas",
    "adam_epsilon": "--adam-eps",
    "weight_decay": "--weight-decay",
    "warmup_steps": "--warmup-steps",
    "total_steps": "--total-steps",
    "precision": "--precision",
    "max_grad_norm": "--max-grad-norm",
    "hidden_size": "--model",
}
"""The memfit flag that supplies each ``AutoContext`` field (named in error messages)."""


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

    def __post_init__(self) -> None:
        for name in ("micro_batch_size", "gradient_accumulation_steps", "world_size", "total_steps",
                     "hidden_size"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise MemfitError(f"{AUTO_FLAGS[name]} must be a whole number >= 1, got {value!r}")
        if self.precision is not None and self.precision not in ("fp16", "bf16", "fp32"):
            raise MemfitError(f"--precision must be fp16, bf16 or fp32, got {self.precision!r}")
        if self.warmup_steps is not None and self.warmup_steps < 0:
            raise MemfitError(f"--warmup-steps must be >= 0, got {self.warmup_steps!r}")
        if self.adam_betas is not None and len(self.adam_betas) != 2:
            raise MemfitError(f"--adam-betas needs two numbers, got {self.adam_betas!r}")


# --------------------------------------------------------------------------------------------
# Entry points
# --------------------------------------------------------------------------------------------


def load_deepspeed_config(path: str | Path, *, context: AutoContext | None = None
                          ) -> tuple[DeepSpeedSettings, dict]:
    """Read a DeepSpeed JSON file: the typed settings and the JSON with ``"auto"`` resolved (what
    a replay hands to ``deepspeed.initialize(config=...)``).

    Duplicate keys are refused, as DeepSpeed's ``dict_raise_error_on_duplicate_keys`` does. Only
    strict JSON is read (DeepSpeed also takes hjson; transformers and accelerate take JSON only).
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise MemfitError(f"cannot read DeepSpeed config {str(p)!r}: {e.strerror or e}") from None
    try:
        raw = json.loads(text, object_pairs_hook=_reject_duplicate_keys)
    except json.JSONDecodeError as e:
        raise MemfitError(f"DeepSpeed config {str(p)!r} is not valid JSON: {e.msg} at line {e.lineno} "
                          f"column {e.colno}") from None
    if not isinstance(raw, dict):
        raise MemfitError(f"DeepSpeed config {str(p)!r} must be a JSON object, got {type(raw).__name__}")
    resolved = resolve_auto(raw, context)
    return _parse_resolved(resolved, context), resolved


def parse_deepspeed_config(raw: Mapping, *, context: AutoContext | None = None) -> DeepSpeedSettings:
    """Typed settings from a DeepSpeed config dict (``"auto"`` filled from ``context``). The input
    is not modified."""
    if not isinstance(raw, Mapping):
        raise MemfitError(f"a DeepSpeed config must be a JSON object, got {type(raw).__name__}")
    return _parse_resolved(resolve_auto(raw, context), context)


def _reject_duplicate_keys(pairs: list[tuple[str, object]]) -> dict:
    d = dict(pairs)
    if len(d) != len(pairs):
        seen: set[str] = set()
        dup = sorted({k for k, _ in pairs if k in seen or seen.add(k)})
        raise MemfitError(f"duplicate keys in DeepSpeed config: {', '.join(dup)} (DeepSpeed refuses them too)")
    return d


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

    def fill(self, key: str, value: object, flag: str, *, must_match: bool = True) -> None:
        node, leaf = self._node(key)
        if node is None:
            return
        if node.get(leaf) == AUTO:
            if value is None:
                raise MemfitError(f'DeepSpeed config {key} is "auto": pass {flag} (transformers\' Trainer '
                                  f"fills it from its arguments), or write a value in the config")
            node[leaf] = value
            return
        if must_match and value is not None and node.get(leaf) is not None and node[leaf] != value:
            self.mismatches.append(f"{key}={node[leaf]!r} vs {flag} {value!r}")


def resolve_auto(raw: Mapping, context: AutoContext | None = None) -> dict:
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
    """
    ctx = context or AutoContext()
    cfg = copy.deepcopy(dict(raw))
    f = _Filler(cfg)
    flag = AUTO_FLAGS

    # trainer_config_process
    f.fill("train_micro_batch_size_per_gpu", ctx.micro_batch_size, flag["micro_batch_size"])
    f.fill("gradient_accumulation_steps", ctx.gradient_accumulation_steps, flag["gradient_accumulation_steps"])
    if f.is_auto("train_batch_size"):
        f.fill("train_batch_size", _trainer_train_batch_size(f, ctx), _train_batch_flag(f, ctx))
    elif None not in (ctx.world_size, ctx.micro_batch_size, ctx.gradient_accumulation_steps):
        f.fill("train_batch_size", ctx.world_size * ctx.micro_batch_size * ctx.gradient_accumulation_steps,
               "world x micro x accumulation")
    f.fill("gradient_clipping", ctx.max_grad_norm, flag["max_grad_norm"])
    f.fill("optimizer.params.lr", ctx.learning_rate, flag["learning_rate"])
    f.fill("optimizer.params.betas", None if ctx.adam_betas is None else list(ctx.adam_betas),
           flag["adam_betas"])
    f.fill("optimizer.params.eps", ctx.adam_epsilon, flag["adam_epsilon"])
    f.fill("optimizer.params.weight_decay", ctx.weight_decay, flag["weight_decay"])
    f.fill("scheduler.params.warmup_min_lr", 0, "", must_match=False)
    f.fill("scheduler.params.warmup_max_lr", ctx.learning_rate, flag["learning_rate"])
    precision = ctx.precision
    said = f"{flag['precision']} {precision}, i.e."
    f.fill("fp16.enabled", None if precision is None else precision == "fp16", said if precision else flag["precision"])
    f.fill("bf16.enabled", None if precision is None else precision == "bf16", said if precision else flag["precision"])

    # trainer_config_finalize
    hidden_keys = ("zero_optimization.reduce_bucket_size", "zero_optimization.stage3_prefetch_bucket_size",
                   "zero_optimization.stage3_param_persistence_threshold")
    auto_hidden = [k for k in hidden_keys if f.is_auto(k)]
    if auto_hidden:
        h = ctx.hidden_size
        if h is None:
            raise MemfitError(f'DeepSpeed config {", ".join(auto_hidden)} is "auto": it is sized from the '
                              f"model's hidden_size; pass {flag['hidden_size']} or write a number")
        f.fill("zero_optimization.reduce_bucket_size", h * h, "", must_match=False)
        if f.get("zero_optimization.stage") == 3:  # HfDeepSpeedConfig.is_zero3
            f.fill("zero_optimization.stage3_prefetch_bucket_size", int(0.9 * h * h), "", must_match=False)
            f.fill("zero_optimization.stage3_param_persistence_threshold", 10 * h, "", must_match=False)
    f.fill("scheduler.params.total_num_steps", ctx.total_steps, flag["total_steps"])
    f.fill("scheduler.params.warmup_num_steps", _trainer_warmup_steps(f, ctx), _warmup_flag(ctx))

    if f.mismatches:
        raise MemfitError("DeepSpeed config disagrees with the training arguments (transformers' Trainer "
                          f"refuses this): {'; '.join(f.mismatches)}; set these config values to \"auto\"")

    for path in _PYDANTIC_SECTIONS:
        node = f.get(".".join(path)) if len(path) > 1 else cfg.get(path[0])
        if isinstance(node, dict):
            for key in [k for k, v in node.items() if v == AUTO and not (path == ("zero_optimization",)
                                                                            and k == "stage")]:
                del node[key]
    _reject_leftover_auto(cfg)
    return cfg


def _trainer_train_batch_size(f: _Filler, ctx: AutoContext) -> int | None:
    """``args.world_size * args.per_device_train_batch_size * args.gradient_accumulation_steps``;
    a micro batch or accumulation the context lacks is taken from the config when it is written
    there (the Trainer's own value must equal it, or it refuses the config)."""
    micro = ctx.micro_batch_size if ctx.micro_batch_size is not None else f.get("train_micro_batch_size_per_gpu")
    accum = (ctx.gradient_accumulation_steps if ctx.gradient_accumulation_steps is not None
             else f.get("gradient_accumulation_steps"))
    if ctx.world_size is None or not _is_number(micro) or not _is_number(accum):
        return None
    return ctx.world_size * int(micro) * int(accum)


def _train_batch_flag(f: _Filler, ctx: AutoContext) -> str:
    missing = [AUTO_FLAGS["world_size"]] if ctx.world_size is None else []
    if ctx.micro_batch_size is None and not _is_number(f.get("train_micro_batch_size_per_gpu")):
        missing.append(AUTO_FLAGS["micro_batch_size"])
    if ctx.gradient_accumulation_steps is None and not _is_number(f.get("gradient_accumulation_steps")):
        missing.append(AUTO_FLAGS["gradient_accumulation_steps"])
    return " and ".join(missing) if missing else "world x micro x accumulation"


def _trainer_warmup_steps(f: _Filler, ctx: AutoContext) -> int | None:
    """``max(1, args.get_warmup_steps(num_training_steps))`` (transformers ``training_args.py``:
    ``int(warmup_steps)`` if >= 1, else ``ceil(num_training_steps * warmup_steps)``)."""
    w = ctx.warmup_steps
    if w is None:
        return None
    if w >= 1:
        return max(1, int(w))
    if ctx.total_steps is None:
        return None
    return max(1, math.ceil(ctx.total_steps * w))


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


# --------------------------------------------------------------------------------------------
# Step 2: the pydantic sections, as DeepSpeedConfigModel reads them
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DsField:
    """One field of a DeepSpeed pydantic config model, as memfit checks it."""

    name: str
    """The model's field name."""
    kind: str
    """``bool``, ``int``, ``float``, ``stage``, ``device``, ``path``, ``section`` (a nested model
    memfit reads) or ``opaque`` (a nested model memfit does not read)."""
    default: object
    """DeepSpeed 0.19.8's default."""
    alias: str | None = None
    """The JSON name DeepSpeed also accepts (ZeRO-3's ``stage3_`` names)."""
    gt: float | None = None
    """``Field(gt=...)``."""
    ge: float | None = None
    """``Field(ge=...)``."""
    le: float | None = None
    """``Field(le=...)``."""
    nullable: bool = False
    """``Optional[...]``: JSON null allowed."""


B, I, F = "bool", "int", "float"

ZERO_FIELDS: tuple[DsField, ...] = (
    DsField("stage", "stage", 0),
    DsField("contiguous_gradients", B, True),
    DsField("reduce_scatter", B, True),
    DsField("reduce_bucket_size", I, 500_000_000, gt=0),
    DsField("use_multi_rank_bucket_allreduce", B, True),
    DsField("allgather_partitions", B, True),
    DsField("allgather_bucket_size", I, 500_000_000, ge=0),
    DsField("overlap_comm", B, None, nullable=True),
    DsField("compute_grad_norm", B, True),
    DsField("load_from_fp32_weights", B, True),
    DsField("elastic_checkpoint", B, False),
    DsField("offload_param", "section", None, nullable=True),
    DsField("offload_optimizer", "section", None, nullable=True),
    DsField("zenflow", "opaque", None, nullable=True),
    DsField("sub_group_size", I, 1_000_000_000, ge=0),
    DsField("cpu_offload_param", B, None, nullable=True),
    DsField("cpu_offload_use_pin_memory", B, None, nullable=True),
    DsField("cpu_offload", B, None, nullable=True),
    DsField("prefetch_bucket_size", I, 50_000_000, alias="stage3_prefetch_bucket_size", ge=0),
    DsField("param_persistence_threshold", I, 100_000, alias="stage3_param_persistence_threshold", ge=0),
    DsField("model_persistence_threshold", I, INT64_MAX, alias="stage3_model_persistence_threshold", ge=0),
    DsField("max_live_parameters", I, 1_000_000_000, alias="stage3_max_live_parameters", ge=0),
    DsField("max_reuse_distance", I, 1_000_000_000, alias="stage3_max_reuse_distance", ge=0),
    DsField("gather_16bit_weights_on_model_save", B, False, alias="stage3_gather_16bit_weights_on_model_save"),
    DsField("module_granularity_threshold", I, 0, alias="stage3_module_granularity_threshold"),
    DsField("use_all_reduce_for_fetch_params", B, False, alias="stage3_use_all_reduce_for_fetch_params"),
    DsField("allgather_sequential", B, False, alias="stage3_allgather_sequential"),
    DsField("stage3_gather_fp16_weights_on_model_save", B, False),
    DsField("ignore_unused_parameters", B, True),
    DsField("legacy_stage1", B, False),
    DsField("round_robin_gradients", B, False),
    DsField("parameter_alignment", B, False),
    DsField("zero_hpz_partition_size", I, 1, ge=0),
    DsField("zero_quantized_weights", B, False),
    DsField("zero_quantized_nontrainable_weights", B, False),
    DsField("zero_quantized_gradients", B, False),
    DsField("memory_efficient_linear", B, True),
    DsField("pipeline_loading_checkpoint", B, False),
    DsField("override_module_apply", B, True),
    DsField("log_trace_cache_warnings", B, False),
    DsField("enable_sanity_checks", B, False),
    DsField("save_muon_momentum_buffer_in_memory", B, False),
    DsField("leaf_module", "opaque", None),
)
"""``deepspeed/runtime/zero/config.py: DeepSpeedZeroConfig`` (``leaf_module``'s default is a
``DeepSpeedZeroLeafModuleConfig()``; memfit does not read it)."""

ZERO_DEPRECATED: tuple[tuple[str, str | None], ...] = (
    ("cpu_offload_param", "offload_param"),
    ("cpu_offload_use_pin_memory", None),
    ("cpu_offload", "offload_optimizer"),
    ("stage3_gather_fp16_weights_on_model_save", "gather_16bit_weights_on_model_save"),
)
"""Deprecated ZeRO keys and the field each one sets (``json_schema_extra`` ``new_param``; None: the
key is accepted and has no effect), in the order ``_deprecated_fields_check`` processes them."""

OFFLOAD_PARAM_FIELDS: tuple[DsField, ...] = (
    DsField("device", "device", "none"),
    DsField("nvme_path", "path", None, nullable=True),
    DsField("buffer_count", I, 5, ge=0),
    DsField("buffer_size", I, 100_000_000, ge=0),
    DsField("max_in_cpu", I, 1_000_000_000, ge=0),
    DsField("pin_memory", B, True),
)
"""``runtime/zero/offload_config.py: DeepSpeedZeroOffloadParamConfig``."""

OFFLOAD_OPTIMIZER_FIELDS: tuple[DsField, ...] = (
    DsField("device", "device", "none"),
    DsField("nvme_path", "path", None, nullable=True),
    DsField("buffer_count", I, 4, ge=0),
    DsField("pin_memory", B, True),
    DsField("pipeline_read", B, False),
    DsField("pipeline_write", B, False),
    DsField("fast_init", B, False),
    DsField("ratio", F, 1.0, ge=0.0, le=1.0),
    DsField("super_offload", B, False),
    DsField("cpuadam_cores_perc", F, 0.8, ge=0.0, le=1.0),
)
"""``runtime/zero/offload_config.py: DeepSpeedZeroOffloadOptimizerConfig``."""

FP16_FIELDS: tuple[DsField, ...] = (
    DsField("enabled", B, False),
    DsField("auto_cast", B, False),
    DsField("loss_scale", F, 0, ge=0.0),
    DsField("initial_scale_power", I, 16),
    DsField("loss_scale_window", I, 1000),
    DsField("hysteresis", I, 2),
    DsField("consecutive_hysteresis", B, False),
    DsField("min_loss_scale", I, 1),
    DsField("fp16_master_weights_and_grads", B, False),
)
"""``runtime/precision_config.py: DeepSpeedFP16Config`` (``loss_scale`` >= 0 is its
``_validate_loss_scale`` validator)."""

BF16_FIELDS: tuple[DsField, ...] = (
    DsField("enabled", B, False),
    DsField("immediate_grad_update", B, False),
    DsField("check_grad_overflow", B, True),
    DsField("bf16_master_weights_and_grads", B, False),
    DsField("bf16_optimizer_states", B, False),
)
"""``runtime/precision_config.py: DeepSpeedBF16Config``."""

REMOVED_TOP_LEVEL_KEYS = frozenset({
    "nebula", "compression_training", "amp", "quantize_training", "sparse_gradients", "eigenvalue",
    "sparse_attention", "elasticity", "graph_harvesting", "curriculum_learning", "progressive_layer_drop"})
"""Sections DeepSpeed 0.19.8 refuses as removed features (``runtime/config.py``:
``_REMOVED_TOP_LEVEL_CONFIG_KEYS``)."""

REMOVED_ZERO_KEYS = frozenset({"mics_shard_size", "mics_hierarchical_params_gather", "zeropp_loco_param"})
"""``zero_optimization`` keys DeepSpeed 0.19.8 refuses as removed (``_REMOVED_ZERO_CONFIG_KEYS``)."""


def _is_number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _as_int(value: object, where: str) -> int:
    """A JSON number that is a whole number (``1e9`` included) as an int; pydantic's lax int."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise MemfitError(f"DeepSpeed config {where} must be a whole number, got {value!r}")
    if isinstance(value, float):
        if not math.isfinite(value) or value != int(value):
            raise MemfitError(f"DeepSpeed config {where} must be a whole number, got {value!r}")
        if abs(value) > INT64_MAX:
            raise MemfitError(f"DeepSpeed config {where} is too large: {value!r}")
        return int(value)
    return value


def _as_float(value: object, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise MemfitError(f"DeepSpeed config {where} must be a finite number, got {value!r}")
    return float(value)


def _as_bool(value: object, where: str) -> bool:
    if not isinstance(value, bool):
        raise MemfitError(f"DeepSpeed config {where} must be true or false, got {value!r}")
    return value


def _check_value(f: DsField, value: object, where: str) -> object:
    if value is None:
        if f.nullable:
            return None
        raise MemfitError(f"DeepSpeed config {where} cannot be null")
    if f.kind == B:
        return _as_bool(value, where)
    if f.kind in (I, "stage"):
        out: float = _as_int(value, where)
    elif f.kind == F:
        out = _as_float(value, where)
    elif f.kind == "device":
        if value not in ("none", "cpu", "nvme"):
            raise MemfitError(f"DeepSpeed config {where} must be none, cpu or nvme, got {value!r}")
        return value
    elif f.kind == "path":
        if not isinstance(value, str):
            raise MemfitError(f"DeepSpeed config {where} must be a path (a string), got {value!r}")
        return value
    else:  # section / opaque
        if not isinstance(value, Mapping):
            raise MemfitError(f"DeepSpeed config {where} must be an object, got {value!r}")
        return value
    if f.kind == "stage" and out not in (0, 1, 2, 3):
        raise MemfitError(f"DeepSpeed config {where} must be 0, 1, 2 or 3, got {value!r}")
    if f.gt is not None and not out > f.gt:
        raise MemfitError(f"DeepSpeed config {where} must be > {f.gt:g}, got {value!r}")
    if f.ge is not None and not out >= f.ge:
        raise MemfitError(f"DeepSpeed config {where} must be >= {f.ge:g}, got {value!r}")
    if f.le is not None and not out <= f.le:
        raise MemfitError(f"DeepSpeed config {where} must be <= {f.le:g}, got {value!r}")
    return out


def read_section(raw: object, table: tuple[DsField, ...], where: str) -> dict[str, object]:
    """The keys given in one pydantic section, by field name, checked like ``DeepSpeedConfigModel``
    (``extra="forbid"``, ``populate_by_name=True``, ``"auto"`` dropped); defaults not filled."""
    if not isinstance(raw, Mapping):
        raise MemfitError(f"DeepSpeed config {where} must be an object, got {raw!r}")
    by_key = {f.name: f for f in table} | {f.alias: f for f in table if f.alias}
    given: dict[str, object] = {}
    for key, value in raw.items():
        if isinstance(value, str) and value == AUTO:
            continue
        f = by_key.get(key)
        if f is None:
            close = difflib.get_close_matches(key, list(by_key), n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            raise MemfitError(f"DeepSpeed config {where}.{key}: unknown key (DeepSpeed forbids unknown keys "
                              f"in this section){hint}")
        if f.name in given:
            raise MemfitError(f"DeepSpeed config {where}: give {f.alias} or {f.name}, not both (DeepSpeed "
                              "refuses the second as an unknown key)")
        given[f.name] = _check_value(f, value, f"{where}.{key}")
    return given


def _defaults(table: tuple[DsField, ...]) -> dict[str, object]:
    return {f.name: f.default for f in table}


def _read_offload(raw: object, table: tuple[DsField, ...], where: str) -> OffloadSettings:
    values = _defaults(table) | read_section(raw, table, where)
    if values["device"] == "nvme" and not values["nvme_path"]:
        raise MemfitError(f"DeepSpeed config {where}: device nvme needs nvme_path (the swap directory)")
    known = {f.name for f in fields(OffloadSettings)}
    return OffloadSettings(**{k: v for k, v in values.items() if k in known})


def _read_zero(raw: dict, notes: list[str]) -> ZeroSettings:
    section = raw.get("zero_optimization", {})
    if isinstance(section, bool):
        # runtime/zero/config.py: read_zero_config_deprecated
        notes.append("zero_optimization: true/false is DeepSpeed's deprecated form (stage 1 or 0)")
        section = {"stage": 1 if section else 0}
        if section["stage"]:
            section["allgather_bucket_size"] = raw.get("allgather_size", 500_000_000)
    if not isinstance(section, Mapping):
        raise MemfitError(f"DeepSpeed config zero_optimization must be an object, got {section!r}")
    for key in section:
        if key in REMOVED_ZERO_KEYS:
            raise MemfitError(f"DeepSpeed config zero_optimization.{key}: removed from DeepSpeed (0.19.8 refuses it)")
    if section.get("stage") == AUTO:
        raise MemfitError('DeepSpeed config zero_optimization.stage is "auto": write the stage (DeepSpeed alone '
                          "reads 0, accelerate fills 2 from ACCELERATE_DEEPSPEED_ZERO_STAGE)")
    given = read_section(section, ZERO_FIELDS, "zero_optimization")
    autos = sorted(k for k, v in section.items() if v == AUTO)
    if autos:
        notes.append(f"zero_optimization: {', '.join(autos)} left \"auto\": DeepSpeed's default applies")

    # config_utils.py: DeepSpeedConfigModel._process_deprecated_field
    for old, new in ZERO_DEPRECATED:
        if old not in given:
            continue
        value = given.pop(old)
        if new is None:
            notes.append(f"zero_optimization.{old} is deprecated and has no effect in DeepSpeed 0.19.8")
            continue
        if new in given:
            raise MemfitError(f"DeepSpeed config zero_optimization: give {old} (deprecated) or {new}, not both "
                              "(DeepSpeed refuses both together)")
        notes.append(f"zero_optimization.{old} is deprecated; DeepSpeed reads it as {new}")
        if old == "cpu_offload_param":
            given[new] = {"device": "cpu"} if value else None
        elif old == "cpu_offload":
            given[new] = {"device": "cpu"} if value else None
        else:
            given[new] = value

    v = _defaults(ZERO_FIELDS) | given
    stage = v["stage"]
    opt = (OffloadSettings(buffer_count=4) if v["offload_optimizer"] is None else
           _read_offload(v["offload_optimizer"], OFFLOAD_OPTIMIZER_FIELDS, "zero_optimization.offload_optimizer"))
    par = (OffloadSettings() if v["offload_param"] is None else
           _read_offload(v["offload_param"], OFFLOAD_PARAM_FIELDS, "zero_optimization.offload_param"))

    # DeepSpeedZeroConfig validators and engine-time refusals
    if not v["compute_grad_norm"] and stage not in (1, 2):
        raise MemfitError("DeepSpeed config zero_optimization.compute_grad_norm=false is supported only with "
                          f"ZeRO stage 1 or 2, not {stage}")
    if opt.ratio < 1.0 and stage != 3:
        raise MemfitError(f"DeepSpeed config zero_optimization.offload_optimizer.ratio={opt.ratio:g}: partial "
                          f"offloading is supported only with ZeRO stage 3, not {stage}")
    if v["legacy_stage1"]:
        raise MemfitError("DeepSpeed config zero_optimization.legacy_stage1: the old ZeRO stage 1 was removed "
                          "in DeepSpeed 0.5.9 (engine.py _configure_zero_optimizer refuses it)")
    if par.device != "none" and stage != 3:
        notes.append(f"zero_optimization.offload_param is used by ZeRO stage 3 only; stage {stage} ignores it")
    if opt.device != "none" and stage == 0:
        notes.append("zero_optimization.offload_optimizer is used by ZeRO stages 1-3 only; stage 0 ignores it")
    if v["zenflow"] is not None or "leaf_module" in given:
        notes.append("zero_optimization: zenflow/leaf_module sections are passed to DeepSpeed unchecked")

    known = {f.name for f in fields(ZeroSettings)} - {"offload_optimizer", "offload_param"}
    return ZeroSettings(offload_optimizer=opt, offload_param=par, **{k: v[k] for k in known})


def _read_precision(raw: dict, stage: int, notes: list[str]) -> tuple[str, Fp16Settings, Bf16Settings]:
    """``get_float16_config`` / ``get_bfloat16_config`` (``runtime/precision_config.py``) and the
    checks ``DeepSpeedConfig._initialize_params`` / ``_do_error_check`` make on them."""
    fp16 = _defaults(FP16_FIELDS) | read_section(raw.get("fp16", {}), FP16_FIELDS, "fp16")
    if raw.get("bf16") is not None:
        bf16_raw, bf16_key = raw["bf16"], "bf16"
        if "bfloat16" in raw:
            notes.append("bfloat16 section ignored: DeepSpeed reads bf16 when both are present")
    else:
        bf16_raw, bf16_key = raw.get("bfloat16", {}), "bfloat16"
        if "bfloat16" in raw:
            notes.append("bfloat16 is DeepSpeed's old name of the bf16 section")
    bf16 = _defaults(BF16_FIELDS) | read_section(bf16_raw, BF16_FIELDS, bf16_key)

    if fp16["enabled"] and fp16["loss_scale"] == 0:
        # DeepSpeedFP16Config._validate_dynamic_loss_scale_params
        for key in ("loss_scale_window", "min_loss_scale"):
            if fp16[key] <= 0:
                raise MemfitError(f"DeepSpeed config fp16.{key} must be > 0 with dynamic loss scaling "
                                  f"(loss_scale 0), got {fp16[key]}")
    if fp16["enabled"] and bf16["enabled"]:
        raise MemfitError("DeepSpeed config enables both fp16 and bf16; DeepSpeed refuses that "
                          "(bfloat16 and fp16 modes cannot be simultaneously enabled)")
    for flag, on in (("fp16.fp16_master_weights_and_grads", fp16["fp16_master_weights_and_grads"]),
                     (f"{bf16_key}.bf16_master_weights_and_grads", bf16["bf16_master_weights_and_grads"]),
                     (f"{bf16_key}.bf16_optimizer_states", bf16["bf16_optimizer_states"])):
        if on and stage == 0:
            raise MemfitError(f"DeepSpeed config {flag} needs ZeRO stage 1, 2 or 3 (stage is 0)")
    if bf16["bf16_optimizer_states"] and not bf16["bf16_master_weights_and_grads"]:
        raise MemfitError(f"DeepSpeed config {bf16_key}.bf16_optimizer_states needs "
                          "bf16_master_weights_and_grads")

    precision = "fp16" if fp16["enabled"] else "bf16" if bf16["enabled"] else "fp32"
    f16 = Fp16Settings(**{k: (float(fp16[k]) if k == "loss_scale" else fp16[k])
                          for k in (f.name for f in fields(Fp16Settings))})
    b16 = Bf16Settings(**{k: bf16[k] for k in (f.name for f in fields(Bf16Settings))})
    return precision, f16, b16


_DTYPE_NAMES = {
    "fp16": "fp16", "float16": "fp16", "half": "fp16", "torch.float16": "fp16",
    "fp32": "fp32", "float32": "fp32", "float": "fp32", "torch.float32": "fp32",
    "bf16": "bf16", "bfloat16": "bf16", "torch.bfloat16": "bf16",
}
"""``runtime/config.py: DtypeEnum`` names of the float dtypes (its int8 is not a training dtype)."""


def _read_dtype(value: object, where: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or value not in _DTYPE_NAMES:
        raise MemfitError(f"DeepSpeed config {where} must be fp16, bf16 or fp32, got {value!r}")
    return _DTYPE_NAMES[value]


# --------------------------------------------------------------------------------------------
# Optimizer
# --------------------------------------------------------------------------------------------

DEEPSPEED_OPTIMIZERS = ("adagrad", "adam", "adamw", "lamb", "muadam", "muadamw", "musgd", "lion", "muon")
"""Names DeepSpeed lower-cases and builds itself (``runtime/config.py: DEEPSPEED_OPTIMIZERS``);
any other ``type`` is looked up as ``getattr(torch.optim, type)``, case and all
(``engine.py: _configure_basic_optimizer``)."""

ZERO_TESTED_OPTIMIZERS = frozenset({"adam", "adamw", "muadam", "muadamw", "adagrad", "lion"})
"""Optimizers ZeRO accepts without ``zero_allow_untested_optimizer`` (``runtime/zero/utils.py:
ZERO_SUPPORTED_OPTIMIZERS``: torch Adam/AdamW (mup's MuAdam(W) return those), FusedAdam,
DeepSpeedCPUAdam, torch/CPU Adagrad, CPU/Fused Lion)."""

TORCH_OPTIMIZERS = ("SGD", "RMSprop", "Adamax", "NAdam", "RAdam", "Adadelta", "Rprop", "ASGD", "SparseAdam")
"""``torch.optim`` classes memfit models (reached by DeepSpeed's ``getattr(torch.optim, type)``)."""


def optimizer_states_per_param(kind: str, params: Mapping[str, object], *, cpu_optimizer: bool = False) -> int:
    """Tensors the optimizer keeps per trainable element (scalar ``step`` counters not counted).

    ``cpu_optimizer``: the optimizer is offloaded (``offload_optimizer.device`` cpu or nvme), so
    DeepSpeed builds its CPU variant (``engine.py: zero_use_cpu_optimizer``).

    Adam/AdamW (FusedAdam, DeepSpeedCPUAdam, torch): exp_avg, exp_avg_sq = 2, with torch's AMSGrad
    max_exp_avg_sq = 3; Lamb (FusedLamb): 2; Adagrad (torch ``sum``, DeepSpeedCPUAdagrad
    ``exp_avg_sq``): 1; Lion: FusedLion exp_avg = 1, but DeepSpeedCPULion allocates exp_avg and
    exp_avg_sq = 2 (``ops/lion/cpu_lion.py: step``); SGD/MuSGD: momentum_buffer if momentum != 0, else 0;
    RMSprop: square_avg + momentum_buffer (momentum > 0) + grad_avg (centered); Adamax: exp_avg,
    exp_inf; NAdam/RAdam: exp_avg, exp_avg_sq; Adadelta: square_avg, acc_delta; Rprop: prev,
    step_size; ASGD: ax; SparseAdam: exp_avg, exp_avg_sq.
    """
    if kind in ("adam", "adamw", "muadam", "muadamw"):
        return 3 if params.get("amsgrad") else 2
    if kind in ("lamb", "adamax", "nadam", "radam", "adadelta", "rprop", "sparseadam"):
        return 2
    if kind == "lion":
        return 2 if cpu_optimizer else 1
    if kind in ("adagrad", "asgd"):
        return 1
    if kind in ("sgd", "musgd"):
        return 1 if params.get("momentum", 0) else 0
    if kind == "rmsprop":
        return 1 + (1 if params.get("momentum", 0) else 0) + (1 if params.get("centered", False) else 0)
    raise MemfitError(f"optimizer {kind!r}: memfit does not know its state size")


def _freeze(value: object) -> object:
    """JSON lists and objects as tuples, so the settings stay hashable."""
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, Mapping):
        return tuple((k, _freeze(v)) for k, v in value.items())
    return value


def _read_optimizer(raw: dict, zero: ZeroSettings) -> OptimizerSettings:
    section = raw.get("optimizer")
    if section is None:
        return OptimizerSettings()
    if not isinstance(section, Mapping):
        raise MemfitError(f"DeepSpeed config optimizer must be an object, got {section!r}")
    name = section.get("type")
    params = section.get("params", {})
    if params is None:
        params = {}
    if not isinstance(params, Mapping):
        raise MemfitError(f"DeepSpeed config optimizer.params must be an object, got {params!r}")
    if name is None:  # get_optimizer_name: no type -> the client's optimizer
        return OptimizerSettings(params=_freeze(params))
    if not isinstance(name, str):
        raise MemfitError(f"DeepSpeed config optimizer.type must be a string, got {name!r}")
    if "max_grad_norm" in params:
        raise MemfitError("DeepSpeed config optimizer.params.max_grad_norm is refused by DeepSpeed; use the "
                          "top-level gradient_clipping")
    for key in ("momentum",):
        if key in params:
            _as_float(params[key], f"optimizer.params.{key}")
    if name.lower() in DEEPSPEED_OPTIMIZERS:
        kind = name.lower()
        if kind == "muon":
            raise MemfitError("DeepSpeed config optimizer Muon: memfit does not model its mixed Muon/Adam states yet")
    elif name in TORCH_OPTIMIZERS:
        kind = name.lower()
    elif name.lower() in (n.lower() for n in TORCH_OPTIMIZERS):
        right = next(n for n in TORCH_OPTIMIZERS if n.lower() == name.lower())
        raise MemfitError(f"DeepSpeed config optimizer.type {name!r}: DeepSpeed looks it up as torch.optim.{name}, "
                          f"which does not exist; write {right!r}")
    else:
        raise MemfitError(f"DeepSpeed config optimizer.type {name!r}: not one DeepSpeed 0.19.8 builds "
                          f"({', '.join(DEEPSPEED_OPTIMIZERS)}) nor a torch.optim class memfit models "
                          f"({', '.join(TORCH_OPTIMIZERS)})")
    adam_w_mode = params.get("adam_w_mode", True)
    torch_adam = params.get("torch_adam", False)
    if kind in ("adam", "adamw"):
        _as_bool(adam_w_mode, "optimizer.params.adam_w_mode")
        _as_bool(torch_adam, "optimizer.params.torch_adam")
        if params.get("amsgrad") and not torch_adam:
            raise MemfitError("DeepSpeed config optimizer.params.amsgrad: FusedAdam and DeepSpeedCPUAdam do not "
                              "support AMSGrad (set torch_adam true to use torch's Adam)")
    untested_ok = raw.get("zero_allow_untested_optimizer", False)
    if zero.stage > 0 and kind not in ZERO_TESTED_OPTIMIZERS and not untested_ok:
        raise MemfitError(f"DeepSpeed config optimizer {name!r} with ZeRO stage {zero.stage}: DeepSpeed refuses "
                          'an untested ZeRO optimizer unless "zero_allow_untested_optimizer": true')
    cpu = zero.offload_optimizer.device in ("cpu", "nvme")
    return OptimizerSettings(type=kind, states_per_param=optimizer_states_per_param(kind, params, cpu_optimizer=cpu),
                             params=_freeze(params), in_config=True,
                             adam_w_mode=(kind == "adamw" or bool(adam_w_mode)) if kind in ("adam", "adamw") else True,
                             torch_adam=bool(torch_adam) if kind in ("adam", "adamw") else False)


# --------------------------------------------------------------------------------------------
# Step 3: the batch triple, as DeepSpeedConfig completes and checks it
# --------------------------------------------------------------------------------------------


def resolve_batch_sizes(train: int | None, micro: int | None, accum: int | None, world: int | None
                        ) -> tuple[int | None, int, int]:
    """``DeepSpeedConfig._set_batch_related_parameters`` then ``_batch_assertion``
    (``runtime/config.py``): the missing members of ``train = micro x accum x world`` derived with
    integer division, then the identity checked. Returns ``(train, micro, accum)``; ``train`` is
    None when the world size is unknown and the config does not give it (the rest needs no world
    size). Any other derivation that needs the world size without one is an error."""
    need_world = f"pass {AUTO_FLAGS['world_size']} (the world size) to derive them"
    if train is not None and micro is not None and accum is not None:
        pass
    elif train is not None and micro is not None:
        if world is None:
            raise MemfitError(f"DeepSpeed config gives train_batch_size and the micro batch but not "
                              f"gradient_accumulation_steps: {need_world}")
        accum = train // micro // world
    elif train is not None and accum is not None:
        if world is None:
            raise MemfitError(f"DeepSpeed config gives train_batch_size and gradient_accumulation_steps but not "
                              f"train_micro_batch_size_per_gpu: {need_world}")
        micro = train // world // accum
    elif micro is not None and accum is not None:
        train = None if world is None else micro * accum * world
    elif train is not None:
        if world is None:
            raise MemfitError(f"DeepSpeed config gives only train_batch_size: {need_world}")
        accum, micro = 1, train // world
    elif micro is not None:
        accum = 1
        train = None if world is None else micro * world
    else:
        raise MemfitError("DeepSpeed config needs train_batch_size or train_micro_batch_size_per_gpu "
                          "(DeepSpeed refuses a config with neither)")
    if micro < 1 or accum < 1:
        raise MemfitError(f"DeepSpeed config batch sizes do not divide: train_batch_size {train} over "
                          f"{world} GPUs gives micro batch {micro} x gradient accumulation {accum}")
    if world is not None and train != micro * accum * world:
        raise MemfitError(f"DeepSpeed config train_batch_size {train} != train_micro_batch_size_per_gpu {micro} "
                          f"x gradient_accumulation_steps {accum} x world size {world}")
    if world is None and train is not None and train % (micro * accum):
        raise MemfitError(f"DeepSpeed config train_batch_size {train} is not a multiple of "
                          f"micro batch {micro} x gradient accumulation {accum} for any world size")
    return train, micro, accum


def _read_batch_member(raw: dict, key: str) -> int | None:
    value = raw.get(key)
    if value is None:
        return None
    n = _as_int(value, key)
    if n < 1:
        raise MemfitError(f"DeepSpeed config {key} must be >= 1, got {value!r}")
    return n


# --------------------------------------------------------------------------------------------
# The whole config
# --------------------------------------------------------------------------------------------

_KNOWN_TOP_LEVEL = frozenset({
    "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "optimizer",
    "scheduler", "fp16", "bf16", "bfloat16", "zero_optimization", "gradient_clipping", "data_types",
    "communication_data_type", "zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer",
    "activation_checkpointing", "steps_per_print", "wall_clock_breakdown", "memory_breakdown",
    "prescale_gradients", "gradient_predivide_factor", "allgather_size", "dump_state", "flops_profiler",
    "tensorboard", "wandb", "csv_monitor", "comet", "comms_logger", "checkpoint", "aio", "compile",
    "torch_autocast", "seq_parallel_communication_data_type", "data_efficiency", "dataloader_drop_last",
    "pipeline", "autotuning", "hybrid_engine", "weight_quantization", "tensor_parallel", "timers",
    "disable_allgather", "managed_gradient_accumulation", "gradient_allreduce_op", "vocabulary_size",
    "log_level", "expert_parallel", "use_data_before_expert_parallel_", "datastates", "sequence_parallel_size",
    "disable_python_gc", "zenflow", "swap_tensor", "optimizer_legacy_fusion"})
"""Top-level keys memfit recognizes (DeepSpeed ignores unknown top-level keys; memfit notes those
that look like typos of these)."""


def _parse_resolved(cfg: dict, context: AutoContext | None) -> DeepSpeedSettings:
    notes: list[str] = []
    for key in cfg:
        if key in REMOVED_TOP_LEVEL_KEYS:
            raise MemfitError(f"DeepSpeed config {key}: this feature was removed from DeepSpeed (0.19.8 refuses "
                              "the section)")
        if key not in _KNOWN_TOP_LEVEL:
            close = difflib.get_close_matches(key, sorted(_KNOWN_TOP_LEVEL), n=1, cutoff=0.85)
            if close:
                notes.append(f"unknown top-level key {key!r} (did you mean {close[0]!r}?): DeepSpeed ignores it")

    zero = _read_zero(cfg, notes)
    precision, fp16, bf16 = _read_precision(cfg, zero.stage, notes)
    optimizer = _read_optimizer(cfg, zero)

    data_types = cfg.get("data_types", {})
    if not isinstance(data_types, Mapping):
        raise MemfitError(f"DeepSpeed config data_types must be an object, got {data_types!r}")
    grad_accum_dtype = _read_dtype(data_types.get("grad_accum_dtype"), "data_types.grad_accum_dtype")
    param_dtype = _read_dtype(data_types.get("param_dtype"), "data_types.param_dtype")
    keep = data_types.get("keep_in_fp32_modules", AUTO)
    if keep != AUTO and not (isinstance(keep, list) and all(isinstance(n, str) for n in keep)):
        raise MemfitError(f'DeepSpeed config data_types.keep_in_fp32_modules must be "auto" or a list of name '
                          f"patterns, got {keep!r}")
    if zero.stage == 0 and (grad_accum_dtype or precision) != precision:
        # engine.py _do_optimizer_sanity_check: NotImplementedError without ZeRO
        raise MemfitError(f"DeepSpeed config data_types.grad_accum_dtype={grad_accum_dtype} with {precision} "
                          "training needs ZeRO (stage 0 supports only matching dtypes)")

    comm = cfg.get("communication_data_type")
    if comm is not None:
        if not isinstance(comm, str) or comm.lower() not in ("fp16", "bf16", "fp32"):
            raise MemfitError(f"DeepSpeed config communication_data_type must be fp16, bf16 or fp32, got {comm!r}")
        comm = comm.lower()

    clip = cfg.get("gradient_clipping", 1.0)
    clip = _as_float(clip, "gradient_clipping")
    if clip < 0:
        raise MemfitError(f"DeepSpeed config gradient_clipping must be >= 0 (0 turns clipping off), got {clip:g}")

    untested = cfg.get("zero_allow_untested_optimizer", False)
    _as_bool(untested, "zero_allow_untested_optimizer")

    scheduler = cfg.get("scheduler")
    if scheduler is not None and not isinstance(scheduler, Mapping):
        raise MemfitError(f"DeepSpeed config scheduler must be an object, got {scheduler!r}")
    scheduler_type = scheduler.get("type") if scheduler else None

    world = context.world_size if context else None
    train, micro, accum = resolve_batch_sizes(_read_batch_member(cfg, "train_batch_size"),
                                              _read_batch_member(cfg, "train_micro_batch_size_per_gpu"),
                                              _read_batch_member(cfg, "gradient_accumulation_steps"), world)
    if world is None:
        notes.append("world size unknown: the batch sizes were not checked against it")

    return DeepSpeedSettings(
        precision=precision, grad_accum_dtype=grad_accum_dtype, param_dtype=param_dtype,
        communication_data_type=comm, zero=zero, fp16=fp16, bf16=bf16, optimizer=optimizer,
        has_scheduler=scheduler_type is not None, scheduler_type=scheduler_type,
        zero_allow_untested_optimizer=untested, train_micro_batch_size_per_gpu=micro,
        gradient_accumulation_steps=accum, train_batch_size=train, world_size=world, gradient_clipping=clip,
        activation_checkpointing=isinstance(cfg.get("activation_checkpointing"), Mapping), notes=tuple(notes))
