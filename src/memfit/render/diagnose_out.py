"""``memfit diagnose`` output: rich for the terminal, a dict for ``--json``. Sizes in GiB (2**30
bytes) with the exact bytes beside them; nothing is recomputed here."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from memfit.core.diagnose import Diagnosis, LogEvent, OomNumbers
from memfit.core.ledger_types import Device

SCHEMA_VERSION = 1
GiB = 2**30
_SEV = {"error": "bold red", "warning": "yellow", "info": "cyan"}
_DEV = {Device.GPU: "GPU", Device.CPU_PINNED: "CPU pinned", Device.CPU_PAGEABLE: "CPU pageable", Device.NVME: "NVMe"}
_VERDICT = {"predicted": ("the plan predicts this failure", "green"),
            "predicted_elsewhere": ("the plan predicts a failure, but elsewhere", "yellow"),
            "not_predicted": ("the plan does not predict this failure", "bold yellow")}
_NUMBERS = (  # (field, label) in the order torch prints them
    ("tried_to_allocate_bytes", "tried to allocate"),
    ("total_capacity_bytes", "total capacity"),
    ("free_bytes", "free"),
    ("allocated_bytes", "allocated by PyTorch (live tensors)"),
    ("reserved_bytes", "reserved by PyTorch"),
    ("reserved_unallocated_bytes", "reserved but unallocated"),
    ("private_pools_bytes", "in private pools (CUDA graphs)"),
    ("process_in_use_bytes", "this process in use (with non-PyTorch)"),
    ("allowed_bytes", "allowed (memory fraction)"),
)


def _gib(n: int | None) -> str:
    return "" if n is None else f"{n / GiB:,.2f}"


def _bytes(n: int | None) -> str:
    return "" if n is None else f"{n:,}"


# ------------------------------------------------------------------------------------------ JSON

def _numbers_dict(n: OomNumbers | None) -> dict[str, Any] | None:
    if n is None:
        return None
    d: dict[str, Any] = {name: getattr(n, name) for name, _ in _NUMBERS}
    d.update(other_processes_bytes=list(n.other_processes_bytes), outside_allocator_bytes=n.outside_allocator_bytes,
             precision_bytes=n.precision_bytes, form=n.form)
    return d


def _event_dict(e: LogEvent) -> dict[str, Any]:
    return {
        "kind": e.kind.value, "message": e.message, "line": e.line, "rank": e.rank, "host": e.host,
        "gpu_index": e.gpu_index, "numbers": _numbers_dict(e.numbers), "exit_code": e.exit_code,
        "detail": e.detail, "out_of_memory": e.out_of_memory,
        "frames": [{"path": f.path, "line": f.line, "function": f.function, "code": f.code} for f in e.frames],
    }


def diagnosis_to_dict(d: Diagnosis) -> dict[str, Any]:
    """The JSON form (schema version 1): byte counts are integers, nothing is rounded."""
    from memfit import __version__

    r = d.reconciliation
    rec = None
    if r is not None:
        f = r.plan_failure
        rec = {
            "scenario": r.scenario_name, "phase": r.phase, "phase_basis": r.phase_basis, "device": r.device,
            "rows": [{"label": x.label, "log_bytes": x.log_bytes, "plan_bytes": x.plan_bytes, "note": x.note}
                     for x in r.rows],
            "items": [{"key": it.key, "name": it.name, "device": it.device.value, "bytes": it.bytes,
                       "formula": it.formula, "source": it.source, "exact": it.exact} for it in r.items],
            "plan_verdict": r.plan_verdict,
            "plan_failure": None if f is None else {"phase": f.phase, "device": f.device,
                                                    "needed_bytes": f.needed_bytes,
                                                    "available_bytes": f.available_bytes},
            "lines": list(r.lines),
        }
    fr = d.phase_frame
    return {
        "schema_version": SCHEMA_VERSION,
        "memfit_version": __version__,
        "headline": d.headline,
        "primary": None if d.primary is None else _event_dict(d.primary),
        "events": [_event_dict(e) for e in d.events],
        "phase": d.phase,
        "phase_reason": d.phase_reason,
        "phase_source": d.phase_source,
        "phase_frame": None if fr is None else {"path": fr.path, "line": fr.line, "function": fr.function,
                                                "code": fr.code},
        "deepspeed_version": d.deepspeed_version,
        "torch_version": d.torch_version,
        "explanation": list(d.explanation),
        "fixes": list(d.fixes),
        "reconciliation": rec,
        "findings": [{"id": f.id, "severity": f.severity, "message": f.message} for f in d.findings],
        "next_step": list(d.next_step),
    }


# -------------------------------------------------------------------------------------- terminal

def _summary(d: Diagnosis) -> Text:
    t = Text()

    def row(label: str, value: str, style: str = "", note: str = "") -> None:
        t.append(f"{label:<9}", style="bold")
        t.append(value, style=style)
        if note:
            t.append(f"  {note}", style="dim")
        t.append("\n")

    e = d.primary
    if e is not None:
        who = f", rank {e.rank}" if e.rank is not None else (f", host {e.host}" if e.host else "")
        row("error", e.message)
        row("", f"(log line {e.line}{who}" + (f"; {e.detail}" if e.detail else "") + ")", style="dim")
    row("phase", d.phase or "unknown", style="bold red" if d.phase else "yellow", note=f"[{d.phase_source}]")
    if d.phase_reason:
        row("why", d.phase_reason)
    if d.phase_frame is not None:
        row("frame", f"{d.phase_frame.short_path}:{d.phase_frame.line} in {d.phase_frame.function}")
    versions = [v for v in (f"DeepSpeed {d.deepspeed_version}" if d.deepspeed_version else "",
                            f"torch {d.torch_version}" if d.torch_version else "") if v]
    if versions:
        row("log from", ", ".join(versions))
    t.rstrip()
    return t


def _numbers_table(n: OomNumbers) -> Table:
    t = Table(title=f"Figures in the message ({n.form}; GiB = 2^30 B, each exact to +/- {n.precision_bytes:,} B "
                    f"as printed)", title_justify="left")
    t.add_column("figure")
    t.add_column("GiB", justify="right")
    t.add_column("bytes", justify="right")
    for name, label in _NUMBERS:
        v = getattr(n, name)
        if v is not None:
            t.add_row(label, _gib(v), _bytes(v))
    for i, v in enumerate(n.other_processes_bytes):
        t.add_row(f"process {i + 1} in use", _gib(v), _bytes(v))
    if n.outside_allocator_bytes is not None:
        t.add_row(Text("outside this process's allocator (total - free - reserved)", style="dim"),
                  _gib(n.outside_allocator_bytes), _bytes(n.outside_allocator_bytes))
    return t


def _bullets(title: str, lines: tuple[str, ...], console: Console) -> None:
    if not lines:
        return
    console.print(Text(title, style="bold"))
    for s in lines:
        console.print(Text("  - ") + Text(s))


def render_diagnosis(d: Diagnosis, console: Console) -> None:
    console.print(Panel(_summary(d), title=Text(f"memfit diagnose: {d.headline}"), title_align="left"))
    e = d.primary
    if e is not None and e.numbers is not None:
        console.print(_numbers_table(e.numbers))
    _bullets("What it means", d.explanation, console)
    _bullets("Usual fixes", d.fixes, console)
    r = d.reconciliation
    if r is not None:
        console.print()
        where = "GPU, per rank" if r.device == "gpu" else "host RAM, per node unless the row says otherwise"
        t = Table(title=f"Log vs plan ({r.scenario_name}), phase {r.phase} ({r.phase_basis}); {where}; GiB",
                  title_justify="left")
        t.add_column("")
        t.add_column("log", justify="right")
        t.add_column("plan", justify="right")
        t.add_column("note", style="dim")
        for row in r.rows:
            t.add_row(row.label, _gib(row.log_bytes), _gib(row.plan_bytes), row.note)
        console.print(t)
        it = Table(title=f"What the plan has live at the {r.phase} peak ({'GPU' if r.device == 'gpu' else 'host'}, "
                         f"per rank)",
                   title_justify="left")
        it.add_column("item")
        it.add_column("where")
        it.add_column("GiB", justify="right")
        it.add_column("bytes", justify="right")
        it.add_column("DeepSpeed code", overflow="fold", style="dim")
        for x in r.items:
            it.add_row(x.name + ("" if x.exact else " (estimate)"), _DEV[x.device], _gib(x.bytes), _bytes(x.bytes),
                       x.source)
        console.print(it)
        label, style = _VERDICT[r.plan_verdict]
        console.print(Text(f"Verdict: {label}.", style=style))
        for s in r.lines:
            console.print(Text("  - ") + Text(s))
    others = [x for x in d.events if x is not e]
    if others:
        console.print()
        t = Table(title="Other events in the log", title_justify="left")
        t.add_column("line", justify="right")
        t.add_column("kind")
        t.add_column("rank")
        t.add_column("message", overflow="fold")
        for x in others:
            t.add_row(str(x.line), x.kind.value, "" if x.rank is None else str(x.rank), x.message)
        console.print(t)
    console.print()
    console.print(Text("Findings", style="bold"))
    for f in d.findings:
        console.print(Text(f"[{f.severity}] ", style=_SEV.get(f.severity, "")) + Text(f.message))
    if d.next_step:
        console.print()
        _bullets("Next step", d.next_step, console)
