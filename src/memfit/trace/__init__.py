"""Exact activation and training-step memory from the real model code, traced on fake tensors.

``trace_training_step`` (in ``memfit.trace.step``, imports torch, transformers and peft) runs one
forward, loss and backward under ``FakeTensorMode`` with an allocation tracker and returns a
``TraceResult``; ``zero3_step_memory`` (pure Python) replays ZeRO-3's parameter fetch/release and
gradient bucketing over the traced module order. Importing this package imports no torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from memfit.trace.results import (
    CATEGORIES,
    MemoryBreakdown,
    ModuleBytes,
    StepEvent,
    TracedModule,
    TracedParam,
    TraceOptions,
    TracePeak,
    TraceResult,
    TraceTimings,
)
from memfit.trace.deepspeed.zero3_step import Zero3StepPeak, zero3_step_memory

if TYPE_CHECKING:
    from memfit.trace.step import trace_training_step as trace_training_step


def __getattr__(name: str) -> Any:
    if name == "trace_training_step":
        from memfit.trace.step import trace_training_step

        return trace_training_step
    raise AttributeError(name)


__all__ = [
    "CATEGORIES",
    "MemoryBreakdown",
    "ModuleBytes",
    "StepEvent",
    "TraceOptions",
    "TracePeak",
    "TraceResult",
    "TraceTimings",
    "TracedModule",
    "TracedParam",
    "Zero3StepPeak",
    "trace_training_step",
    "zero3_step_memory",
]
