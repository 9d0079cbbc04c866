"""``memfit diagnose``: read a pasted traceback or log, say what failed, in which phase, and how it
squares with a plan.

Glossary
- *event*: one recognised failure (a CUDA allocator OOM, a failed pinned host allocation, a host
  OOM kill, an NCCL error, a DeepSpeed op build failure). The lines one rank prints about the same
  failure are one event; each rank that reports it has its own.
- *frame*: one ``File "...", line N, in f`` entry of a Python traceback, with its source line.
- *phase*: a memfit ledger phase (``memfit.core.ledger_types.PHASES``). The boundaries are the
  replay's (``memfit/replay/deepspeed/seams.py``): ``initialize.cast`` up to ``module.to(device)`` in
  ``DeepSpeedEngine._configure_distributed_model``, ``initialize.move`` that call (and the
  broadcast), ``initialize.partition`` from there through the basic optimizer and ZeRO-3's
  parameter conversion, ``initialize.optimizer`` the rest of ``deepspeed.initialize``.
- *progress line*: a line DeepSpeed or transformers logs on the way (``DeepSpeed info: version=``,
  ``DeepSpeed Flops Profiler Enabled``, ...); the last one before a failure bounds its phase when no
  traceback does (a process killed by the kernel prints none).

Sizes in the messages are parsed as printed: PyTorch's ``format_size`` (c10/cuda/
CUDACachingAllocator.cpp) prints ``bytes``, ``KiB``, ``MiB``, ``GiB`` (binary) with two decimals, so
a parsed figure is exact to half a unit of its last digit (``precision_bytes``). The core never
imports torch; this package is text in, typed results out.

Modules: ``logtext`` (reading and cleaning the log, tracebacks), ``parse`` (the failures and their
figures), ``rules`` (frames and progress lines to phases), ``explain`` (meaning and fixes),
``reconcile`` (the log against the plan), ``results`` (the typed results).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from memfit.core.diagnose.explain import _explain
from memfit.core.diagnose.logtext import LogLine, _clean_lines, read_log  # _clean_lines: records/ds_log.py
from memfit.core.diagnose.parse import ParsedLog, parse_log, parse_size, primary_event
from memfit.core.diagnose.reconcile import reconcile
from memfit.core.diagnose.results import (MEMORY_KINDS, TITLES, Diagnosis, EventKind, Frame, LogEvent, OomNumbers,
                                          ReconRow, Reconciliation)
from memfit.core.diagnose.rules import PROGRESS, RULES, _progress_phase, locate_phase, trainer_steps
from memfit.core.ledger_types import Finding, Plan
from memfit.core.units import fmt_bytes

if TYPE_CHECKING:
    from memfit.core.scenario.types import Scenario

__all__ = ["Diagnosis", "EventKind", "Frame", "LogEvent", "LogLine", "OomNumbers", "PROGRESS", "ParsedLog", "RULES",
           "ReconRow", "Reconciliation", "TITLES", "diagnose_log", "locate_phase", "parse_log", "parse_size",
           "primary_event", "read_log", "reconcile", "_clean_lines"]

GiB = 2**30
_MEMORY = MEMORY_KINDS


# -------------------------------------------------------------------------------------- diagnose

def _headline(ev: LogEvent, phase: str | None) -> str:
    who = f"rank {ev.rank}" if ev.rank is not None else (f"host {ev.host}" if ev.host else "")
    where = f" on GPU {ev.gpu_index}" if ev.gpu_index is not None and ev.kind == EventKind.GPU_OOM else ""
    s = TITLES[ev.kind] + where + (f" ({who})" if who else "")
    if ev.kind == EventKind.NCCL_ERROR and ev.out_of_memory:
        s += ": CUDA out of memory inside NCCL"
    return s + (f" in {phase}" if phase else "")


def _findings(ev: LogEvent, phase: str | None, rec: Reconciliation | None, parsed: ParsedLog,
              scenario: Scenario | None) -> list[Finding]:
    out = [Finding(id=f"log-{ev.kind.value.replace('_', '-')}", severity="error",
                   message=_headline(ev, phase) + f" (log line {ev.line}).")]
    n = ev.numbers
    if n and n.outside_allocator_bytes is not None and n.outside_allocator_bytes > 2 * GiB:
        out.append(Finding(id="log-gpu-shared", severity="warning",
                           message=f"{fmt_bytes(n.outside_allocator_bytes)} of the GPU was in use outside this "
                                   f"process's PyTorch allocator: another process or rank shares the GPU."))
    if n and n.reserved_unallocated_bytes and n.tried_to_allocate_bytes is not None and \
            n.reserved_unallocated_bytes > max(n.tried_to_allocate_bytes, GiB // 2):
        out.append(Finding(id="log-fragmentation", severity="info",
                           message=f"{fmt_bytes(n.reserved_unallocated_bytes)} was reserved but unallocated, more "
                                   f"than the request: fragmentation (expandable_segments helps)."))
    if rec is not None:
        if rec.plan_verdict == "not_predicted":
            out.append(Finding(id="plan-missed-failure", severity="warning",
                               message=f"The plan for {rec.scenario_name} has {rec.phase} fitting; the log failed "
                                       f"there. See the reconciliation for where they disagree."))
        elif rec.plan_verdict == "predicted":
            out.append(Finding(id="plan-predicted-failure", severity="info",
                               message=f"The plan predicts this failure in {rec.phase}."))
    if scenario is not None and parsed.deepspeed_version:
        major_minor = ".".join(parsed.deepspeed_version.split(".")[:2])
        if major_minor != scenario.ds_version:
            out.append(Finding(id="log-deepspeed-version", severity="info",
                               message=f"The log is from DeepSpeed {parsed.deepspeed_version}; the scenario models "
                                       f"{scenario.ds_version}.x (set deepspeed_version to match)."))
    if len(parsed.events) > 1:
        others = [e for e in parsed.events if e is not ev]
        kinds = sorted({e.kind.value for e in others})
        out.append(Finding(id="log-more-events", severity="info",
                           message=f"{len(others)} more event(s) in the log ({', '.join(kinds)}), "
                                   f"first at line {others[0].line}."))
    return out


def diagnose_log(text: str, plan: Plan | None = None, scenario: Scenario | None = None) -> Diagnosis:
    """Everything memfit can say about a log: the events, the failing phase and why, what it usually
    means, the usual fixes, and (with a plan) how the log's figures compare with the plan's."""
    parsed = parse_log(text)
    ev = primary_event(parsed.events)
    if ev is None:
        headline = "the log is empty" if not text.strip() else "no recognisable error in the log"
        return Diagnosis(events=(), primary=None, headline=headline, phase=None, phase_reason="", phase_source="none",
                         phase_frame=None, explanation=(), fixes=(), reconciliation=None, findings=(),
                         deepspeed_version=parsed.deepspeed_version, torch_version=parsed.torch_version)
    zero3 = parsed.zero3 or (scenario is not None and scenario.deepspeed.zero.stage == 3)
    phase, reason, frame = locate_phase(ev.frames, zero3=zero3)
    source = "traceback" if phase else "none"
    if phase is None:
        prog = _progress_phase(list(parsed.lines), ev.line)
        if prog is not None:
            phase, p_reason, _ = prog
            reason = p_reason if not ev.frames else f"{p_reason} ({reason})"
            source = "progress"
        elif not ev.frames:
            reason = "the log has no traceback for it and no progress line before it"
    steps = trainer_steps(list(parsed.lines), ev.line)
    if source == "traceback" and phase in ("forward", "backward", "optimizer_step") and steps and steps[0] >= 1:
        phase = f"step2.{phase}"  # the frames say which part of the step; the bar says which step
        reason += (f"; {steps[0]} optimizer step(s) had run (the Trainer's progress, line {steps[1]}): the steady "
                   "state, step 2 on")
    from memfit.core.diagnose.fixes import facts_from_log, facts_from_scenario

    facts = facts_from_scenario(scenario) if scenario is not None else facts_from_log(text, ev, parsed.zero3)
    say, fix = _explain(ev, phase, facts)
    rec = None
    if plan is not None and (ev.kind in _MEMORY or (ev.kind == EventKind.NCCL_ERROR and ev.out_of_memory)):
        rec = reconcile(ev, phase, plan, scenario, from_progress=source == "progress")
    if plan is not None and ev.kind == EventKind.OP_BUILD_ERROR and scenario is not None and \
            scenario.framework == "deepspeed":
        if scenario.deepspeed.zero.offload_optimizer.device == "cpu":
            say.append("The scenario offloads the optimizer to cpu, which is what needs DeepSpeedCPUAdam (cpu_adam).")
    return Diagnosis(events=parsed.events, primary=ev, headline=_headline(ev, phase), phase=phase, phase_reason=reason,
                     phase_source=source, phase_frame=frame, explanation=tuple(say), fixes=tuple(dict.fromkeys(fix)),
                     reconciliation=rec, findings=tuple(_findings(ev, phase, rec, parsed, scenario)),
                     deepspeed_version=parsed.deepspeed_version, torch_version=parsed.torch_version)
