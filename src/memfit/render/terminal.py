"""Rich tables for the terminal. Sizes in GiB (2**30 bytes) unless a column says GB (10**9)."""

from __future__ import annotations

from rich import box
from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from memfit.core.ledger_types import PHASE_LABELS, Device, PhaseLedger, Plan
from memfit.core.scenario.types import Scenario
from memfit.core.units import fmt_bytes
from memfit.core.verdict import gpu_figure, host_figure
from memfit.render.assumptions import render_assumptions
from memfit.render.summary import summary, verdict_lines  # noqa: F401 (verdict_lines: the reports import it here)

GiB = 2**30
_SEV = {"error": "bold red", "warning": "yellow", "info": "cyan"}
_DEV = {Device.GPU: "GPU", Device.CPU_PINNED: "CPU pinned", Device.CPU_PAGEABLE: "CPU pageable", Device.NVME: "NVMe"}


def _gib(n: int) -> str:
    return f"{n / GiB:,.2f}"


def _bar(used: int, cap: int, width: int = 10) -> Text:
    """A bar of ``width`` cells and the percentage (just the percentage when width is 0)."""
    frac = used / cap if cap else 0.0
    full = min(int(round(frac * width)), width)
    style = "red" if frac > 1 else ("yellow" if frac > 0.9 else "green")
    bar = Text("█" * full, style=style) + Text("·" * (width - full), style="dim")
    return bar + Text(f"{' ' if width else ''}{frac * 100:3.0f}%", style=style)


def scenario_summary(sc: Scenario) -> Text:
    ds, z, hw, m = sc.deepspeed, sc.deepspeed.zero, sc.hardware, sc.model
    off = []
    if z.offload_optimizer.device != "none":
        off.append(f"optimizer->{z.offload_optimizer.device}{' (pinned)' if z.offload_optimizer.pin_memory else ''}")
    if z.offload_param.device != "none":
        off.append(f"params->{z.offload_param.device}{' (pinned)' if z.offload_param.pin_memory else ''}")
    lines = [
        f"model      {sc.model_ref} ({m.architecture}): {m.total_params:,} params, {m.trainable_params:,} trained, "
        f"{m.frozen_params:,} frozen; largest {m.largest_param.name} {m.largest_param.numel:,}",
        f"method     {sc.peft.method}",
        (f"deepspeed  {sc.ds_version}.x, ZeRO stage {z.stage}, {ds.precision}, {ds.optimizer.type}"
         + (f", offload {', '.join(off)}" if off else ", no offload")) if sc.framework == "deepspeed"
        else framework_line(sc),
        f"load       from_pretrained {sc.load.dtype}" + (", under zero.Init" if sc.load.zero_init else ", not under zero.Init")
        + ("" if sc.load.low_cpu_mem_usage else ", low_cpu_mem_usage=False"),
        f"step       micro-batch {sc.train.micro_batch} x seq {sc.train.seq_len}"
        + (", gradient checkpointing" if sc.train.gradient_checkpointing else ""),
        f"hardware   {hw.nodes} node(s) x {hw.gpus_per_node} x {hw.gpu.name} ({fmt_bytes(hw.gpu.total_bytes)} each), "
        f"{fmt_bytes(hw.cpu_ram_bytes)} RAM" + (f" + {fmt_bytes(hw.swap_bytes)} swap" if hw.swap_bytes else "")
        + f" per node; world size {hw.world_size}",
    ]
    if sc.accelerator == "cpu":
        lines.append("accelerator DeepSpeed CPU accelerator (what a CPU replay runs)")
    return Text("\n".join(lines))


def framework_line(sc: Scenario) -> str:
    """The training setup of a non-DeepSpeed scenario, in one line."""
    from memfit.core.frameworks.summary import describe_framework

    return f"framework  {describe_framework(sc)}"


def phase_table(plan: Plan, sc: Scenario, *, width: int = 120) -> Table:
    hw = sc.hardware
    failed = {(f.phase, f.device) for f in plan.verdict.failures}
    wide = width >= 120
    t = Table(title=f"Peak memory per phase, GiB (2^30 bytes). GPU per rank (of {hw.gpu.total_bytes / GiB:.2f}): "
                    "allocated (blocks), reserved, OOM-relevant (what the verdict compares); pinned page-locked and "
                    f"pageable per rank; host per node (of {hw.cpu_ram_bytes / GiB:.2f})",
              title_justify="left", box=box.SIMPLE_HEAVY if wide else box.SIMPLE, padding=(0, 1), pad_edge=False,
              caption=_step_caption(plan), caption_justify="left")
    t.add_column("phase", no_wrap=True)
    t.add_column("GPU\nalloc", justify="right", no_wrap=True)
    t.add_column("GPU\nresv", justify="right", no_wrap=True)
    t.add_column("GPU\nOOM", justify="right", no_wrap=True)
    if wide:
        t.add_column("", no_wrap=True)
    t.add_column("pin\nlock", justify="right", no_wrap=True)
    t.add_column("page\nable", justify="right", no_wrap=True)
    t.add_column("host\nnode", justify="right", no_wrap=True)
    if wide:
        t.add_column("", no_wrap=True)
    for ph in plan.phases:
        g, h = gpu_figure(ph), host_figure(ph)
        gpu = Text(_gib(g), style="bold red" if (ph.name, "gpu") in failed else "")
        node = Text(_gib(h), style="bold red" if (ph.name, "cpu") in failed else "")
        gbar = [_bar(g, hw.gpu.total_bytes)] if wide else []
        hbar = [_bar(h, hw.cpu_ram_bytes)] if wide else []
        t.add_row(ph.name, _gib(ph.gpu_allocated_bytes), _gib(ph.gpu_reserved_bytes), gpu, *gbar,
                  _gib(ph.cpu_pinned_locked_bytes), _gib(ph.cpu_pageable_bytes), node, *hbar)
    return t


