"""Reconciliation: the log's figures against the plan's ledger at the failing phase and device."""

from __future__ import annotations

from typing import TYPE_CHECKING

from memfit.core.diagnose.explain import _device_of
from memfit.core.diagnose.results import EventKind, LogEvent, OomNumbers, ReconRow, Reconciliation
from memfit.core.figures import failure_figure_name, gpu_verdict_name
from memfit.core.ledger_types import Device, LedgerItem, Plan
from memfit.core.units import fmt_bytes

if TYPE_CHECKING:
    from memfit.core.scenario.types import Scenario

GiB = 2**30


# -------------------------------------------------------------------------------- reconciliation

_CONTEXT_KEY = "runtime.cuda_context"


def _node_bytes(items: tuple[LedgerItem, ...], ranks: int) -> int:
    return sum(it.bytes * (1 if it.rank0_only else ranks) for it in items)


def _tolerance(n: OomNumbers | None, ref: int) -> int:
    """What two figures may differ by and still agree: the printed rounding, or 2% of the larger."""
    return max(3 * (n.precision_bytes if n else 0), ref // 50)


def reconcile(ev: LogEvent, phase: str | None, plan: Plan, scenario: Scenario | None, *,
              from_progress: bool = False) -> Reconciliation:
    """The log's figures against the plan at the failing phase (or the plan's peak when the log
    gives no phase). ``from_progress``: the phase comes from a progress line, which only says the
    run had got that far, so the plan's peak from that phase on is shown too."""
    device = "gpu" if _device_of(ev) == "gpu" else "cpu"
    failures = plan.verdict.failures
    first = failures[0] if failures else None
    if phase is not None:
        basis = "where the log's last progress line places it (or later)" if from_progress else \
            "where the log places the failure"
        ph = plan.phase(phase)
    else:
        here = [f for f in failures if f.device == device]
        if here:
            ph, basis = plan.phase(here[0].phase), "the log gives no phase: the plan's first failure on this device"
        else:
            key = _gpu_need if device == "gpu" else (lambda p: p.node_cpu_peak_bytes)
            ph, basis = max(plan.phases, key=key), "the log gives no phase: the plan's peak on this device"
    hw = scenario.hardware if scenario is not None else None
    ranks = ph.ranks_per_node
    lines: list[str] = []
    rows: list[ReconRow] = []
    n = ev.numbers
    if device == "gpu":
        items = tuple(sorted((it for it in ph.items if it.device == Device.GPU), key=lambda i: -i.bytes))
        tensors = sum(it.bytes for it in items if it.key != _CONTEXT_KEY)
        context = sum(it.bytes for it in items if it.key == _CONTEXT_KEY)
        cap = hw.gpu.total_bytes if hw else None
        rows.append(ReconRow(label="GPU total capacity", log_bytes=n.total_capacity_bytes if n else None,
                             plan_bytes=cap, note=f"scenario: {hw.gpu.name}" if hw else ""))
        if n and n.total_capacity_bytes and cap and \
                abs(n.total_capacity_bytes - cap) > max(cap // 33, 3 * n.precision_bytes):
            lines.append(f"The log's GPU has {fmt_bytes(n.total_capacity_bytes)}, the scenario's {hw.gpu.name} "
                         f"{fmt_bytes(cap)}: the log is from another card; plan again with --gpus matching it.")
        needed = None
        if n and n.allocated_bytes is not None and n.tried_to_allocate_bytes is not None:
            needed = n.allocated_bytes + n.tried_to_allocate_bytes
        rows.append(ReconRow(label="tensors: allocated + requested at the failure (log) / at the phase peak (plan)",
                             log_bytes=needed, plan_bytes=tensors,
                             note="per rank; the plan's peak is the most this phase should need"))
        out = n.outside_allocator_bytes if n else None
        rows.append(ReconRow(label="outside PyTorch's allocator: CUDA context, NCCL, other processes",
                             log_bytes=out, plan_bytes=context, note="plan: CUDA context estimate"))
        if ph.allocators_simulated:
            rows.append(ReconRow(label="reserved by PyTorch (cached segments)",
                                 log_bytes=n.reserved_bytes if n else None, plan_bytes=ph.gpu_reserved_bytes,
                                 note="plan: the caching allocator simulation's reserved peak (max_memory_reserved)"))
        if n and n.free_bytes is not None:
            left = (cap - _gpu_need(ph)) if cap else None
            rows.append(ReconRow(label="free", log_bytes=n.free_bytes,
                                 plan_bytes=None if left is None else max(left, 0),
                                 note="plan: left at the phase's OOM-relevant peak" + (
                                     f" (none: {fmt_bytes(-left)} short)" if left is not None and left < 0 else "")))
        if needed is not None:
            tol = _tolerance(n, max(needed, tensors))
            if needed > tensors + tol:
                s = (f"The log's tensors ({fmt_bytes(needed)}) exceed the plan's for {ph.name} ({fmt_bytes(tensors)}) "
                     f"by {fmt_bytes(needed - tensors)}: the run holds GPU memory the scenario does not describe "
                     f"(a bigger model, batch or sequence, another dtype, tensors the script keeps on the GPU).")
                moved = sum(it.bytes for it in items if it.key == "move.params")
                if moved and abs(needed - 2 * moved) <= max(moved // 10, tol):
                    s += (f" It is about twice the plan's 16-bit model ({fmt_bytes(moved)}): the model was moved "
                          f"in fp32 (fp16/bf16 not enabled in the DeepSpeed config, or the cast skipped).")
                lines.append(s)
            elif needed + tol < tensors and cap is not None and _gpu_need(ph) > cap:
                lines.append(f"The run failed on its way up to the plan's peak for {ph.name}: the plan's "
                             f"{gpu_verdict_name(plan)} there is {fmt_bytes(_gpu_need(ph))}, above the card's "
                             f"{fmt_bytes(cap)}, and the log's tensors had reached {fmt_bytes(needed)} of the plan's "
                             f"{fmt_bytes(tensors)} when the request failed: as the plan predicts.")
            elif needed + tol < tensors:
                lines.append(f"The failure came before the plan's peak for {ph.name}: the log's tensors "
                             f"({fmt_bytes(needed)}) are below the plan's {fmt_bytes(tensors)}, though the plan has "
                             f"the phase fitting, so the GPU had less room than the plan assumes (another process, a "
                             f"smaller card) or the run holds memory the scenario does not describe.")
            else:
                lines.append(f"The log's tensors ({fmt_bytes(needed)}) match the plan's {ph.name} peak "
                             f"({fmt_bytes(tensors)}) within the printed rounding.")
        if out is not None and out > context + GiB:
            extra = out - context
            s = (f"{fmt_bytes(out)} of the GPU is used outside this process's allocator, {fmt_bytes(extra)} more than "
                 f"the plan's CUDA context estimate")
            peaks = {p.name: sum(i.bytes for i in p.items if i.device == Device.GPU) for p in plan.phases}
            like = [name for name, b in peaks.items() if b and abs(out - b) <= max(b // 10, GiB // 2)]
            if like:
                s += (f": about what one rank holds in {like[0]} ({fmt_bytes(peaks[like[0]])}), so another rank (or "
                      f"another copy of this job) is most likely using the same GPU")
            lines.append(s + ".")
    else:
        items = tuple(sorted((it for it in ph.items if it.device in (Device.CPU_PINNED, Device.CPU_PAGEABLE)),
                             key=lambda i: (i.device != Device.CPU_PINNED, -i.bytes)))
        pinned = tuple(it for it in items if it.device == Device.CPU_PINNED)
        ram = hw.cpu_ram_bytes if hw else None
        rows.append(ReconRow(label="pinned per rank", log_bytes=None, plan_bytes=ph.cpu_pinned_bytes))
        rows.append(ReconRow(label=f"pinned per node ({ranks} ranks)", log_bytes=None,
                             plan_bytes=_node_bytes(pinned, ranks)))
        rows.append(ReconRow(label="host memory per node (pinned + pageable)", log_bytes=None,
                             plan_bytes=ph.node_cpu_peak_bytes))
        rows.append(ReconRow(label="host RAM per node", log_bytes=None, plan_bytes=ram, note="scenario"))
        if n and n.tried_to_allocate_bytes is not None:
            rows.append(ReconRow(label="the failing request", log_bytes=n.tried_to_allocate_bytes, plan_bytes=None))
        if ram:
            left = ram - ph.node_cpu_peak_bytes
            if left < 0:
                lines.append(f"The plan has {ph.name} needing {fmt_bytes(ph.node_cpu_peak_bytes)} per node of "
                             f"{fmt_bytes(ram)} RAM: {fmt_bytes(-left)} short, as the log shows.")
            else:
                lines.append(f"The plan leaves {fmt_bytes(left)} of {fmt_bytes(ram)} free per node at the {ph.name} "
                             f"peak; the run had less: memory the scenario does not count (a copy of the weights "
                             f"the script still references, DataLoader workers, other jobs, page cache counted "
                             f"against a container's memory limit) or a node smaller than cpu_ram says.")
        if from_progress:
            later = plan.phases[[q.name for q in plan.phases].index(ph.name):]
            top = max(later, key=lambda p: p.node_cpu_peak_bytes)
            if top is not ph:
                lines.append(f"From {ph.name} on, the plan's host peak is {top.name}: "
                             f"{fmt_bytes(top.node_cpu_peak_bytes)} per node.")
        if ev.kind == EventKind.PINNED_HOST_OOM and pinned:
            lines.append(f"Pinned at the {ph.name} peak: {fmt_bytes(ph.cpu_pinned_bytes)} per rank, "
                         f"{fmt_bytes(_node_bytes(pinned, ranks))} per node (" +
                         ", ".join(f"{it.name} {fmt_bytes(it.bytes)}" for it in pinned) + ").")
    here = [f for f in failures if f.phase == ph.name and f.device == device]
    if here:
        verdict = "predicted"
        lines.insert(0, f"The plan predicts this failure: {ph.name} needs {fmt_bytes(here[0].needed_bytes)} "
                        f"({failure_figure_name(plan, here[0])}, the verdict's figure) of "
                        f"{fmt_bytes(here[0].available_bytes)} "
                        f"({'GPU per rank' if device == 'gpu' else 'host RAM per node'}).")
    elif failures:
        verdict = "predicted_elsewhere"
        lines.insert(0, f"The plan predicts a failure too, but first in {first.phase} on "
                        f"{'the GPU' if first.device == 'gpu' else 'host RAM' if first.device == 'cpu' else 'NVMe'} "
                        f"({fmt_bytes(first.needed_bytes)} {failure_figure_name(plan, first)} of "
                        f"{fmt_bytes(first.available_bytes)}), not here.")
    else:
        verdict = "not_predicted"
        lines.insert(0, f"The plan does not predict this failure: it has every phase fitting, {ph.name} at "
                        + (f"{fmt_bytes(_gpu_need(ph))} per GPU ({gpu_verdict_name(plan)}, the verdict's figure: "
                           f"segments holding live blocks + memory outside PyTorch)" if device == "gpu"
                           else f"{fmt_bytes(ph.node_cpu_peak_bytes)} of host memory per node") + ".")
    return Reconciliation(scenario_name=plan.scenario_name, phase=ph.name, phase_basis=basis, device=device,
                          rows=tuple(rows), items=items, plan_verdict=verdict, plan_failure=first, lines=tuple(lines))


def _gpu_need(ph) -> int:
    """What the phase needs of the card, the figure the verdict uses: the allocator simulation's
    OOM-relevant peak (segments holding live blocks + memory outside PyTorch), or the requested
    bytes where no simulation ran (CPU accelerator)."""
    return ph.gpu_oom_relevant_bytes if ph.allocators_simulated else ph.gpu_peak_bytes
