"""A Hugging Face ``TrainingArguments`` or TRL ``SFTConfig`` file (JSON or YAML) as scenario settings.

What changes memory, with the defaults of transformers 5.24 (``training_args.py``) for keys the file
leaves out: ``per_device_train_batch_size`` (8), ``gradient_accumulation_steps`` (1),
``gradient_checkpointing``/``activation_checkpointing`` (off), ``bf16``/``fp16`` (off: fp32),
``optim`` (``adamw_torch_fused`` on torch >= 2.8), ``optim_args``, ``weight_decay`` (0),
``max_grad_norm`` (1), ``fsdp``/``fsdp_config`` (FSDP2 unless ``version: 1``), ``deepspeed``
(a path or an inline config), ``ddp_find_unused_parameters`` (the Trainer passes ``not
gradient_checkpointing`` for a transformers model, memfit assumes a PEFT or transformers model the
way the Trainer wraps it), ``ddp_bucket_cap_mb``, ``ddp_broadcast_buffers``, ``ddp_static_graph``.

A TRL ``SFTConfig`` (recognised by its own keys: ``max_length``, ``max_seq_length``, ``packing``,
``dataset_text_field``, ``model_init_kwargs``, ...) has other defaults (TRL ``trl/trainer/
sft_config.py``): ``gradient_checkpointing`` on, ``bf16`` on unless ``fp16``, ``max_length`` 1024
(the sequence length; older TRL's ``max_seq_length``), ``model_init_kwargs.torch_dtype``/``dtype``
the load dtype. Without ``packing`` memfit takes every sequence at ``max_length`` (padding to the
longest in a batch can only be shorter) and says so.
"""

from __future__ import annotations

from typing import Any

from memfit.core.frameworks.pytorch import OPTIMIZERS
from memfit.core.inputs.common import Sourced, as_bool, as_int, dtype_name, read_mapping
from memfit.errors import MemfitError

SFT_KEYS = {"max_length", "max_seq_length", "packing", "dataset_text_field", "model_init_kwargs",
            "completion_only_loss", "assistant_only_loss", "packing_strategy", "padding_free", "dataset_kwargs",
            "eval_packing", "loss_type", "activation_offloading", "chat_template_path"}
MEMORY_KEYS = {"per_device_train_batch_size", "gradient_accumulation_steps", "gradient_checkpointing",
               "activation_checkpointing", "bf16", "fp16", "optim", "optim_args", "weight_decay", "max_grad_norm",
               "fsdp", "fsdp_config", "deepspeed", "ddp_find_unused_parameters", "ddp_bucket_cap_mb",
               "ddp_broadcast_buffers", "ddp_static_graph", "max_length", "max_seq_length", "packing",
               "model_init_kwargs", "torch_dtype", "use_cpu", "gradient_checkpointing_kwargs", "dataloader_pin_memory",
               # evaluation and the epoch (core/scenario/run_settings.py)
               "eval_strategy", "evaluation_strategy", "per_device_eval_batch_size", "predict_with_generate",
               "generation_max_length", "generation_num_beams", "eval_steps", "torch_empty_cache_steps",
               "group_by_length"}
TRAINER_OPTIM_ALIASES = {"adamw_8bit": "adamw_8bit"}


