"""Pieces every findings module shares: the phase and item lookups, which device a failure is on, the
smallest-margin finding and the host-memory findings, read off the ledger like the findings themselves.

``memfit.core.findings.deepspeed`` (DeepSpeed) and ``memfit.core.findings.pytorch`` (torch, DDP, FSDP) both import
these; neither imports the other's helpers.
"""

from __future__ import annotations

from memfit.core.ledger_types import Device, Finding, PhaseLedger, Verdict
from memfit.core.scenario.types import Scenario
from memfit.core.units import fmt_both, fmt_bytes
from memfit.core.verdict import gpu_figure, host_figure


def _phase(phases: tuple[PhaseLedger, ...], name: str) -> PhaseLedger | None:
    return next((p for p in phases if p.name == name), None)


def _item(ph: PhaseLedger | None, key: str) -> int:
    if ph is None:
        return 0
    return sum(i.bytes for i in ph.items if i.key == key)


def _on(item_device: Device, failed: str) -> bool:
    if failed == "gpu":
        return item_device is Device.GPU
    if failed == "cpu":
        return item_device in (Device.CPU_PINNED, Device.CPU_PAGEABLE)
    return item_device is Device.NVME


def _host_findings(sc: Scenario, phases: tuple[PhaseLedger, ...], verdict: Verdict) -> list[Finding]:
    hw = sc.hardware
    R = hw.gpus_per_node
    out = []
    peak = max(phases, key=host_figure)
    pinned_peak = max(phases, key=lambda p: p.cpu_pinned_locked_bytes)
    head = hw.cpu_ram_bytes - host_figure(peak)
    if R > 1 or head < hw.cpu_ram_bytes * 0.2:
        out.append(Finding(id="host-ram-per-node", severity="warning" if head < hw.cpu_ram_bytes * 0.1 else "info", message=(
            f"{R} rank(s) on one node each run their own process with their own copy: host memory peaks in phase "
            f"{peak.name} at {fmt_bytes(host_figure(peak), 'GB')} per node of {fmt_bytes(hw.cpu_ram_bytes, 'GB')} "
            f"({fmt_bytes(peak.cpu_pageable_bytes, 'GB')} pageable + {fmt_bytes(peak.cpu_pinned_locked_bytes, 'GB')} "
            f"page-locked per rank), leaving {fmt_bytes(head, 'GB')} for the OS, page cache and everything else.")))
    if pinned_peak.cpu_pinned_locked_bytes:
        locked, asked = pinned_peak.cpu_pinned_locked_bytes, pinned_peak.cpu_pinned_requested_bytes
        why = (f" (the tensors ask for {fmt_bytes(asked, 'GB')}; torch's pinned allocator rounds each block up to a "
               f"power of two and keeps freed blocks locked)" if locked > asked else "")
        out.append(Finding(id="pinned-oom-is-reported-as-cuda-oom", severity="info", message=(
            f"Pinned (page-locked) host memory reaches {fmt_bytes(locked, 'GB')} per rank{why}, "
            f"{fmt_bytes(locked * R, 'GB')} per node (phase {pinned_peak.name}). A pinned "
            f"allocation that fails is reported as 'RuntimeError: CUDA error: out of memory' without 'Tried to allocate': "
            f"it is host memory running out, not GPU memory. Setting pin_memory false trades speed for that.")))
    return out


def _tightest(sc: Scenario, phases: tuple[PhaseLedger, ...]) -> Finding:
    hw = sc.hardware
    gpu = max(phases, key=gpu_figure)
    cpu = max(phases, key=host_figure)
    g_frac = gpu_figure(gpu) / hw.gpu.total_bytes
    c_frac = host_figure(cpu) / hw.cpu_ram_bytes
    if g_frac >= c_frac:
        where = (f"the GPU in phase {gpu.name}: {fmt_bytes(gpu_figure(gpu))} of {fmt_bytes(hw.gpu.total_bytes)} "
                 f"({g_frac:.0%}) per rank")
    else:
        where = (f"host RAM in phase {cpu.name}: {fmt_bytes(host_figure(cpu))} of {fmt_bytes(hw.cpu_ram_bytes)} "
                 f"({c_frac:.0%}) per node")
    return Finding(id="tightest-margin", severity="info", message=(
        f"It fits; the smallest margin is {where}, more than memfit's measured error on published runs and "
        "the host's OS reserve (see the verdict's margins)."))


