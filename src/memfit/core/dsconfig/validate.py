"""Step 2: the sections DeepSpeed reads through its pydantic models (``zero_optimization`` and its
offload sections, ``fp16``, ``bf16``), checked as ``DeepSpeedConfigModel`` checks them; the field
tables are compared with DeepSpeed's own models in the tests."""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping
from dataclasses import fields

from memfit.core.lean_dataclass import dataclass
from memfit.core.frameworks.deepspeed import Bf16Settings, Fp16Settings, OffloadSettings, ZeroSettings
from memfit.core.dsconfig.auto import AUTO, INT64_MAX
from memfit.errors import MemfitError


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



def _as_int(value: object, where: str) -> int:
    """A JSON number that is a whole number (``1e9`` included) as an int; pydantic's lax int."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise MemfitError(f"DeepSpeed config {where} must be a whole number, got {value!r}")
    if isinstance(value, float):
        if not math.isfinite(value) or value != int(value):
            raise MemfitError(f"DeepSpeed config {where} must be a whole number, got {value!r}")
        value = int(value)
    if abs(value) > INT64_MAX:  # DeepSpeed hands these sizes to torch, which holds them in int64
        raise MemfitError(f"DeepSpeed config {where} is too large: over 2**63-1")
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


def _read_zero(raw: dict, notes: list[str], warnings: list[str]) -> ZeroSettings:
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
        warnings.append(f"DeepSpeed config zero_optimization.offload_param is used by ZeRO stage 3 only; stage {stage} "
                        "ignores it (parameters stay on the GPU)")
    if opt.device != "none" and stage == 0:
        warnings.append("DeepSpeed config zero_optimization.offload_optimizer is used by ZeRO stages 1-3 only; stage 0 "
                        "ignores it (the optimizer stays on the GPU)")
    if v["zenflow"] is not None or "leaf_module" in given:
        notes.append("zero_optimization: zenflow/leaf_module sections are passed to DeepSpeed unchecked")

    known = {f.name for f in fields(ZeroSettings)} - {"offload_optimizer", "offload_param"}
    return ZeroSettings(offload_optimizer=opt, offload_param=par, **{k: v[k] for k in known})


def _read_precision(raw: dict, stage: int, notes: list[str], warnings: list[str]
                    ) -> tuple[str, Fp16Settings, Bf16Settings]:
    """``get_float16_config`` / ``get_bfloat16_config`` (``runtime/precision_config.py``) and the
    checks ``DeepSpeedConfig._initialize_params`` / ``_do_error_check`` make on them."""
    fp16 = _defaults(FP16_FIELDS) | read_section(raw.get("fp16", {}), FP16_FIELDS, "fp16")
    if raw.get("bf16") is not None:
        bf16_raw, bf16_key = raw["bf16"], "bf16"
        if "bfloat16" in raw:
            warnings.append("DeepSpeed config bfloat16 section ignored: DeepSpeed reads bf16 when both are present")
    else:
        bf16_raw, bf16_key = raw.get("bfloat16", {}), "bfloat16"
        if "bfloat16" in raw:
            notes.append("bfloat16 is DeepSpeed's old name of the bf16 section")
    bf16 = _defaults(BF16_FIELDS) | read_section(bf16_raw, BF16_FIELDS, bf16_key)
    autocast = raw.get("torch_autocast")
    if isinstance(autocast, dict) and autocast.get("enabled"):
        warnings.append("DeepSpeed config torch_autocast is enabled: DeepSpeed then runs the forward under "
                        "torch.autocast, which memfit does not plan for DeepSpeed (its activations are counted in the "
                        "params' dtype, without autocast's 16-bit matmul outputs and weight copies)")

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
