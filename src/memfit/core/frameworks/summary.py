"""One line describing how a non-DeepSpeed scenario trains (for renderers and reports)."""

from __future__ import annotations

from memfit.core.scenario.types import Scenario

_PRECISION = {"fp32": "fp32", "amp_fp16": "AMP fp16 (autocast + GradScaler, fp32 weights)",
              "amp_bf16": "AMP bf16 (autocast, fp32 weights)", "fp16": "pure fp16", "bf16": "pure bf16"}


def describe_framework(sc: Scenario) -> str:
    ts = sc.torch
    parts = [sc.framework, _PRECISION[ts.precision], f"optim {ts.optim}"]
    if ts.gradient_accumulation_steps > 1:
        parts.append(f"gradient accumulation {ts.gradient_accumulation_steps}")
    q = sc.quant
    if q.method == "4bit":
        parts.append(f"bitsandbytes 4-bit {q.quant_type}{' + double quant' if q.double_quant else ''} "
                     f"(compute {q.compute_dtype}, storage {q.quant_storage})")
    elif q.method == "8bit":
        parts.append("bitsandbytes LLM.int8()")
    if sc.framework == "ddp":
        d = sc.ddp
        parts.append(f"DDP buckets {d.bucket_cap_mb:g} MiB" + (", gradient_as_bucket_view" if d.gradient_as_bucket_view else ""))
    if sc.framework in ("fsdp", "fsdp2"):
        f = sc.fsdp
        parts.append(f"{f.sharding_strategy}, wrap {f.wrap_policy}" + (", CPU offload" if f.cpu_offload else "")
                     + (f", mixed precision {f.mixed_precision}" if f.mixed_precision != "none" else ""))
    return ", ".join(parts)
