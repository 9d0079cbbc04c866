"""Output of ``memfit replay``: predicted vs measured, per ledger item and per phase."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text


def _b(n: int | None) -> str:
    return "-" if n is None else f"{n:,}"


def comparison_to_dict(c: Any, m: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "case": m.spec.name, "ok": m.ok, "wall_s": m.wall_s, "versions": m.versions, "command": m.command,
        "substitutions": list(m.substitutions),
        "error": None if m.error is None else {"phase": m.error.phase, "kind": m.error.kind, "message": m.error.message},
    }
    if c is not None:
        out["items"] = [{"key": i.key, "at": i.at, "ledger_keys": list(i.ledger_keys), "predicted_bytes": i.predicted_bytes,
                         "measured_bytes": i.measured_bytes, "diff_bytes": i.diff_bytes,
                         "predicted_pinned_bytes": i.predicted_pinned_bytes,
                         "measured_pinned_bytes": i.measured_pinned_bytes, "deepspeed_pins": i.deepspeed_pins}
                        for i in c.items]
        out["missing_items"] = list(c.missing)
        out["unknown_items"] = list(c.unknown)
        out["phases"] = [{"phase": p.phase, "predicted_host_bytes": p.predicted_host_bytes,
                          "measured_host_bytes": p.measured_host_bytes, "diff_bytes": p.diff_bytes,
                          "rel_diff": p.rel_diff, "predicted_pinned_bytes": p.predicted_pinned_bytes,
                          "measured_pinned_bytes": p.measured_pinned_bytes, "predicted_gpu_bytes": p.predicted_gpu_bytes,
                          "measured_gpu_bytes": p.measured_gpu_bytes} for p in c.phases]
    return out


def render_comparison(c: Any, m: Any, console: Console) -> None:
    s = m.spec
    framework = getattr(s, "framework", "deepspeed")
    stack = (f"{m.versions.get('deepspeed', '?')} DeepSpeed" if framework == "deepspeed"
             else f"{'' if framework == 'torch' else framework + ' on '}torch {m.versions.get('torch', '?')}")
    console.print(Text(f"memfit replay: {s.name}: rank 0 of {s.world_size}, {s.accelerator}, "
                       f"{stack}, {m.wall_s:.1f} s", style="bold"))
    for note in m.substitutions:
        console.print(Text(f"note: {note}", style="dim"))
    if m.error is not None:
        console.print(Text(f"the run failed in phase {m.error.phase}: {m.error.kind}: {m.error.message}", style="bold red"))
    if c is None:
        return
    owner = "DeepSpeed's own buffers" if framework == "deepspeed" else "Sizes read off the objects"
    t = Table(title=f"{owner}: plan vs replay (bytes, per rank)", title_justify="left")
    for col in ("allocation", "read", "plan", "replay", "pinned plan", "pinned replay", "diff"):
        t.add_column(col, justify="left" if col in ("allocation", "read") else "right")
    for i in c.items:
        t.add_row(i.key, i.at, _b(i.predicted_bytes), _b(i.measured_bytes), _b(i.predicted_pinned_bytes),
                  _b(i.measured_pinned_bytes), Text(f"{i.diff_bytes:+,}", style="green" if i.matches else "red"))
    console.print(t)
    for key in c.missing:
        console.print(Text(f"not reported by the replay: {key}", style="red"))
    for key in c.unknown:
        console.print(Text(f"reported but not compared: {key}", style="red"))
    p = Table(title="Host tensor peak per phase: plan vs replay (bytes)", title_justify="left")
    for col in ("phase", "plan", "replay", "diff", "%", "pinned plan", "pinned replay"):
        p.add_column(col, justify="left" if col == "phase" else "right")
    for r in c.phases:
        p.add_row(r.phase, _b(r.predicted_host_bytes), _b(r.measured_host_bytes), f"{r.diff_bytes:+,}", f"{r.rel_diff:+.1%}",
                  _b(r.predicted_pinned_bytes), _b(r.measured_pinned_bytes))
    console.print(p)
    if any(r.measured_gpu_bytes is not None for r in c.phases):
        g = Table(title="GPU allocated peak per phase: plan vs replay (bytes)", title_justify="left")
        for col in ("phase", "plan", "replay"):
            g.add_column(col)
        for r in c.phases:
            g.add_row(r.phase, _b(r.predicted_gpu_bytes), _b(r.measured_gpu_bytes))
        console.print(g)