def read_training_args(path: str, *, fsdp_version_default: int = 2) -> Sourced:
    """``fsdp_version_default``: FSDP version when ``fsdp_config`` gives none (transformers 5.x: 2;
    4.x has no version key and runs FSDP1; ``memfit.core.stack.transformers.trainer_fsdp_version``)."""
    raw = read_mapping(path, "TrainingArguments/SFTConfig file")
    out = Sourced()
    sft = bool(SFT_KEYS & set(raw))
    kind = "SFTConfig" if sft else "TrainingArguments"

    def origin(key: str) -> str:
        return f"{path}: {key}" if key in raw else f"{path}: {key} ({kind} default)"

    micro = as_int(raw.get("per_device_train_batch_size", 8), origin("per_device_train_batch_size"))
    out.set("micro_batch", micro, origin("per_device_train_batch_size"))
    out.set("grad_accum", as_int(raw.get("gradient_accumulation_steps", 1), origin("gradient_accumulation_steps")),
            origin("gradient_accumulation_steps"))
    ckpt_key = "activation_checkpointing" if "activation_checkpointing" in raw else "gradient_checkpointing"
    ckpt = raw.get(ckpt_key)
    if ckpt is None:
        ckpt = sft  # SFTConfig: gradient_checkpointing=True
    out.set("gradient_checkpointing", as_bool(ckpt, origin(ckpt_key)), origin(ckpt_key))
    bf16 = raw.get("bf16")
    fp16 = as_bool(raw.get("fp16", False), origin("fp16"))
    if bf16 is None:
        bf16 = sft and not fp16  # SFTConfig: bf16 unless fp16
    bf16 = as_bool(bf16, origin("bf16"))
    if bf16 and fp16:
        raise MemfitError(f"{path}: bf16 and fp16 are both true (the Trainer refuses that)")
    out.set("mixed_precision", "bf16" if bf16 else "fp16" if fp16 else "no",
            origin("bf16" if (bf16 or not fp16) else "fp16"))
    optim = str(raw.get("optim", "adamw_torch_fused"))
    if optim not in OPTIMIZERS:
        raise MemfitError(f"{origin('optim')}: memfit does not model optim {optim!r} (it knows {', '.join(OPTIMIZERS)})")
    out.set("optim", optim, origin("optim"))
    if raw.get("optim_args"):
        args = {}
        for part in str(raw["optim_args"]).replace(" ", "").split(","):
            if "=" in part:
                k, v = part.split("=", 1)
                if k in ("momentum", "beta1"):
                    args[k] = float(v)
        if args:
            out.set("optim_args", args, origin("optim_args"))
    for key, name in (("weight_decay", "weight_decay"), ("max_grad_norm", "max_grad_norm")):
        if key in raw:
            out.set(name, float(raw[key]), origin(key))
    seq_key = "max_length" if "max_length" in raw else "max_seq_length" if "max_seq_length" in raw else None
    if seq_key or sft:
        seq = raw.get(seq_key) if seq_key else 1024
        if seq is None:
            raise MemfitError(f"{origin(seq_key or 'max_length')} is null (no truncation): give the sequence length "
                              "with --seq-len")
        out.set("seq_len", as_int(seq, origin(seq_key or "max_length")), origin(seq_key or "max_length"))
        if as_bool(raw.get("packing", False), origin("packing")):
            out.set("batching", "pack", origin("packing"))
        else:
            out.notes.append(f"{path}: packing is off; without a length distribution (--lengths) memfit takes every "
                             f"sequence at {seq_key or 'max_length'} {seq} tokens (padding to the longest of a batch "
                             "can only be shorter)")
    if "packing" not in raw and as_bool(raw.get("group_by_length", False), origin("group_by_length")):
        out.set("batching", "bucket", origin("group_by_length"))
    mik = raw.get("model_init_kwargs")
    if isinstance(mik, dict):
        for k in ("torch_dtype", "dtype"):
            if mik.get(k) not in (None, "auto"):
                out.set("load_dtype", dtype_name(mik[k], f"{path}: model_init_kwargs.{k}"), f"{path}: model_init_kwargs.{k}")
    ds = raw.get("deepspeed")
    if ds:
        out.set("framework", "deepspeed", origin("deepspeed"))
        if isinstance(ds, dict):
            out.set("deepspeed_inline", ds, origin("deepspeed"))
        else:
            out.set("deepspeed", str(ds), origin("deepspeed"))
    fsdp = raw.get("fsdp")
    if fsdp:
        fcfg = raw.get("fsdp_config") or {}
        if isinstance(fcfg, str):
            fcfg = read_mapping(fcfg, "fsdp_config file")
        fcfg = {k[5:] if k.startswith("fsdp_") else k: v for k, v in fcfg.items()}
        version = as_int(fcfg.get("version", fsdp_version_default), origin("fsdp_config.version"))
        out.set("framework", "fsdp2" if version == 2 else "fsdp", origin("fsdp"))
        out.set("fsdp", _fsdp_settings(fsdp, fcfg, version, path), origin("fsdp_config"))
        if as_bool(fcfg.get("activation_checkpointing", False), origin("fsdp_config.activation_checkpointing")):
            out.values["gradient_checkpointing"] = True
    _eval_keys(raw, out, origin)
    ddp = {}
    if raw.get("ddp_find_unused_parameters") is not None:
        ddp["find_unused_parameters"] = as_bool(raw["ddp_find_unused_parameters"], origin("ddp_find_unused_parameters"))
    if raw.get("ddp_bucket_cap_mb") is not None:
        ddp["bucket_cap_mb"] = float(raw["ddp_bucket_cap_mb"])
    if raw.get("ddp_broadcast_buffers") is not None:
        ddp["broadcast_buffers"] = as_bool(raw["ddp_broadcast_buffers"], origin("ddp_broadcast_buffers"))
    if raw.get("ddp_static_graph") is not None:
        ddp["static_graph"] = as_bool(raw["ddp_static_graph"], origin("ddp_static_graph"))
    out.set("ddp_trainer", ddp, f"{path}: ddp_*")
    out.set("dataloader_pin_memory", as_bool(raw.get("dataloader_pin_memory", True), origin("dataloader_pin_memory")),
            origin("dataloader_pin_memory"))
    ignored = sorted(set(raw) - MEMORY_KEYS - SFT_KEYS)
    out.notes.append(f"{path} read as a {kind}" + (f"; {len(ignored)} key(s) that change no memory ignored "
                                                   f"({', '.join(ignored[:6])}{', ...' if len(ignored) > 6 else ''})"
                                                   if ignored else ""))
    return out


