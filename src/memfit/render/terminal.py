"""Rich tables for the terminal. Sizes in GiB (2**30 bytes) unless a column says GB (10**9)."""

from __future__ import annotations

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from memfit.core.ledger_types import Device, PhaseLedger, Plan
from memfit.core.scenario import Scenario
from memfit.core.units import fmt_bytes

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
        f"deepspeed  {sc.ds_version}.x, ZeRO stage {z.stage}, {ds.precision}, {ds.optimizer.type}"
        + (f", offload {', '.join(off)}" if off else ", no offload"),
        f"load       from_pretrained {sc.load.dtype}" + (", under zero.Init" if sc.load.zero_init else ", not under zero.Init")
        + ("" if sc.load.low_cpu_mem_usage else ", low_cpu_mem_usage=False"),
        f"step       micro-batch {sc.train.micro_batch} x seq {sc.train.seq_len}"
        + (", gradient checkpointing" if sc.train.gradient_checkpointing else ""),
        f"hardware   {hw.nodes} node(s) x {hw.gpus_per_node} x {hw.gpu.name} ({fmt_bytes(hw.gpu.total_bytes)} each), "
        f"{fmt_bytes(hw.cpu_ram_bytes)} RAM per node; world size {hw.world_size}",
    ]
    if sc.accelerator == "cpu":
        lines.append("accelerator DeepSpeed CPU accelerator (what a CPU replay runs)")
    return Text("\n".join(lines))


def phase_table(plan: Plan, sc: Scenario, *, width: int = 120) -> Table:
    hw = sc.hardware
    failed = {(f.phase, f.device) for f in plan.verdict.failures}
    t = Table(title="Peak memory per phase, GiB (2^30 bytes); GPU, pinned and pageable per rank",
              title_justify="left")
    t.add_column("phase", no_wrap=True)
    t.add_column("GPU\n/rank", justify="right", no_wrap=True)
    t.add_column(f"of\n{hw.gpu.total_bytes / GiB:.2f}", no_wrap=True)
    t.add_column("pinned", justify="right", no_wrap=True)
    t.add_column("page-\nable", justify="right", no_wrap=True)
    t.add_column("host\n/node", justify="right", no_wrap=True)
    t.add_column(f"of\n{hw.cpu_ram_bytes / GiB:.2f}", no_wrap=True)
    bar = 10 if width >= 110 else 0
    for ph in plan.phases:
        gpu = Text(_gib(ph.gpu_peak_bytes), style="bold red" if (ph.name, "gpu") in failed else "")
        node = Text(_gib(ph.node_cpu_peak_bytes), style="bold red" if (ph.name, "cpu") in failed else "")
        t.add_row(ph.name, gpu, _bar(ph.gpu_peak_bytes, hw.gpu.total_bytes, bar), _gib(ph.cpu_pinned_bytes),
                  _gib(ph.cpu_pageable_bytes), node, _bar(ph.node_cpu_peak_bytes, hw.cpu_ram_bytes, bar))
    return t


def items_table(ph: PhaseLedger) -> Table:
    t = Table(title=f"{ph.name}: what is live at the peak ({ph.description})", title_justify="left", show_lines=False)
    t.add_column("item")
    t.add_column("where")
    t.add_column("GiB", justify="right")
    t.add_column("bytes", justify="right")
    t.add_column("formula / DeepSpeed code", overflow="fold")
    for it in sorted(ph.items, key=lambda i: (i.device.value, -i.bytes)):
        name = it.name + ("" if it.exact else " (estimate)")
        t.add_row(name, _DEV[it.device], _gib(it.bytes), f"{it.bytes:,}",
                  Text(it.formula) + Text("\n" + it.source, style="dim"))
    return t


def verdict_text(plan: Plan) -> Text:
    if plan.verdict.fits:
        return Text("FITS: every phase stays within GPU and host memory.", style="bold green")
    f = plan.verdict.failures[0]
    dev = {"gpu": "GPU memory (per rank)", "cpu": "host RAM (per node)", "nvme": "NVMe"}[f.device]
    return Text(f"DOES NOT FIT: phase {f.phase} needs {fmt_bytes(f.needed_bytes)} of {dev}, "
                f"{fmt_bytes(f.available_bytes)} available ({fmt_bytes(f.needed_bytes - f.available_bytes)} short).",
                style="bold red")


def render_plan(plan: Plan, sc: Scenario, console: Console, *, all_items: bool = False) -> None:
    console.print(Panel(scenario_summary(sc), title=f"memfit plan: {plan.scenario_name}", title_align="left"))
    console.print(phase_table(plan, sc, width=console.width))
    console.print(verdict_text(plan))
    console.print()
    show = set()
    if all_items:
        show = {p.name for p in plan.phases}
    else:
        show.add(max(plan.phases, key=lambda p: p.gpu_peak_bytes).name)
        show.add(max(plan.phases, key=lambda p: p.node_cpu_peak_bytes).name)
        show.update(f.phase for f in plan.verdict.failures[:1])
    for ph in plan.phases:
        if ph.name in show:
            console.print(items_table(ph))
    if not all_items:
        console.print(Text("(--all-items shows every phase's items)", style="dim"))
    console.print()
    console.print(Text("Findings", style="bold"))
    for f in plan.findings:
        console.print(Text(f"[{f.severity}] ", style=_SEV.get(f.severity, "")) + Text(f.message))
    for n in plan.notes:
        console.print(Text(f"note: {n}", style="dim"))
