"""Output of ``memfit trace``: what is live at the forward and backward peaks, by category and module."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

GiB = 2**30
MiB = 2**20


def _size(n: int) -> str:
    return f"{n / GiB:,.3f} GiB" if n >= GiB // 4 else f"{n / MiB:,.1f} MiB"


def trace_to_dict(trace: Any, z3: Any = None) -> dict[str, Any]:
    def peak(p: Any) -> dict[str, Any]:
        return {
            "peak_bytes": p.peak_bytes, "module": p.module, "op": p.op,
            "by_category": {c: b for c, b in p.breakdown.by_category()},
            "by_module": [{"module": m.module, "category": m.category, "bytes": m.bytes} for m in p.by_module],
        }

    out: dict[str, Any] = {
        "architecture": trace.architecture, "method": trace.method,
        "options": {"seq_len": trace.options.seq_len, "micro_batch": trace.options.micro_batch,
                    "dtype": trace.options.dtype, "gradient_checkpointing": trace.options.gradient_checkpointing,
                    "attention": trace.options.attention, "zero3_linear": trace.options.zero3_linear},
        "params": {"total": trace.total_params, "trainable": trace.trainable_params,
                   "bytes": trace.param_bytes, "trainable_bytes": trace.trainable_param_bytes},
        "saved_bytes": trace.saved_bytes, "activation_bytes": trace.activation_bytes,
        "forward": peak(trace.forward), "backward": peak(trace.backward),
        "timings_s": {"build": trace.timings.build_s, "forward": trace.timings.forward_s,
                      "backward": trace.timings.backward_s},
    }
    if z3 is not None:
        out["zero3"] = {"peak_bytes": z3.peak_bytes, "phase": z3.phase, "module": z3.module, "moment": z3.moment,
                        "max_gathered_bytes": z3.max_gathered_bytes, "max_gathered_module": z3.max_gathered_module,
                        "max_gradient_bytes": z3.max_gradient_bytes, "first_step_peak_bytes": z3.first_step_peak_bytes,
                        "items": [{"key": i.key, "name": i.name, "bytes": i.bytes, "formula": i.formula} for i in z3.items]}
    return out


def render_trace(trace: Any, z3: Any, console: Console, *, top: int = 12) -> None:
    o = trace.options
    console.print(Text(f"memfit trace: {trace.architecture}, {trace.method}; micro-batch {o.micro_batch} x seq {o.seq_len}, "
                       f"{o.dtype}, {o.attention}" + (", gradient checkpointing" if o.gradient_checkpointing else "")
                       + (", ZeRO-3 Linear" if o.zero3_linear else ""), style="bold"))
    console.print(f"params {trace.total_params:,} ({trace.trainable_params:,} trained), {_size(trace.param_bytes)}; "
                  f"saved for backward at the end of forward: {_size(trace.saved_bytes)}; traced in "
                  f"{trace.timings.total_s:.1f} s")
    for name, p in (("forward", trace.forward), ("backward", trace.backward)):
        t = Table(title=f"{name} peak: {_size(p.peak_bytes)} at {p.op} in {p.module or '(model)'}", title_justify="left")
        t.add_column("category")
        t.add_column("bytes", justify="right")
        t.add_column("size", justify="right")
        for c, b in p.breakdown.by_category():
            if b:
                t.add_row(c, f"{b:,}", _size(b))
        console.print(t)
        m = Table(title=f"{name} peak: largest modules (what their code allocated and is still live)", title_justify="left")
        m.add_column("module")
        m.add_column("category")
        m.add_column("size", justify="right")
        for row in sorted(p.by_module, key=lambda r: -r.bytes)[:top]:
            m.add_row(row.module or "(model)", row.category, _size(row.bytes))
        console.print(m)
    if z3 is not None:
        console.print(Text(f"ZeRO-3 step: peak {_size(z3.peak_bytes)} on top of the model states, in {z3.phase} at "
                           f"{z3.module or '(model)'} ({z3.moment}); gathered params up to {_size(z3.max_gathered_bytes)} "
                           f"({z3.max_gathered_module}); full gradients up to {_size(z3.max_gradient_bytes)}", style="bold"))
        for i in z3.items:
            console.print(f"  {i.name}: {_size(i.bytes)}  ({i.formula})")
