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
    out["summary"] = closing_line(c, m, None)
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


def _cell(n: int | None, gib: bool) -> str:
    """Bytes in full, or at narrow widths GiB with three decimals (the exact bytes are in --json)."""
    if n is None:
        return "-"
    return f"{n / 2**30:,.3f}" if gib else f"{n:,}"


def closing_line(c: Any, m: Any, plan_versions: str | None) -> str:
    """The replay's verdict on the plan in one line: the largest difference of a compared size and of
    a phase's host peak, and the versions compared."""
    stack = ", ".join(f"{k} {v}" for k, v in (m.versions or {}).items() if k in ("deepspeed", "torch", "transformers",
                                                                                   "peft", "bitsandbytes"))
    parts = []
    if c is not None and c.items:
        worst = max(c.items, key=lambda i: abs(i.diff_bytes))
        bad = sum(not i.matches for i in c.items)
        parts.append(f"largest size difference {worst.diff_bytes:+,} B ({worst.key} at {worst.at}); "
                     f"{len(c.items) - bad} of {len(c.items)} sizes match")
    if c is not None and c.phases:
        worst = max(c.phases, key=lambda p: abs(p.diff_bytes))
        parts.append(f"largest host-peak difference {worst.diff_bytes:+,} B ({worst.phase}, {worst.rel_diff:+.2%})")
    verdict = "; ".join(parts) if parts else "nothing to compare"
    return (f"replay vs plan: {verdict}. Replayed with {stack or 'the installed libraries'}"
            + (f", against {plan_versions}" if plan_versions else "") + ".")


def render_comparison(c: Any, m: Any, console: Console, *, plan_versions: str | None = None) -> None:
    """Predicted vs measured; byte counts are never cut: below 120 columns the sizes are GiB (exact
    bytes in ``--json``), the differences bytes."""
    s = m.spec
    gib = console.width < 120
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
        console.print(Text(closing_line(c, m, plan_versions), style="bold"))
        return
    unit = "GiB; exact bytes in --json" if gib else "bytes"
    owner = "DeepSpeed's own buffers" if framework == "deepspeed" else "Sizes read off the objects"
    from rich import box

    style = {"box": box.SIMPLE, "padding": (0, 1), "pad_edge": False} if gib else {}
    t = Table(title=f"{owner}: plan vs replay ({unit}, per rank; diff in bytes)", title_justify="left", **style)
    pin = ("pinned\nplan", "pinned\nreplay") if gib else ("pinned plan", "pinned replay")
    for col in ("allocation", "read", "plan", "replay", *pin, "diff"):
        if col in ("allocation", "read"):
            t.add_column(col, overflow="fold")
        else:
            t.add_column(col, justify="right", no_wrap=True)
    for i in c.items:
        t.add_row(i.key, i.at, _cell(i.predicted_bytes, gib), _cell(i.measured_bytes, gib),
                  _cell(i.predicted_pinned_bytes, gib), _cell(i.measured_pinned_bytes, gib),
                  Text(f"{i.diff_bytes:+,}", style="green" if i.matches else "red"))
    console.print(t)
    for key in c.missing:
        console.print(Text(f"not reported by the replay: {key}", style="red"))
    for key in c.unknown:
        console.print(Text(f"reported but not compared: {key}", style="red"))
    p = Table(title=f"Host tensor peak per phase: plan vs replay ({unit}; diff in bytes)", title_justify="left", **style)
    for col in ("phase", "plan", "replay", "diff", "%", *pin):
        if col == "phase":
            p.add_column(col, no_wrap=True)
        else:
            p.add_column(col, justify="right", no_wrap=True)
    for r in c.phases:
        p.add_row(r.phase, _cell(r.predicted_host_bytes, gib), _cell(r.measured_host_bytes, gib), f"{r.diff_bytes:+,}",
                  f"{r.rel_diff:+.1%}", _cell(r.predicted_pinned_bytes, gib), _cell(r.measured_pinned_bytes, gib))
    console.print(p)
    if any(r.measured_gpu_bytes is not None for r in c.phases):
        g = Table(title=f"GPU allocated peak per phase: plan vs replay ({unit})", title_justify="left", **style)
        for col in ("phase", "plan", "replay"):
            g.add_column(col, justify="left" if col == "phase" else "right", no_wrap=True)
        for r in c.phases:
            g.add_row(r.phase, _cell(r.predicted_gpu_bytes, gib), _cell(r.measured_gpu_bytes, gib))
        console.print(g)
    console.print(Text(closing_line(c, m, plan_versions), style="bold"))
