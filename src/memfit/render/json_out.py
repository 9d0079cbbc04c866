"""The stable JSON schema of ``memfit plan --json`` (documented in docs/json-schema.md).

Schema version 3 (2 added the allocator figures, 3 the verdict's three levels with their margins, the
evaluation phases and the epoch simulation; docs/json-schema.md lists the changes). Byte counts are
integers named ``*_bytes``; nothing is rounded.
"""

from __future__ import annotations

from typing import Any

from memfit import __version__
from memfit.core.figures import Figure, Headline, headline
from memfit.core.ledger_types import PHASE_LABELS, Plan
from memfit.core.verdict import gpu_figure, host_figure

SCHEMA_VERSION = 3


def plan_to_dict(plan: Plan, *, scenario: dict[str, Any] | None = None) -> dict[str, Any]:
    gpu_peak = max(plan.phases, key=lambda p: p.gpu_peak_bytes)
    cpu_peak = max(plan.phases, key=lambda p: p.node_cpu_peak_bytes)
    gpu_verdict = max(plan.phases, key=gpu_figure)
    host_verdict = max(plan.phases, key=host_figure)
    return {
        "schema_version": SCHEMA_VERSION,
        "memfit_version": __version__,
        "scenario": scenario or {"name": plan.scenario_name},
        "params": {
            "total": plan.params.total,
            "trainable": plan.params.trainable,
            "frozen": plan.params.frozen,
            "largest": plan.params.largest,
            "largest_name": plan.params.largest_name,
        },
        "phases": [
            {
                "name": ph.name,
                "label": PHASE_LABELS.get(ph.name, ph.name),
                "description": ph.description,
                "gpu_peak_bytes": ph.gpu_peak_bytes,
                "cpu_peak_bytes": ph.cpu_peak_bytes,
                "cpu_pinned_bytes": ph.cpu_pinned_bytes,
                "cpu_pageable_bytes": ph.cpu_pageable_bytes,
                "node_cpu_peak_bytes": ph.node_cpu_peak_bytes,
                "nvme_bytes": ph.nvme_bytes,
                "allocators_simulated": ph.allocators_simulated,
                "gpu_allocated_bytes": ph.gpu_allocated_bytes,
                "gpu_reserved_bytes": ph.gpu_reserved_bytes,
                "gpu_oom_relevant_bytes": ph.gpu_oom_relevant_bytes,
                "gpu_outside_pytorch_bytes": ph.gpu_outside_pytorch_bytes,
                "gpu_nvidia_smi_bytes": ph.gpu_nvidia_smi_bytes,
                "gpu_alloc_retries": ph.gpu_alloc_retries,
                "gpu_ooms": ph.gpu_ooms,
                "cpu_pinned_requested_bytes": ph.cpu_pinned_requested_bytes,
                "cpu_pinned_locked_bytes": ph.cpu_pinned_locked_bytes,
                "cpu_locked_peak_bytes": ph.cpu_locked_peak_bytes,
                "node_cpu_locked_peak_bytes": ph.node_cpu_locked_peak_bytes,
                "items": [
                    {
                        "key": it.key,
                        "name": it.name,
                        "device": it.device.value,
                        "bytes": it.bytes,
                        "formula": it.formula,
                        "source": it.source,
                        "category": it.category,
                        "exact": it.exact,
                        "rank0_only": it.rank0_only,
                        "block_bytes": it.block_bytes,
                        "locked_bytes": it.locked_bytes,
                        "outside_allocator": it.outside_allocator,
                    }
                    for it in ph.items
                ],
            }
            for ph in plan.phases
        ],
        "peak": {
            "gpu_bytes": gpu_peak.gpu_peak_bytes,
            "gpu_phase": gpu_peak.name,
            "node_cpu_bytes": cpu_peak.node_cpu_peak_bytes,
            "cpu_phase": cpu_peak.name,
            "gpu_oom_relevant_bytes": gpu_figure(gpu_verdict),
            "gpu_oom_relevant_phase": gpu_verdict.name,
            "gpu_reserved_bytes": max(p.gpu_reserved_bytes for p in plan.phases),
            "cpu_pinned_locked_bytes": max(p.cpu_pinned_locked_bytes for p in plan.phases),
            "node_cpu_locked_bytes": host_figure(host_verdict),
            "node_cpu_locked_phase": host_verdict.name,
        },
        "headline": headline_to_dict(headline(plan)),
        "verdict": verdict_to_dict(plan.verdict),
        "epoch": epoch_to_dict(plan.epoch),
        "findings": [{"id": f.id, "severity": f.severity, "message": f.message} for f in plan.findings],
        "notes": list(plan.notes),
    }


def verdict_to_dict(v) -> dict[str, Any]:  # noqa: ANN001
    """The verdict as ``plan --json`` and ``recommend --json`` write it (schema 3: ``level``, ``risks``,
    ``worst_failure``, ``margins``)."""
    worst = v.worst
    return {
        "fits": v.fits,
        "level": v.level,
        "gpu_figure": v.gpu_figure,
        "host_figure": v.host_figure,
        "failures": [
            {"phase": f.phase, "device": f.device, "needed_bytes": f.needed_bytes,
             "available_bytes": f.available_bytes, "figure": f.figure}
            for f in v.failures
        ],
        "worst_failure": None if worst is None else v.failures.index(worst),
        "risks": [
            {"phase": r.phase, "device": r.device, "needed_bytes": r.needed_bytes,
             "available_bytes": r.available_bytes, "limit_bytes": r.limit_bytes, "why": r.why}
            for r in v.risks
        ],
        "margins": {"gpu": v.gpu_margin, "host": v.host_margin, "host_reserve_bytes": v.host_reserve_bytes,
                    "shared_gpu": v.shared_gpu, "source": v.margin_source},
    }


def epoch_to_dict(e) -> dict[str, Any] | None:  # noqa: ANN001
    """The epoch simulation (schema 3), None without one."""
    if e is None:
        return None
    from dataclasses import asdict

    d = asdict(e)
    d["peak_phase_figures"] = [dict(zip(("gpu_reserved_bytes", "gpu_oom_relevant_bytes", "gpu_allocated_bytes"), f))
                               for f in e.peak_phase_figures]
    d["eval_figures"] = None if e.eval_figures is None else dict(
        zip(("gpu_reserved_bytes", "gpu_oom_relevant_bytes", "gpu_allocated_bytes"), e.eval_figures))
    d["template_lengths"] = list(e.template_lengths)
    d["notes"] = list(e.notes)
    return d


def figure_to_dict(f: Figure) -> dict[str, Any]:
    return {"name": f.name, "bytes": f.bytes, "phase": f.phase, "scope": f.scope, "verdict": f.verdict}


def headline_to_dict(h: Headline) -> dict[str, Any]:
    """The named figures (``memfit.core.figures``), the same object in ``plan --json``, ``recommend
    --json`` (the baseline and each recommendation) and ``compare --json``."""
    return {"gpu": figure_to_dict(h.gpu), "host": figure_to_dict(h.host),
            "gpu_companions": [figure_to_dict(f) for f in h.gpu_companions],
            "host_companions": [figure_to_dict(f) for f in h.host_companions]}
