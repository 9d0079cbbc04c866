"""Which framework a scenario trains with, and its settings, from what the user gave.

The framework is said (``framework:`` / ``--framework``) or inferred: a DeepSpeed JSON means
``deepspeed``; settings that only exist outside DeepSpeed (a precision mode, a Trainer ``optim``,
bitsandbytes quantization, DDP or FSDP settings) mean ``torch`` on one GPU, ``ddp`` on several (or
``fsdp`` when FSDP settings are given); with none of these, memfit keeps its historical default (a
ZeRO stage 0 DeepSpeed config). Contradictions are one line naming both sides (``MemfitError``).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from memfit.core.frameworks.pytorch import (FRAMEWORKS, DdpSettings, FsdpSettings, QuantSettings, TorchSettings)
from memfit.core.hardware import Hardware
from memfit.errors import MemfitError

_QUANT_KEYS = {f.name for f in fields(QuantSettings)}
_DDP_KEYS = {f.name for f in fields(DdpSettings)}
_FSDP_KEYS = {f.name for f in fields(FsdpSettings)}


@dataclass(frozen=True, slots=True, kw_only=True)
class FrameworkResolution:
    framework: str
    torch: TorchSettings
    quant: QuantSettings
    ddp: DdpSettings
    fsdp: FsdpSettings


def apply_input_files(inputs):
    """Inputs with the settings of a TrainingArguments/SFTConfig file, a BitsAndBytesConfig JSON and an
    accelerate config YAML merged in (``memfit.core.inputs``); unchanged when none is given."""
    if not (getattr(inputs, "training_args", None) or getattr(inputs, "accelerate_config", None)
            or getattr(inputs, "bnb_config", None)):
        return inputs
    from memfit.core.inputs import merge_input_files

    return merge_input_files(inputs)


def _settings(cls, raw: dict[str, Any] | None, allowed: set[str], what: str):
    raw = dict(raw or {})
    unknown = set(raw) - allowed
    if unknown:
        raise MemfitError(f"unknown {what} setting(s): {', '.join(sorted(unknown))} (known: {', '.join(sorted(allowed))})")
    if "skip_modules" in raw and raw["skip_modules"] is not None:
        raw["skip_modules"] = tuple(raw["skip_modules"])
    try:
        return cls(**{k: v for k, v in raw.items() if v is not None})
    except TypeError as e:
        raise MemfitError(f"{what}: {e}") from None


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
    fsdp = _settings(FsdpSettings, inputs.fsdp, _FSDP_KEYS, "fsdp")
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
        if quant.enabled:  # the DeepSpeed recipes partition by the param dtype; quant_storage is not modelled there
            raise MemfitError(f"bitsandbytes {quant.method} quantization under DeepSpeed is not modelled (ZeRO-3 would "
                              "shard the packed weights by bnb_4bit_quant_storage); plan QLoRA with framework torch, "
                              "ddp, fsdp or fsdp2, or drop the quantization")
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