def _first_failure(sc: Scenario, phases: tuple[PhaseLedger, ...], verdict: Verdict) -> Finding | None:
    """The verdict's first failure in words: the phase, the device, the figure compared and the
    three largest items there (every framework's findings open with it)."""
    first = verdict.failures[0] if verdict.failures else None
    if first is None:
        return None
    ph = _phase(phases, first.phase)
    where = {"gpu": f"GPU ({sc.hardware.gpu.name}, per rank)", "cpu": "host RAM (per node)", "nvme": "NVMe"}[first.device]
    top = sorted((i for i in ph.items if _on(i.device, first.device)), key=lambda i: -i.bytes)[:3]
    parts = "; ".join(f"{i.name} {fmt_bytes(i.bytes)}" for i in top)
    return Finding(id="first-failure", severity="error", message=(
        f"The run first runs out of {where} in phase {first.phase}: it needs {fmt_both(first.needed_bytes)} "
        f"of {fmt_both(first.available_bytes)}, {fmt_bytes(first.needed_bytes - first.available_bytes)} too much"
        + (f" (compared: {first.figure})" if first.figure else "") + f". Largest items: {parts}."))


def _worst_failure(sc: Scenario, phases: tuple[PhaseLedger, ...], verdict: Verdict) -> Finding | None:
    """The failure furthest over its limit, where it is not the first (fixing the first phase alone
    would leave it): its phase, device, how far over and its three largest items."""
    worst, first = verdict.worst, verdict.failures[0] if verdict.failures else None
    if worst is None or worst is first:
        return None
    ph = _phase(phases, worst.phase)
    where = {"gpu": f"GPU ({sc.hardware.gpu.name}, per rank)", "cpu": "host RAM (per node)", "nvme": "NVMe"}[worst.device]
    top = sorted((i for i in ph.items if _on(i.device, worst.device)), key=lambda i: -i.bytes)[:3]
    parts = "; ".join(f"{i.name} {fmt_bytes(i.bytes)}" for i in top)
    others = sorted({f.phase for f in verdict.failures} - {first.phase, worst.phase})
    return Finding(id="worst-failure", severity="error", message=(
        f"The worst failure is in phase {worst.phase}, on {where}: {fmt_both(worst.needed_bytes)} of "
        f"{fmt_both(worst.available_bytes)} ({worst.needed_bytes / worst.available_bytes:.0%}), so a fix for "
        f"phase {first.phase} alone is not enough" + (f" (phases failing too: {', '.join(others)})" if others else "")
        + f". Largest items: {parts}."))


def _risk_finding(sc: Scenario, verdict: Verdict) -> Finding | None:
    """An "at risk" verdict in words: the phases within the margin and why."""
    if verdict.level != "at_risk":
        return None
    worst = {}
    for r in verdict.risks:
        if r.device not in worst or r.needed_bytes > worst[r.device].needed_bytes:
            worst[r.device] = r
    parts = "; ".join(f"phase {r.phase} ({'GPU' if r.device == 'gpu' else 'host'}: {fmt_bytes(r.needed_bytes)} of "
                      f"{fmt_bytes(r.available_bytes)}, {r.why})" for r in worst.values())
    return Finding(id="at-risk", severity="warning", message=(
        f"At risk: every phase fits on paper, but {parts}. On the published runs memfit checks itself against, "
        f"its GPU figure was up to {verdict.gpu_margin:.0%} and its host figure up to {verdict.host_margin:.0%} "
        "below what the runs used in three cases of four: leave that much room, or take it as a warning."))