def _step_caption(plan: Plan) -> str | None:
    """What the step phases are (``ledger_types.PHASE_LABELS``), for the ones the plan has."""
    names = {p.name for p in plan.phases}
    parts = []
    if "forward" in names:
        parts.append("forward/backward/optimizer_step: step 1")
    if "accum.forward" in names:
        parts.append("accum.*: " + PHASE_LABELS["accum.forward"].rsplit(":", 1)[0])
    if "step2.forward" in names:
        parts.append("step2.*: " + PHASE_LABELS["step2.forward"].rsplit(":", 1)[0])
    return "; ".join(parts) or None


def items_table(ph: PhaseLedger, *, width: int = 120) -> Table:
    """What is live at a phase's peak. Below 120 columns the formula and source go on their own line
    under each item, so no byte count is cut or folded."""
    wide = width >= 120
    t = Table(title=f"{ph.name}: what is live at the peak ({ph.description})", title_justify="left",
              show_lines=False, box=box.HEAVY_HEAD if wide else box.SIMPLE, padding=(0, 1))
    t.add_column("item", ratio=1 if not wide else None, overflow="fold")
    t.add_column("where", no_wrap=True)
    t.add_column("GiB", justify="right", no_wrap=True)
    t.add_column("bytes\n(held: block / locked)", justify="right", no_wrap=True)
    if wide:
        t.add_column("formula / library code", overflow="fold")
    for it in sorted(ph.items, key=lambda i: (i.device.value, -i.bytes)):
        name = it.name + ("" if it.exact else " (estimate)")
        held = it.block_bytes if it.block_bytes is not None else it.locked_bytes
        nbytes = f"{it.bytes:,}" + (f"\n({held:,})" if held is not None and held != it.bytes else "")
        formula = Text(it.formula) + Text("\n" + it.source, style="dim")
        if wide:
            t.add_row(name, _DEV[it.device], _gib(it.bytes), nbytes, formula)
        else:
            t.add_row(Text(name) + Text("\n") + Text(it.formula + " (" + it.source + ")", style="dim"),
                      _DEV[it.device], _gib(it.bytes), nbytes)
    return t


def verdict_text(plan: Plan) -> Text:
    out = Text()
    for i, (line, style) in enumerate(verdict_lines(plan)):
        out.append(("\n" if i else "") + line, style=style)
    return out


def summary_group(plan: Plan, sc: Scenario) -> Group:
    """The first screen: the verdict, its two figures and their companions, the margins it used, the
    first findings."""
    _, figures, found = summary(plan, sc.hardware.gpu.total_bytes, sc.hardware.cpu_ram_bytes)
    lines = list(verdict_lines(plan))
    margins = [lines.pop()] if lines and lines[-1][0].startswith("margins:") else []
    parts: list = [Text(f"memfit plan: {plan.scenario_name}", style="bold")]
    parts += [Text(line, style=style) for line, style in lines]
    parts += [Text(line) for line in figures]
    parts += [Text(line, style=style) for line, style in margins]
    parts += [Text(f"[{sev}] ", style=_SEV.get(sev, "")) + Text(msg) for sev, msg in found]
    return Group(*parts)


def render_plan(plan: Plan, sc: Scenario, console: Console, *, all_items: bool = False) -> None:
    """The verdict and its figures first (one screen at any width), then the scenario, the
    assumptions, the phase table, the items at the peaks, every finding and the notes."""
    console.print(summary_group(plan, sc))
    console.print()
    console.print(Panel(scenario_summary(sc), title=Text("scenario"), title_align="left"))
    render_assumptions(sc, console)
    console.print(phase_table(plan, sc, width=console.width))
    console.print(Text(f"compared: {plan.verdict.gpu_figure}; {plan.verdict.host_figure}", style="dim"))
    console.print()
    show = set()
    if all_items:
        show = {p.name for p in plan.phases}
    else:
        show.add(max(plan.phases, key=gpu_figure).name)
        show.add(max(plan.phases, key=host_figure).name)
        show.update(f.phase for f in plan.verdict.failures[:1])
    for ph in plan.phases:
        if ph.name in show:
            console.print(items_table(ph, width=console.width))
    if not all_items:
        console.print(Text("(--all-items shows every phase's items)", style="dim"))
    console.print()
    console.print(Text("Findings", style="bold"))
    for f in plan.findings:
        console.print(Text(f"[{f.severity}] ", style=_SEV.get(f.severity, "")) + Text(f.message))
    for n in plan.notes:
        console.print(Text(f"note: {n}", style="dim"))
