"""A Hugging Face ``TrainingArguments`` or TRL ``SFTConfig`` file (JSON or YAML) as scenario settings.

What changes memory, with the defaults of transformers 5.24 (``training_args.py``) for keys the file
leaves out: ``per_device_train_batch_size`` (8), ``gradient_accumulation_steps`` (1),
``gradient_checkpointing``/``activation_checkpointing`` (off), ``bf16``/``fp16`` (off: fp32),
``optim`` (``adamw_torch_fused`` on torch >= 2.8), ``optim_args``, ``weight_decay`` (0),
``max_grad_norm`` (1), ``fsdp``/``fsdp_config`` (FSDP2 unless ``version: 1``), ``deepspeed``
(a path or an inline config), ``ddp_find_unused_parameters`` (the Trainer passes ``not
gradient_checkpointing`` for a transformers model, memfit assumes a PEFT or transformers model the
way the Trainer wraps it), ``ddp_bucket_cap_mb``, ``ddp_broadcast_buffers``, ``ddp_static_graph``,
``use_cpu`` (a CPU run: planned with the CPU accelerator), ``dataloader_pin_memory`` (on: batches
in page-locked memory), ``train_sampling_strategy:
group_by_length`` (older releases' ``group_by_length: true``).

A TRL ``SFTConfig`` (recognised by its own keys: ``max_length``, ``max_seq_length``, ``packing``,
``dataset_text_field``, ``model_init_kwargs``, ...) has other defaults (TRL ``trl/trainer/
sft_config.py``): ``gradient_checkpointing`` on, ``bf16`` on unless ``fp16``, ``max_length`` 1024
(the sequence length; older TRL's ``max_seq_length``), ``model_init_kwargs.torch_dtype``/``dtype``
the load dtype. Without ``packing`` memfit takes every sequence at ``max_length`` (padding to the
longest in a batch can only be shorter) and says so.

Every key is checked: one transformers/TRL do not have is refused with the key it most likely
misspells (``TrainingArguments(**d)`` refuses it too); keys of older releases are read and named;
wrong types and values are one line naming the file, the key and the valid values; a key that
changes memory in a way memfit does not model is a warning.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from memfit.core.frameworks.pytorch import OPTIMIZERS
from memfit.core.inputs.common import (Sourced, as_bool, as_choice, as_float, as_int, as_mapping, check_keys,
                                       dtype_name, read_mapping)
from memfit.core.inputs.keys import (LEGACY_SFT_KEYS, LEGACY_TRAINING_ARGS_KEYS, SEQ2SEQ_TRAINING_ARGS_KEYS,
                                     SFT_CONFIG_KEYS, TRAINING_ARGS_KEYS, TRAINING_ARGS_TYPES)
from memfit.errors import MemfitError

SFT_KEYS = SFT_CONFIG_KEYS | LEGACY_SFT_KEYS
"""Keys that make a file a TRL ``SFTConfig`` (``TrainingArguments`` has none of them)."""

READ_KEYS = {"per_device_train_batch_size", "per_gpu_train_batch_size", "gradient_accumulation_steps",
             "gradient_checkpointing", "activation_checkpointing", "bf16", "fp16", "optim", "optim_args",
             "weight_decay", "max_grad_norm", "fsdp", "fsdp_config", "deepspeed", "ddp_find_unused_parameters",
             "ddp_bucket_cap_mb", "ddp_broadcast_buffers", "ddp_static_graph", "max_length", "max_seq_length",
             "packing", "model_init_kwargs", "use_cpu", "no_cuda", "group_by_length", "train_sampling_strategy",
             "dataloader_pin_memory",
             # evaluation and the epoch (core/scenario/run_settings.py)
             "eval_strategy", "evaluation_strategy", "per_device_eval_batch_size", "predict_with_generate",
             "generation_max_length", "generation_num_beams", "eval_steps", "torch_empty_cache_steps"}
"""The keys memfit reads (each changes a figure of the plan)."""

NOT_MODELLED = {
    "torch_compile": "torch.compile changes which activations are saved",
    "auto_find_batch_size": "the Trainer halves the batch after an OOM until it fits",
    "use_liger_kernel": "Liger kernels fuse the loss and other ops (less activation memory)",
    "liger_kernel_config": "Liger kernels fuse the loss and other ops (less activation memory)",
    "activation_offloading": "TRL moves saved activations to the host",
    "padding_free": "padding-free batches change the token count per batch",
    "optim_target_modules": "GaLore/APOLLO-style optimizers keep projected states",
    "parallelism_config": "tensor/context parallelism is not planned",
    "gradient_checkpointing_kwargs": "use_reentrant and checkpointing options change the recompute's transients",
}
"""Keys that change memory in a way memfit does not model: a warning when set (to a non-default)."""

TRAINER_SAMPLING = ("random", "sequential", "group_by_length", "batch_rebalance")


def _kind(raw: dict[str, Any]) -> str:
    return "SFTConfig" if SFT_KEYS & set(raw) else "TrainingArguments"


def read_training_args(path: str, *, fsdp_version_default: int = 2,
                       optim_default: tuple[str, str] | None = None,
                       cpu_ram_loading: tuple[bool, str] = (True, "")) -> Sourced:
    """``fsdp_version_default``: FSDP version when ``fsdp_config`` gives none (transformers 5.x: 2;
    4.x has no version key and runs FSDP1; ``memfit.core.stack.resolve.trainer_fsdp_version``).
    ``optim_default``: ``(optim, why)``, the Trainer's default ``optim`` for the stack's transformers
    and torch (``memfit.core.stack.resolve.trainer_optim_default``), when the file leaves it out.
    ``cpu_ram_loading``: ``(reads, why)``, whether the stack's TrainingArguments reads
    ``fsdp_config.cpu_ram_efficient_loading`` (from transformers 4.41;
    ``memfit.core.stack.resolve.trainer_cpu_ram_loading``)."""
    raw = read_mapping(path, "TrainingArguments/SFTConfig file")
    out = Sourced(layer="training_args")
    kind = _kind(raw)
    sft = kind == "SFTConfig"
    check_keys(raw, TRAINING_ARGS_KEYS | SEQ2SEQ_TRAINING_ARGS_KEYS | LEGACY_TRAINING_ARGS_KEYS | SFT_KEYS, path,
               refuse=True, library="transformers' TrainingArguments/Seq2SeqTrainingArguments"
               + (" / TRL's SFTConfig" if sft else ""))

    def where(key: str) -> str:
        return f"{path}: {key}" if key in raw else f"{path}: {key} ({kind} default)"

    def give(name: str, value: Any, key: str, *, default: bool | None = None) -> None:
        out.set(name, value, where(key), default=(key not in raw) if default is None else default)

    micro_key = "per_gpu_train_batch_size" if raw.get("per_gpu_train_batch_size") is not None else \
        "per_device_train_batch_size"
    give("micro_batch", as_int(raw.get(micro_key, 8), where(micro_key)), micro_key)
    give("grad_accum", as_int(raw.get("gradient_accumulation_steps", 1), where("gradient_accumulation_steps")),
         "gradient_accumulation_steps")
    ckpt_key = "activation_checkpointing" if raw.get("activation_checkpointing") is not None else "gradient_checkpointing"
    ckpt = raw.get(ckpt_key)
    ckpt = sft if ckpt is None else as_bool(ckpt, where(ckpt_key))  # SFTConfig: gradient_checkpointing=True
    # off is no opinion (accelerate's FSDP activation checkpointing still applies); on is
    give("gradient_checkpointing", ckpt, ckpt_key, default=not ckpt)
    fp16 = as_bool(raw.get("fp16", False), where("fp16"))
    bf16_raw = raw.get("bf16")
    bf16 = (sft and not fp16) if bf16_raw is None else as_bool(bf16_raw, where("bf16"))  # SFTConfig: bf16 unless fp16
    if bf16 and fp16:
        raise MemfitError(f"{path}: bf16 and fp16 are both true (TrainingArguments refuses that: at most one)")
    if bf16 or fp16:  # TrainingArguments.__post_init__: fp16/bf16 set the mixed precision (over accelerate's)
        key = "bf16" if bf16 else "fp16"
        out.set("mixed_precision", "bf16" if bf16 else "fp16",
                where(key) if key in raw else f"{path}: bf16 (SFTConfig default: bf16 unless fp16)")
    else:
        out.set("mixed_precision", "no", where("bf16"), default=True)
    if "optim" not in raw and optim_default is not None:  # the Trainer's default follows the stack
        out.notes.append(f"optim {optim_default[0]}: {optim_default[1]}")
    optim = raw.get("optim", optim_default[0] if optim_default is not None else "adamw_torch_fused")
    if not isinstance(optim, str) or optim not in OPTIMIZERS:
        raise MemfitError(f"{where('optim')}: invalid value {optim!r:.60} (or not one memfit models); valid: "
                          f"{', '.join(OPTIMIZERS)}")
    give("optim", optim, "optim")
    if raw.get("optim_args"):
        args = {}
        text = raw["optim_args"]
        if not isinstance(text, str):
            raise MemfitError(f"{where('optim_args')}: invalid value {text!r:.60}; valid: a string such as "
                              "'momentum=0.9,beta1=0.9'")
        for part in text.replace(" ", "").split(","):
            if "=" in part:
                k, v = part.split("=", 1)
                if k in ("momentum", "beta1"):
                    args[k] = as_float(v, f"{where('optim_args')} {k}", maximum=1.0)
        if args:
            give("optim_args", args, "optim_args")
    for key in ("weight_decay", "max_grad_norm"):
        if key in raw:
            give(key, as_float(raw[key], where(key)), key)
    _sequence(raw, out, path, sft, where)
    _load_dtype(raw, out, path)
    _framework(raw, out, path, where, fsdp_version_default, cpu_ram_loading)
    _eval_keys(raw, out, where)
    _ddp(raw, out, path, where)
    give("dataloader_pin_memory", as_bool(raw.get("dataloader_pin_memory", True), where("dataloader_pin_memory")),
         "dataloader_pin_memory")
    for key in ("use_cpu", "no_cuda"):
        if raw.get(key) is not None and as_bool(raw[key], where(key)):
            give("accelerator", "cpu", key)
    legacy = sorted(k for k in raw if k in LEGACY_TRAINING_ARGS_KEYS | LEGACY_SFT_KEYS)
    for key in sorted(set(raw) - READ_KEYS):
        _field_type(key, raw[key], where(key))
    for key in sorted(set(raw) & set(NOT_MODELLED)):
        value = raw[key]
        if value in (None, False, 0, "", [], {}) or (key == "gradient_checkpointing_kwargs" and not ckpt):
            continue
        out.warnings.append(f"{path}: {key} = {value!r:.40} is read but not modelled ({NOT_MODELLED[key]}): the plan "
                            "is made without it")
    ignored = sorted(set(raw) - READ_KEYS - set(NOT_MODELLED) - set(legacy))
    out.notes.append(f"{path} read as a {kind}" + (f"; {len(ignored)} key(s) that change no memory ignored "
                                                   f"({', '.join(ignored[:6])}{', ...' if len(ignored) > 6 else ''})"
                                                   if ignored else "")
                     + (f"; keys of an older transformers/TRL release: {', '.join(legacy)}" if legacy else ""))
    return out


def _sequence(raw: dict[str, Any], out: Sourced, path: str, sft: bool, where) -> None:
    seq_key = "max_length" if "max_length" in raw else "max_seq_length" if "max_seq_length" in raw else None
    if seq_key or sft:
        seq = raw.get(seq_key) if seq_key else 1024
        if seq is None:
            raise MemfitError(f"{where(seq_key or 'max_length')} is null (no truncation): give the sequence length "
                              "with --seq-len")
        out.set("seq_len", as_int(seq, where(seq_key or "max_length")), where(seq_key or "max_length"),
                default=seq_key is None)
        if as_bool(raw.get("packing", False), where("packing")):
            out.set("batching", "pack", where("packing"))
        else:
            out.notes.append(f"{path}: packing is off; without a length distribution (--lengths) memfit takes every "
                             f"sequence at {seq_key or 'max_length'} {seq} tokens (padding to the longest of a batch "
                             "can only be shorter)")
    if "packing" in raw and raw.get("packing") is not False:
        return
    strategy = raw.get("train_sampling_strategy")
    if strategy is not None:
        if as_choice(strategy, where("train_sampling_strategy"), TRAINER_SAMPLING) == "group_by_length":
            out.set("batching", "bucket", where("train_sampling_strategy"))
    elif raw.get("group_by_length") is not None and as_bool(raw["group_by_length"], where("group_by_length")):
        out.set("batching", "bucket", where("group_by_length"))


def _load_dtype(raw: dict[str, Any], out: Sourced, path: str) -> None:
    mik = raw.get("model_init_kwargs")
    if mik is None:
        return
    mik = as_mapping(mik, f"{path}: model_init_kwargs")
    for k in ("torch_dtype", "dtype"):
        if mik.get(k) not in (None, "auto"):
            out.set("load_dtype", dtype_name(mik[k], f"{path}: model_init_kwargs.{k}"), f"{path}: model_init_kwargs.{k}")


def _framework(raw: dict[str, Any], out: Sourced, path: str, where, fsdp_version_default: int = 2,
               cpu_ram_loading: tuple[bool, str] = (True, "")) -> None:
    ds = raw.get("deepspeed")
    if ds:
        out.set("framework", "deepspeed", where("deepspeed"))
        if isinstance(ds, dict):
            out.set("deepspeed_config", ("inline", ds), where("deepspeed"))
        elif isinstance(ds, str):
            out.set("deepspeed_config", ("path", _abs(relative_path(ds, path))), where("deepspeed"))
        else:
            raise MemfitError(f"{where('deepspeed')}: invalid value {ds!r:.60}; valid: a path to a DeepSpeed JSON or "
                              "an inline config")
    fsdp = raw.get("fsdp")
    if fsdp:
        fcfg = raw.get("fsdp_config") or {}
        if isinstance(fcfg, str):
            fcfg = read_mapping(relative_path(fcfg, path), "fsdp_config file")
        fcfg = as_mapping(fcfg, where("fsdp_config"))
        fcfg = {k[5:] if k.startswith("fsdp_") else k: v for k, v in fcfg.items()}
        version = as_int(fcfg.get("version", fsdp_version_default), where("fsdp_config.version"), maximum=2)
        out.set("framework", "fsdp2" if version == 2 else "fsdp", where("fsdp"))
        for key, value in _fsdp_settings(fsdp, fcfg, version, path).items():
            out.set(f"fsdp.{key}", value, where("fsdp_config" if key != "sharding_strategy" else "fsdp"))
        reads, why = cpu_ram_loading
        if not reads:  # the launcher's value (an accelerate config's), else accelerate's false
            if "cpu_ram_efficient_loading" in fcfg:
                out.warnings.append(f"{where('fsdp_config.cpu_ram_efficient_loading')} is ignored: {why}")
            out.set("fsdp.cpu_ram_efficient_loading", False, f"{path}: fsdp_config.cpu_ram_efficient_loading ({why})",
                    default=True)
            out.notes.append(f"fsdp cpu_ram_efficient_loading: {why}")
        if fcfg.get("activation_checkpointing") is not None and \
                as_bool(fcfg["activation_checkpointing"], where("fsdp_config.activation_checkpointing")):
            out.set("gradient_checkpointing", True, where("fsdp_config.activation_checkpointing"))


def _ddp(raw: dict[str, Any], out: Sourced, path: str, where) -> None:
    for key, name in (("ddp_find_unused_parameters", "find_unused_parameters"),
                      ("ddp_broadcast_buffers", "broadcast_buffers"), ("ddp_static_graph", "static_graph")):
        if raw.get(key) is not None:
            out.set(f"ddp.{name}", as_bool(raw[key], where(key)), where(key))
    if raw.get("ddp_bucket_cap_mb") is not None:
        out.set("ddp.bucket_cap_mb", as_float(raw["ddp_bucket_cap_mb"], where("ddp_bucket_cap_mb"), minimum=1e-6,
                                              maximum=2**40), where("ddp_bucket_cap_mb"))
    out.set("ddp_trainer", True, f"{path}: the Trainer's DDP wrapping", default=True)


def _abs(path: str) -> str:
    import os

    return os.path.normpath(os.path.abspath(path))


def relative_path(value: str, beside: str) -> str:
    """A path a file names (a DeepSpeed JSON in TrainingArguments, an accelerate config's
    ``deepspeed_config_file``): as written if absolute or if it exists from the current directory
    (where the training script runs), else beside the file that names it."""
    p = Path(value)
    try:
        if p.is_absolute() or p.exists():
            return value
    except (OSError, ValueError):  # a name too long, a NUL byte: the reader that opens it says so
        return value
    return str(Path(beside).parent / value)


_FSDP1_STRATEGIES = ("FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD", "NO_SHARD", "_HYBRID_SHARD_ZERO2")
_WRAP = {"TRANSFORMER_BASED_WRAP": "transformer", "SIZE_BASED_WRAP": "size", "NO_WRAP": "none"}
_PREFETCH = ("BACKWARD_PRE", "BACKWARD_POST", "NO_PREFETCH")


_KIND_WORDS = {"bool": "true or false", "int": "a whole number", "float": "a number", "str": "a string",
               "dict": "a mapping", "list": "a list", "null": "null"}


def _field_type(key: str, value: Any, where: str) -> None:
    """A key memfit does not read still has the type transformers' annotation gives it
    (``keys.TRAINING_ARGS_TYPES``), or the Trainer fails on it mid-run: refused here. Strings are read
    as argparse (and TRL's YAML parser) reads them: "true"/"false", digits, a number."""
    kinds = TRAINING_ARGS_TYPES.get(key)
    if kinds is None or _admits(value, kinds):
        return
    words = [_KIND_WORDS[k] for k in kinds if not (k == "int" and "float" in kinds)]
    raise MemfitError(f"{where}: invalid value {value!r:.60}; valid: {' or '.join(words)} "
                      "(transformers' TrainingArguments type)")


def _admits(value: Any, kinds: tuple[str, ...]) -> bool:
    if value is None:
        return "null" in kinds
    if isinstance(value, bool):
        return "bool" in kinds
    if isinstance(value, str):
        text = value.strip().lower()
        if "str" in kinds or ("bool" in kinds and text in ("true", "false")):
            return True
        if "float" in kinds and len(text) <= 64:
            try:
                return math.isfinite(float(text))
            except ValueError:
                return False
        return "int" in kinds and len(text) <= 30 and text.lstrip("-").isdigit()
    if isinstance(value, int):
        return "int" in kinds or "float" in kinds
    if isinstance(value, float):
        return ("float" in kinds and math.isfinite(value)) or ("int" in kinds and value.is_integer())
    if isinstance(value, dict):
        return "dict" in kinds
    return isinstance(value, list) and "list" in kinds


def _eval_keys(raw: dict[str, Any], out: Sourced, origin) -> None:  # noqa: ANN001
    """Evaluation and the empty_cache cadence (transformers 5.24 ``training_args.py`` /
    ``Seq2SeqTrainingArguments``; ``evaluation_strategy`` is the name before 4.46)."""
    key = "eval_strategy" if "eval_strategy" in raw else "evaluation_strategy" if "evaluation_strategy" in raw else None
    if key is not None:
        value = raw[key]
        strategy = "no" if value is False else str(value).lower().replace("intervalstrategy.", "") \
            if isinstance(value, str) else value
        out.set("eval_strategy", as_choice(strategy, origin(key), ("no", "steps", "epoch")), origin(key))
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
    if isinstance(fsdp, str):
        items = fsdp.split()
    elif isinstance(fsdp, list) and all(isinstance(i, str) for i in fsdp):
        items = list(fsdp)
    elif fsdp is True:
        items = ["full_shard"]
    else:
        raise MemfitError(f"{path}: fsdp: invalid value {fsdp!r:.60}; valid: a string or list of full_shard, "
                          "shard_grad_op, hybrid_shard, no_shard, offload, auto_wrap")
    out: dict[str, Any] = {}
    for item in items:
        up = item.upper()
        if up in _FSDP1_STRATEGIES:
            out["sharding_strategy"] = up
        elif item.lower() == "offload":
            out["cpu_offload"] = True
        elif item.lower() != "auto_wrap":
            raise MemfitError(f"{path}: fsdp: invalid option {item!r:.40}; valid: full_shard, shard_grad_op, "
                              "hybrid_shard, hybrid_shard_zero2, no_shard, offload, auto_wrap")
    raf = fcfg.get("reshard_after_forward")
    if raf is not None:
        if version == 2:
            out["sharding_strategy"] = "FULL_SHARD" if as_bool(raf, f"{path}: fsdp_config.reshard_after_forward") \
                else "SHARD_GRAD_OP"
        else:
            out["sharding_strategy"] = as_choice(raf, f"{path}: fsdp_config.reshard_after_forward", _FSDP1_STRATEGIES,
                                                 fold=str.upper)
    if fcfg.get("cpu_offload") is not None:
        out["cpu_offload"] = as_bool(fcfg["cpu_offload"], f"{path}: fsdp_config.cpu_offload")
    policy = as_choice(fcfg.get("auto_wrap_policy", "TRANSFORMER_BASED_WRAP"), f"{path}: fsdp_config.auto_wrap_policy",
                       _WRAP, fold=str.upper)
    out["wrap_policy"] = _WRAP[policy]
    if fcfg.get("min_num_params"):
        out["min_num_params"] = as_int(fcfg["min_num_params"], f"{path}: fsdp_config.min_num_params", minimum=0)
    out["cpu_ram_efficient_loading"] = as_bool(fcfg.get("cpu_ram_efficient_loading", "false"),
                                               f"{path}: fsdp_config.cpu_ram_efficient_loading")
    if version == 1:
        out["backward_prefetch"] = as_choice(fcfg.get("backward_prefetch", "NO_PREFETCH"),
                                             f"{path}: fsdp_config.backward_prefetch", _PREFETCH, fold=str.upper)
        out["forward_prefetch"] = as_bool(fcfg.get("forward_prefetch", "false"), f"{path}: fsdp_config.forward_prefetch")
        out["use_orig_params"] = as_bool(fcfg.get("use_orig_params", "true"), f"{path}: fsdp_config.use_orig_params")
        if "limit_all_gathers" in fcfg:
            out["limit_all_gathers"] = as_bool(fcfg["limit_all_gathers"], f"{path}: fsdp_config.limit_all_gathers")
    return out
