"""The stable JSON schema of ``memfit plan --json`` (documented in docs/json-schema.md).

Schema version 1. Byte counts are integers; nothing is rounded.
"""

from __future__ import annotations

from typing import Any

from memfit import __version__
from memfit.core.ledger_types import Plan

SCHEMA_VERSION = 1


def plan_to_dict(plan: Plan, *, scenario: dict[str, Any] | None = None) -> dict[str, Any]:
    gpu_peak = max(plan.phases, key=lambda p: p.gpu_peak_bytes)
    cpu_peak = max(plan.phases, key=lambda p: p.node_cpu_peak_bytes)
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
                "description": ph.description,
                "gpu_peak_bytes": ph.gpu_peak_bytes,
                "cpu_peak_bytes": ph.cpu_peak_bytes,
                "cpu_pinned_bytes": ph.cpu_pinned_bytes,
                "cpu_pageable_bytes": ph.cpu_pageable_bytes,
                "node_cpu_peak_bytes": ph.node_cpu_peak_bytes,
                "nvme_bytes": ph.nvme_bytes,
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
        },
        "verdict": {
            "fits": plan.verdict.fits,
            "failures": [
                {"phase": f.phase, "device": f.device, "needed_bytes": f.needed_bytes,
                 "available_bytes": f.available_bytes}
                for f in plan.verdict.failures
            ],
        },
        "findings": [{"id": f.id, "severity": f.severity, "message": f.message} for f in plan.findings],
        "notes": list(plan.notes),
    }
