"""An accelerate config YAML (what ``accelerate config`` writes; accelerate 1.15 ``commands/config``):

- ``distributed_type``: ``NO`` -> torch, ``MULTI_GPU`` -> ddp, ``FSDP`` -> fsdp or fsdp2
  (``fsdp_config.fsdp_version``), ``DEEPSPEED`` -> deepspeed (its ``deepspeed_config_file``, or
  the inline ``zero_stage``/``offload_*_device``/``gradient_accumulation_steps``/``gradient_clipping``
  as accelerate's ``DeepSpeedPlugin`` builds the config, "auto" where the plugin leaves it so);
- ``mixed_precision``: ``bf16``/``fp16`` autocast (torch, ddp), FSDP's MixedPrecision policy (fsdp,
  fsdp2: sharded params stay fp32, computed in 16 bits), or DeepSpeed's bf16/fp16 section;
- ``num_processes`` and ``num_machines``: the GPUs per node (num_processes / num_machines) and nodes;
- ``use_cpu: true``: a CPU run (planned with the CPU accelerator);
- ``fsdp_config``: ``fsdp_sharding_strategy`` (FSDP1), ``fsdp_reshard_after_forward`` (FSDP2),
  ``fsdp_offload_params``, ``fsdp_auto_wrap_policy``, ``fsdp_min_num_params``,
  ``fsdp_cpu_ram_efficient_loading``, ``fsdp_backward_prefetch``, ``fsdp_forward_prefetch``,
  ``fsdp_use_orig_params``, ``fsdp_activation_checkpointing``;
- ``deepspeed_config.zero3_init_flag``: the model is built under ``zero.Init`` (ZeRO-3).

A top-level key accelerate does not have is refused, as ``ClusterConfig.from_yaml_file`` refuses it;
an ``fsdp_config``/``deepspeed_config`` key ``accelerate launch`` does not read (a misspelled
``fsdp_ofload_params``) is a warning with the key it most likely misspells, and the plan is made as
if it were absent, as accelerate runs it.
"""

from __future__ import annotations

from typing import Any

from memfit.core.inputs.common import (Sourced, as_bool, as_choice, as_float, as_int, as_mapping, check_keys,
                                       read_mapping)
from memfit.core.inputs.keys import (ACCELERATE_DEEPSPEED_KEYS, ACCELERATE_DISTRIBUTED_TYPES, ACCELERATE_FSDP_KEYS,
                                     ACCELERATE_KEYS, ACCELERATE_MIXED_PRECISION)
from memfit.core.inputs.training_args import _abs, relative_path
from memfit.errors import MemfitError

_STRATEGY_NUM = {"1": "FULL_SHARD", "2": "SHARD_GRAD_OP", "3": "NO_SHARD", "4": "HYBRID_SHARD",
                 "5": "_HYBRID_SHARD_ZERO2"}
_STRATEGIES = {"FULL_SHARD": "FULL_SHARD", "SHARD_GRAD_OP": "SHARD_GRAD_OP", "NO_SHARD": "NO_SHARD",
               "HYBRID_SHARD": "HYBRID_SHARD", "HYBRID_SHARD_ZERO2": "_HYBRID_SHARD_ZERO2"}
"""accelerate's ``FSDP_SHARDING_STRATEGY`` names (or their 1-based numbers) as memfit names them."""
_WRAP = {"TRANSFORMER_BASED_WRAP": "transformer", "SIZE_BASED_WRAP": "size", "NO_WRAP": "none"}
_PREFETCH = ("BACKWARD_PRE", "BACKWARD_POST", "NO_PREFETCH")
_DEVICES = ("none", "cpu", "nvme")
_MODELLED = {"NO": "torch", "MULTI_GPU": "ddp", "FSDP": "fsdp", "DEEPSPEED": "deepspeed"}