def _eval_keys(raw: dict[str, Any], out: Sourced, origin) -> None:  # noqa: ANN001
    """Evaluation and the empty_cache cadence (transformers 5.24 ``training_args.py`` /
    ``Seq2SeqTrainingArguments``; ``evaluation_strategy`` is the name before 4.46)."""
    key = "eval_strategy" if "eval_strategy" in raw else "evaluation_strategy" if "evaluation_strategy" in raw else None
    if key is not None:
        value = raw[key]
        strategy = "no" if value is False else str(value).lower().replace("intervalstrategy.", "")
        if strategy not in ("no", "steps", "epoch"):
            raise MemfitError(f"{origin(key)} must be no, steps or epoch, got {value!r}")
        out.set("eval_strategy", strategy, origin(key))
    for k, name in (("per_device_eval_batch_size", "eval_batch"), ("generation_max_length", "generation_max_length"),
                    ("generation_num_beams", "num_beams"), ("eval_steps", "eval_steps"),
                    ("torch_empty_cache_steps", "empty_cache_steps")):
        if raw.get(k) is not None:
            out.set(name, as_int(raw[k], origin(k)), origin(k))
    if raw.get("predict_with_generate") is not None:
        out.set("eval_generate", as_bool(raw["predict_with_generate"], origin("predict_with_generate")),
                origin("predict_with_generate"))


def _fsdp_settings(fsdp: Any, fcfg: dict[str, Any], version: int, path: str) -> dict[str, Any]:
    """transformers' ``_process_fsdp_args`` and ``_apply_legacy_fsdp_to_config`` into FsdpSettings fields."""
    items = fsdp.split() if isinstance(fsdp, str) else list(fsdp) if isinstance(fsdp, list) else []
    out: dict[str, Any] = {}
    for item in items:
        up = str(item).upper()
        if up in ("FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD", "NO_SHARD", "_HYBRID_SHARD_ZERO2"):
            out["sharding_strategy"] = up
        elif str(item).lower() == "offload":
            out["cpu_offload"] = True
    raf = fcfg.get("reshard_after_forward")
    if raf is not None:
        if version == 2:
            out["sharding_strategy"] = "FULL_SHARD" if as_bool(raf, f"{path}: fsdp_config.reshard_after_forward") \
                else "SHARD_GRAD_OP"
        else:
            out["sharding_strategy"] = str(raf).upper()
    if fcfg.get("cpu_offload") is not None:
        out["cpu_offload"] = as_bool(fcfg["cpu_offload"], f"{path}: fsdp_config.cpu_offload")
    policy = str(fcfg.get("auto_wrap_policy", "TRANSFORMER_BASED_WRAP")).upper()
    out["wrap_policy"] = {"TRANSFORMER_BASED_WRAP": "transformer", "SIZE_BASED_WRAP": "size", "NO_WRAP": "none"}.get(
        policy, "transformer")
    if fcfg.get("min_num_params"):
        out["min_num_params"] = as_int(fcfg["min_num_params"], f"{path}: fsdp_config.min_num_params")
    out["cpu_ram_efficient_loading"] = as_bool(str(fcfg.get("cpu_ram_efficient_loading", "false")),
                                               f"{path}: fsdp_config.cpu_ram_efficient_loading")
    if version == 1:
        out["backward_prefetch"] = str(fcfg.get("backward_prefetch", "NO_PREFETCH")).upper()
        out["forward_prefetch"] = as_bool(str(fcfg.get("forward_prefetch", "false")), f"{path}: forward_prefetch")
        out["use_orig_params"] = as_bool(str(fcfg.get("use_orig_params", "true")), f"{path}: use_orig_params")
        if "limit_all_gathers" in fcfg:
            out["limit_all_gathers"] = as_bool(str(fcfg["limit_all_gathers"]), f"{path}: limit_all_gathers")
    return out
