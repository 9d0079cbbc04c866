"""Which framework a scenario trains with, and its settings, from what the user gave.

The framework is said (``framework:`` / ``--framework``) or inferred: a DeepSpeed JSON means
``deepspeed``; settings that only exist outside DeepSpeed (a precision mode, a Trainer ``optim``,
bitsandbytes quantization, DDP or FSDP settings) mean ``torch`` on one GPU, ``ddp`` on several (or
``fsdp`` when FSDP settings are given); with none of these, memfit keeps its historical default (a
ZeRO stage 0 DeepSpeed config). Contradictions are one line naming both sides (``MemfitError``).
"""

from __future__ import annotations

import types
from collections.abc import Mapping
from dataclasses import fields
from typing import Any

from memfit.core.lean_dataclass import dataclass
from memfit.core.frameworks.pytorch import (FRAMEWORKS, DdpSettings, FsdpSettings, QuantSettings, TorchSettings)
from memfit.core.hardware import Hardware
from memfit.errors import MemfitError

_QUANT_KEYS = {f.name for f in fields(QuantSettings)}
_DDP_KEYS = {f.name for f in fields(DdpSettings)}
_FSDP_KEYS = {f.name for f in fields(FsdpSettings)}


@dataclass(frozen=True, slots=True, kw_only=True)
class FrameworkResolution:
    """The framework a scenario runs and its settings, resolved from the inputs."""

    framework: str
    torch: TorchSettings
    quant: QuantSettings
    ddp: DdpSettings
    fsdp: FsdpSettings


def apply_input_files(inputs):
    """Inputs with the settings of a TrainingArguments/SFTConfig file, a BitsAndBytesConfig JSON and an
    accelerate config YAML decided against the flags' and the scenario's by the one precedence rule
    (``memfit.core.inputs.merge``); run with no file too, so the same rules (the Trainer's optimizer
    under DeepSpeed) hold for flags alone."""
    from memfit.core.inputs import merge_input_files

    return merge_input_files(inputs)


def _settings(cls, raw: Any, allowed: set[str], what: str):
    """``cls`` (a settings dataclass) from a mapping, every value checked against its field's type:
    unknown keys with the known one they most likely misspell, booleans, finite numbers >= 0, whole
    numbers, names; one ``MemfitError`` line for anything else."""
    import typing

    from memfit.core.dsconfig.sections import did_you_mean
    from memfit.core.inputs.common import as_bool, as_float, as_int, as_names

    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise MemfitError(f"{what}: invalid value {raw!r:.60}; valid: a mapping of {', '.join(sorted(allowed))}")
    raw = dict(raw)
    unknown = sorted(str(k) for k in raw if k not in allowed)
    if unknown:
        hints = [k + (f" (did you mean {c}?)" if (c := did_you_mean(k, allowed)) else "") for k in unknown]
        raise MemfitError(f"unknown {what} setting(s): {', '.join(hints)} (known: {', '.join(sorted(allowed))})")
    hints = typing.get_type_hints(cls)
    out = {}
    for key, value in raw.items():
        if value is None:
            continue
        hint = hints[key]
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        kind = args[0] if typing.get_origin(hint) in (typing.Union, types.UnionType) and args else hint
        where = f"{what}.{key}"
        if kind is bool:
            out[key] = as_bool(value, where)
        elif kind is int:
            out[key] = as_int(value, where, minimum=0, maximum=2**62)
        elif kind is float:
            out[key] = as_float(value, where)
        elif typing.get_origin(kind) is tuple:
            out[key] = as_names(value, where)
        elif kind is str:
            if not isinstance(value, str):
                raise MemfitError(f"{where}: invalid value {value!r:.60}; valid: a name")
            out[key] = value
        else:
            out[key] = value
    return cls(**out)


def _number(value: Any, what: str, kind=float):
    if value is None:
        return None
    if isinstance(value, bool):
        raise MemfitError(f"{what} must be a number, got {value!r}")
    try:
        return kind(value)
    except (TypeError, ValueError):
        raise MemfitError(f"{what} must be a number, got {value!r}") from None