def read_accelerate_config(path: str) -> Sourced:
    raw = read_mapping(path, "accelerate config")
    out = Sourced(layer="accelerate_config")
    check_keys(raw, ACCELERATE_KEYS, path, refuse=True, library="accelerate (ClusterConfig.from_yaml_file)")

    def o(key: str) -> str:
        return f"{path}: {key}"

    dt = as_choice(raw.get("distributed_type", "NO"), o("distributed_type"), ACCELERATE_DISTRIBUTED_TYPES,
                   fold=str.upper)
    if dt not in _MODELLED:
        raise MemfitError(f"{o('distributed_type')}: {dt} is not modelled by memfit (it plans NO, MULTI_GPU, FSDP and "
                          "DEEPSPEED)")
    n_proc = as_int(raw.get("num_processes", 1), o("num_processes"))
    n_mach = as_int(raw.get("num_machines", 1), o("num_machines"), maximum=2**20)
    if n_proc % n_mach:
        raise MemfitError(f"{o('num_processes')} = {n_proc} is not a multiple of num_machines = {n_mach}")
    out.set("gpus_count", n_proc // n_mach, o("num_processes"), default="num_processes" not in raw)
    out.set("nodes", n_mach, o("num_machines"), default="num_machines" not in raw)
    mp = as_choice(raw.get("mixed_precision", "no"), o("mixed_precision"), ACCELERATE_MIXED_PRECISION)
    if mp == "fp8":
        raise MemfitError(f"{o('mixed_precision')}: fp8 training is not modelled by memfit")
    out.set("mixed_precision", mp, o("mixed_precision"), default="mixed_precision" not in raw)
    if raw.get("use_cpu") is not None and as_bool(raw["use_cpu"], o("use_cpu")):
        out.set("accelerator", "cpu", o("use_cpu"))
    framework = _MODELLED[dt]
    for section, used_by in (("fsdp_config", "FSDP"), ("deepspeed_config", "DEEPSPEED")):
        if raw.get(section) and dt != used_by:
            out.warnings.append(f"{o(section)} is not used: distributed_type is {dt}, and accelerate reads it for "
                                f"{used_by} only")
    if dt == "FSDP":
        fc = as_mapping(raw.get("fsdp_config") or {}, o("fsdp_config"))
        check_keys({k if k.startswith("fsdp") else f"fsdp_{k}": v for k, v in fc.items()}, ACCELERATE_FSDP_KEYS,
                   o("fsdp_config"), refuse=False, warnings=out.warnings, library="accelerate launch")
        fc = {k[5:] if k.startswith("fsdp_") else k: v for k, v in fc.items()}
        version = as_int(fc.get("version", 1), o("fsdp_config.fsdp_version"), maximum=2)
        framework = "fsdp2" if version == 2 else "fsdp"
        for key, value in _fsdp(fc, version, path).items():
            out.set(f"fsdp.{key}", value, o(f"fsdp_config.fsdp_{key}"))
        if as_bool(fc.get("activation_checkpointing", False), o("fsdp_config.fsdp_activation_checkpointing")):
            out.set("gradient_checkpointing", True, o("fsdp_config.fsdp_activation_checkpointing"))
    elif dt == "DEEPSPEED":
        dc = as_mapping(raw.get("deepspeed_config") or {}, o("deepspeed_config"))
        check_keys(dc, ACCELERATE_DEEPSPEED_KEYS, o("deepspeed_config"), refuse=False, warnings=out.warnings,
                   library="accelerate launch")
        if dc.get("deepspeed_config_file"):
            if not isinstance(dc["deepspeed_config_file"], str):
                raise MemfitError(f"{o('deepspeed_config.deepspeed_config_file')}: invalid value "
                                  f"{dc['deepspeed_config_file']!r:.60}; valid: a path to a DeepSpeed JSON")
            out.set("deepspeed_config", ("path", _abs(relative_path(dc["deepspeed_config_file"], path))),
                    o("deepspeed_config.deepspeed_config_file"))
        else:
            out.set("deepspeed_config", ("inline", _deepspeed_inline(dc, path)), o("deepspeed_config"))
        stage = dc.get("zero_stage", 2)
        if dc.get("zero3_init_flag") is not None and as_bool(dc["zero3_init_flag"], o("deepspeed_config.zero3_init_flag")):
            if dc.get("deepspeed_config_file") or str(stage) == "3":
                out.set("zero_init", True, o("deepspeed_config.zero3_init_flag"))
    out.set("framework", framework, o("distributed_type"), default="distributed_type" not in raw)
    return out


def fsdp_from_accelerate_keys(raw: dict[str, Any], where: str, *, framework: str | None) -> dict[str, Any]:
    """FSDP settings given with accelerate's ``fsdp_config`` names (``fsdp_sharding_strategy``,
    ``fsdp_offload_params``, ...; a ``memfit.check(fsdp=...)`` or a scenario's ``fsdp:``) as memfit's
    names; keys already in memfit's names are kept (and win)."""
    theirs = {k: v for k, v in raw.items() if str(k).startswith("fsdp_")}
    check_keys(theirs, ACCELERATE_FSDP_KEYS, where, refuse=True, library="accelerate's fsdp_config")
    fc = {k[5:]: v for k, v in theirs.items()}
    version = as_int(fc.get("version", 2 if framework == "fsdp2" else 1), f"{where}: fsdp_version", maximum=2)
    if framework in ("fsdp", "fsdp2") and (version == 2) != (framework == "fsdp2"):
        raise MemfitError(f"{where}: fsdp_version = {version} contradicts framework {framework}")
    out = {k: v for k, v in _fsdp(fc, version, where.split(":")[0]).items() if k in {
        "sharding_strategy": "sharding_strategy" if "sharding_strategy" in fc or "reshard_after_forward" in fc else "",
        "backward_prefetch": "backward_prefetch" if "backward_prefetch" in fc else "",
        "forward_prefetch": "forward_prefetch" if "forward_prefetch" in fc else "",
        "use_orig_params": "use_orig_params" if "use_orig_params" in fc else "",
        "cpu_offload": "cpu_offload" if "offload_params" in fc else "",
        "wrap_policy": "wrap_policy" if "auto_wrap_policy" in fc else "",
        "min_num_params": "min_num_params" if "min_num_params" in fc else "",
        "cpu_ram_efficient_loading": "cpu_ram_efficient_loading" if "cpu_ram_efficient_loading" in fc else "",
    }.values()}
    return {**out, **{k: v for k, v in raw.items() if not str(k).startswith("fsdp_")}}


def _fsdp(fc: dict[str, Any], version: int, path: str) -> dict[str, Any]:
    out: dict[str, Any] = {}

    def o(key: str) -> str:
        return f"{path}: fsdp_config.fsdp_{key}"

    if version == 2:
        out["sharding_strategy"] = "FULL_SHARD" if as_bool(fc.get("reshard_after_forward", True),
                                                           o("reshard_after_forward")) else "SHARD_GRAD_OP"
    else:
        s = fc.get("sharding_strategy", "FULL_SHARD")
        if isinstance(s, int) and not isinstance(s, bool):
            s = str(s)
        out["sharding_strategy"] = _STRATEGY_NUM[s] if isinstance(s, str) and s in _STRATEGY_NUM else \
            _STRATEGIES[as_choice(s, o("sharding_strategy"), _STRATEGIES, fold=str.upper)]
        out["backward_prefetch"] = as_choice(fc.get("backward_prefetch", "BACKWARD_PRE"), o("backward_prefetch"),
                                             _PREFETCH, fold=str.upper)
        out["forward_prefetch"] = as_bool(fc.get("forward_prefetch", False), o("forward_prefetch"))
        out["use_orig_params"] = as_bool(fc.get("use_orig_params", True), o("use_orig_params"))
    out["cpu_offload"] = as_bool(fc.get("offload_params", False), o("offload_params"))
    policy = as_choice(fc.get("auto_wrap_policy", "TRANSFORMER_BASED_WRAP"), o("auto_wrap_policy"), _WRAP,
                       fold=str.upper)
    out["wrap_policy"] = _WRAP[policy]
    if fc.get("min_num_params"):
        out["min_num_params"] = as_int(fc["min_num_params"], o("min_num_params"), minimum=0)
    out["cpu_ram_efficient_loading"] = as_bool(fc.get("cpu_ram_efficient_loading", True),
                                               o("cpu_ram_efficient_loading"))
    return out


def _deepspeed_inline(dc: dict[str, Any], path: str) -> dict[str, Any]:
    """The config accelerate's ``DeepSpeedPlugin.__post_init__`` builds from the YAML's inline keys (no
    config file; accelerate 1.15 ``utils/dataclasses.py``): the batch sizes "auto", accumulation and
    clipping from the YAML or "auto" (the Trainer / ``Accelerator.prepare`` fill them), the ZeRO stage
    (default 2) and offload devices; the fp16/bf16 sections follow the run's mixed precision ("auto"
    here, filled from it)."""
    def o(key: str) -> str:
        return f"{path}: deepspeed_config.{key}"

    stage = as_int(dc.get("zero_stage", 2), o("zero_stage"), minimum=0, maximum=3)
    zero: dict[str, Any] = {"stage": stage}
    for key, section in (("offload_optimizer_device", "offload_optimizer"), ("offload_param_device", "offload_param")):
        dev = as_choice(dc.get(key, "none"), o(key), _DEVICES)
        zero[section] = {"device": dev}
        nvme = dc.get(key.replace("_device", "_nvme_path"))
        if dev == "nvme" and nvme:
            zero[section]["nvme_path"] = str(nvme)
    if dc.get("zero3_save_16bit_model") is not None:
        zero["stage3_gather_16bit_weights_on_model_save"] = as_bool(dc["zero3_save_16bit_model"],
                                                                    o("zero3_save_16bit_model"))
    ga = dc.get("gradient_accumulation_steps")
    clip = dc.get("gradient_clipping")
    return {"zero_optimization": zero, "train_micro_batch_size_per_gpu": "auto", "train_batch_size": "auto",
            "gradient_accumulation_steps": "auto" if ga in (None, "auto") else as_int(ga, o("gradient_accumulation_steps")),
            "gradient_clipping": "auto" if clip in (None, "auto") else as_float(clip, o("gradient_clipping")),
            "fp16": {"enabled": "auto"}, "bf16": {"enabled": "auto"}}
