"""An accelerate config YAML (what ``accelerate config`` writes; accelerate 1.15 ``commands/config``):

- ``distributed_type``: ``NO`` -> torch, ``MULTI_GPU`` -> ddp, ``FSDP`` -> fsdp or fsdp2
  (``fsdp_config.fsdp_version``), ``DEEPSPEED`` -> deepspeed (its ``deepspeed_config_file``, or
  the inline ``zero_stage``/``offload_*_device``/``gradient_accumulation_steps``);
- ``mixed_precision``: ``bf16``/``fp16`` autocast (torch, ddp), FSDP's MixedPrecision policy (fsdp,
  fsdp2: sharded params stay fp32, computed in 16 bits), or DeepSpeed's bf16/fp16 section;
- ``num_processes`` and ``num_machines``: the GPUs per node (num_processes / num_machines) and nodes;
- ``fsdp_config``: ``fsdp_sharding_strategy`` (FSDP1), ``fsdp_reshard_after_forward`` (FSDP2),
  ``fsdp_offload_params``, ``fsdp_auto_wrap_policy``, ``fsdp_min_num_params``,
  ``fsdp_cpu_ram_efficient_loading``, ``fsdp_backward_prefetch``, ``fsdp_forward_prefetch``,
  ``fsdp_use_orig_params``, ``fsdp_activation_checkpointing``.
"""

from __future__ import annotations

from typing import Any

from memfit.core.inputs.common import Sourced, as_bool, as_int, read_mapping
from memfit.errors import MemfitError

_STRATEGY_NUM = {"1": "FULL_SHARD", "2": "SHARD_GRAD_OP", "3": "NO_SHARD", "4": "HYBRID_SHARD",
                 "5": "_HYBRID_SHARD_ZERO2"}


def read_accelerate_config(path: str) -> Sourced:
    raw = read_mapping(path, "accelerate config")
    out = Sourced()

    def o(key: str) -> str:
        return f"{path}: {key}"

    dt = str(raw.get("distributed_type", "NO")).upper()
    n_proc = as_int(raw.get("num_processes", 1), o("num_processes"))
    n_mach = as_int(raw.get("num_machines", 1), o("num_machines"))
    if n_proc % n_mach:
        raise MemfitError(f"{o('num_processes')} = {n_proc} is not a multiple of num_machines = {n_mach}")
    out.set("gpus_count", n_proc // n_mach, o("num_processes"))
    out.set("nodes", n_mach, o("num_machines"))
    mp = str(raw.get("mixed_precision", "no")).lower()
    if mp not in ("no", "bf16", "fp16", "fp8"):
        raise MemfitError(f"{o('mixed_precision')}: unknown value {mp!r} (no, bf16, fp16)")
    if mp == "fp8":
        raise MemfitError(f"{o('mixed_precision')}: fp8 training is not modelled by memfit")
    out.set("mixed_precision", mp, o("mixed_precision"))
    if dt == "NO":
        out.set("framework", "torch", o("distributed_type"))
    elif dt == "MULTI_GPU":
        out.set("framework", "ddp", o("distributed_type"))
    elif dt == "FSDP":
        fc = {k[5:] if k.startswith("fsdp_") else k: v for k, v in (raw.get("fsdp_config") or {}).items()}
        version = as_int(fc.get("version", 1), o("fsdp_config.fsdp_version"))
        out.set("framework", "fsdp2" if version == 2 else "fsdp", o("distributed_type"))
        out.set("fsdp", _fsdp(fc, version, path), o("fsdp_config"))
        if as_bool(str(fc.get("activation_checkpointing", "false")), o("fsdp_config.fsdp_activation_checkpointing")):
            out.set("gradient_checkpointing", True, o("fsdp_config.fsdp_activation_checkpointing"))
    elif dt == "DEEPSPEED":
        out.set("framework", "deepspeed", o("distributed_type"))
        dc = raw.get("deepspeed_config") or {}
        if dc.get("deepspeed_config_file"):
            out.set("deepspeed", str(dc["deepspeed_config_file"]), o("deepspeed_config.deepspeed_config_file"))
        else:
            out.set("deepspeed_inline", _deepspeed_inline(dc, mp), o("deepspeed_config"))
    else:
        raise MemfitError(f"{o('distributed_type')}: memfit models NO, MULTI_GPU, FSDP and DEEPSPEED, got {dt!r}")
    return out


def _fsdp(fc: dict[str, Any], version: int, path: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if version == 2:
        raf = fc.get("reshard_after_forward", True)
        out["sharding_strategy"] = "FULL_SHARD" if as_bool(str(raf), f"{path}: fsdp_reshard_after_forward") \
            else "SHARD_GRAD_OP"
    else:
        s = str(fc.get("sharding_strategy", "FULL_SHARD")).upper()
        out["sharding_strategy"] = _STRATEGY_NUM.get(s, s)
        out["backward_prefetch"] = str(fc.get("backward_prefetch", "BACKWARD_PRE")).upper()
        out["forward_prefetch"] = as_bool(str(fc.get("forward_prefetch", "false")), f"{path}: fsdp_forward_prefetch")
        out["use_orig_params"] = as_bool(str(fc.get("use_orig_params", "true")), f"{path}: fsdp_use_orig_params")
    out["cpu_offload"] = as_bool(str(fc.get("offload_params", "false")), f"{path}: fsdp_offload_params")
    policy = str(fc.get("auto_wrap_policy", "TRANSFORMER_BASED_WRAP")).upper()
    out["wrap_policy"] = {"TRANSFORMER_BASED_WRAP": "transformer", "SIZE_BASED_WRAP": "size", "NO_WRAP": "none"}.get(
        policy, "transformer")
    if fc.get("min_num_params"):
        out["min_num_params"] = as_int(fc["min_num_params"], f"{path}: fsdp_min_num_params")
    out["cpu_ram_efficient_loading"] = as_bool(str(fc.get("cpu_ram_efficient_loading", "true")),
                                               f"{path}: fsdp_cpu_ram_efficient_loading")
    return out


def _deepspeed_inline(dc: dict[str, Any], mp: str) -> dict[str, Any]:
    """accelerate's DeepSpeedPlugin config from the YAML's inline keys."""
    zero: dict[str, Any] = {"stage": int(dc.get("zero_stage", 2))}
    for key, section in (("offload_optimizer_device", "offload_optimizer"), ("offload_param_device", "offload_param")):
        dev = dc.get(key)
        if dev and dev != "none":
            zero[section] = {"device": dev}
    if dc.get("zero3_init_flag") is not None:
        pass  # zero.Init: memfit's load.zero_init (the scenario's), not a JSON key
    out: dict[str, Any] = {"zero_optimization": zero, "train_micro_batch_size_per_gpu": "auto",
                           "gradient_accumulation_steps": int(dc.get("gradient_accumulation_steps", 1)),
                           "gradient_clipping": float(dc.get("gradient_clipping", 1.0))}
    if mp in ("bf16", "fp16"):
        out[mp] = {"enabled": True}
    return out