def resolve_framework_settings(inputs, hw: Hardware, *, has_deepspeed_json: bool) -> FrameworkResolution:
    quant = _settings(QuantSettings, inputs.quantization, _QUANT_KEYS, "quantization")
    if quant.enabled and (inputs.peft_method or "full") == "full":
        raise MemfitError("bitsandbytes quantization with full fine-tuning: a quantized base cannot be fully "
                          "fine-tuned (its weights get no gradient); use a PEFT method such as LoRA (QLoRA)")
    ddp = _settings(DdpSettings, inputs.ddp, _DDP_KEYS, "ddp")
    fsdp_raw = inputs.fsdp
    if isinstance(fsdp_raw, Mapping) and any(str(k).startswith("fsdp_") for k in fsdp_raw):  # accelerate's names
        from memfit.core.inputs.accelerate_config import fsdp_from_accelerate_keys

        fsdp_raw = fsdp_from_accelerate_keys(dict(fsdp_raw), "fsdp", framework=inputs.framework)
    fsdp = _settings(FsdpSettings, fsdp_raw, _FSDP_KEYS, "fsdp")
    fw = inputs.framework
    torch_only = [k for k, v in (("optim", inputs.optim), ("ddp", inputs.ddp), ("fsdp", inputs.fsdp)) if v is not None]
    if inputs.precision is not None and not (inputs.precision in ("fp16", "bf16", "fp32") and
                                             (has_deepspeed_json or fw == "deepspeed")):
        torch_only.insert(0, "precision")  # fp16/bf16/fp32 with DeepSpeed fill its "auto" (the Trainer's --fp16/--bf16)
    if fw is not None:
        if fw not in FRAMEWORKS:
            raise MemfitError(f"framework must be one of {', '.join(FRAMEWORKS)}, got {fw!r}")
        if fw != "deepspeed" and has_deepspeed_json:
            raise MemfitError(f"framework {fw} contradicts the DeepSpeed config given (a DeepSpeed JSON means "
                              "framework deepspeed); drop one of them")
        if fw == "deepspeed" and torch_only:
            raise MemfitError(f"framework deepspeed contradicts {', '.join(torch_only)} (DeepSpeed reads precision, "
                              "optimizer and parallelism from its JSON)")
    elif has_deepspeed_json:
        if torch_only:
            raise MemfitError(f"a DeepSpeed config contradicts {', '.join(torch_only)} (settings of the non-DeepSpeed "
                              "frameworks); DeepSpeed reads them from its JSON")
        fw = "deepspeed"
    elif inputs.fsdp is not None:
        fw = "fsdp"
    elif torch_only or quant.enabled:
        fw = "torch" if hw.world_size == 1 else "ddp"
    else:
        fw = "deepspeed"
    if fw == "torch" and hw.world_size > 1:
        raise MemfitError(f"framework torch trains on one GPU, but the hardware has {hw.world_size}; use framework "
                          "ddp, fsdp or fsdp2 (or one GPU)")
    if fw == "deepspeed":
        if quant.method == "8bit":
            raise MemfitError("bitsandbytes 8-bit (LLM.int8()) under DeepSpeed is not modelled; plan it with framework "
                              "torch or ddp, or use a 4-bit base (QLoRA), which memfit models under DeepSpeed")
        return FrameworkResolution(framework=fw, torch=TorchSettings(), quant=quant, ddp=ddp, fsdp=fsdp)
    precision = inputs.precision or "fp32"
    if precision in ("amp_bf16", "bf16") and not hw.gpu.bf16:
        raise MemfitError(f"precision {precision} needs bfloat16, which the {hw.gpu.name} does not have (Ampere or "
                          "newer); use amp_fp16 or fp32")
    opt_args = dict(inputs.optim_args or {})
    unknown = set(opt_args) - {"momentum", "beta1"}
    if unknown:
        raise MemfitError(f"unknown optim_args: {', '.join(sorted(unknown))} (known: beta1, momentum)")
    ts = TorchSettings(
        precision=precision, optim=inputs.optim or "adamw_torch",
        momentum=_number(opt_args.get("momentum"), "optim_args.momentum") or 0.0,
        beta1=_number(opt_args.get("beta1"), "optim_args.beta1"),
        weight_decay=_number(inputs.weight_decay, "weight_decay") or 0.0,
        gradient_accumulation_steps=_number(inputs.grad_accum, "gradient_accumulation_steps", int) or 1,
        max_grad_norm=1.0 if inputs.max_grad_norm is None else _number(inputs.max_grad_norm, "max_grad_norm"),
    )
    return FrameworkResolution(framework=fw, torch=ts, quant=quant, ddp=ddp, fsdp=fsdp)
