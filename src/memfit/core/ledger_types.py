"""Typed results of a plan: ledger items, phases, the verdict and findings.

Renderers (terminal, JSON, Markdown, HTML) take these and never recompute.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Device(str, Enum):
    """Where an allocation lives."""

    GPU = "gpu"
    CPU_PINNED = "cpu_pinned"
    CPU_PAGEABLE = "cpu_pageable"
    NVME = "nvme"


PHASES = (
    "load",
    "initialize.cast",
    "initialize.move",
    "initialize.partition",
    "initialize.optimizer",
    "forward",
    "backward",
    "optimizer_step",
    "save",
)
"""Phase names in run order; replays mark the same boundaries."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LedgerItem:
    """One allocation (or a group of identical ones) that is live at some point of the run."""

    key: str
    """Stable identifier, e.g. ``zero3.param_partitions``; replays attribute measurements to it."""
    name: str
    """What it is, in plain words."""
    device: Device
    bytes: int
    """Per rank (per process)."""
    formula: str
    """How ``bytes`` is computed, with the numbers, e.g. ``ceil(p/W) x 2 B summed over 285 params``."""
    source: str
    """The DeepSpeed (or torch/transformers) code it mirrors: ``file.py:function``."""
    category: str = "other"
    """For charts: ``params``, ``grads``, ``optimizer``, ``buffers``, ``activations``, ``runtime``."""
    exact: bool = True
    """False for estimates (activations without a trace, CUDA context, allocator slack)."""
    rank0_only: bool = False
    """Held by rank 0 alone (e.g. the consolidated state dict on save), not by every rank."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PhaseLedger:
    """Memory at a phase's peak: the live items, per device, per rank and per node."""

    name: str
    description: str
    items: tuple[LedgerItem, ...]
    """Items live at the phase's peak (GPU items at the GPU peak, host items at the host peak)."""
    gpu_peak_bytes: int
    """Per rank, allocated by tensors (the CUDA caching allocator may reserve more)."""
    cpu_pinned_bytes: int
    """Per process, page-locked host memory at the host peak."""
    cpu_pageable_bytes: int
    """Per process, ordinary host memory at the host peak."""
    nvme_bytes: int
    """Per rank, on NVMe."""
    ranks_per_node: int
    resident: tuple[LedgerItem, ...] = ()
    """Items still live when the phase ends (what the next phase starts from)."""
    node_cpu_peak_bytes: int = 0
    """All ranks on one node together: each rank is its own process with its own copy, except
    items held by rank 0 alone."""

    @property
    def cpu_peak_bytes(self) -> int:
        return self.cpu_pinned_bytes + self.cpu_pageable_bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class Failure:
    phase: str
    device: str
    """``gpu``, ``cpu`` (per node) or ``nvme``."""
    needed_bytes: int
    available_bytes: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Verdict:
    fits: bool
    failures: tuple[Failure, ...]
    """In run order; the first is where the run dies."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Finding:
    id: str
    severity: str
    """``error`` (the run fails because of it), ``warning``, ``info``."""
    message: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ParamCounts:
    total: int
    trainable: int
    frozen: int
    largest: int
    largest_name: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    """The whole answer for one scenario."""

    scenario_name: str
    params: ParamCounts
    phases: tuple[PhaseLedger, ...]
    verdict: Verdict
    findings: tuple[Finding, ...]
    notes: tuple[str, ...] = ()
    """What is estimated rather than exact, and why."""

    def phase(self, name: str) -> PhaseLedger:
        for p in self.phases:
            if p.name == name:
                return p
        raise KeyError(name)


@dataclass(frozen=True, slots=True, kw_only=True)
class TracedStep:
    """In-step GPU memory measured from the model's code (``memfit trace``), replacing the analytic
    activation and ZeRO-3 gather estimates in the ``forward`` and ``backward`` phases."""

    forward_items: tuple[LedgerItem, ...]
    """Live at the forward peak, besides what the ledger already holds (params, buffers)."""
    backward_items: tuple[LedgerItem, ...]
    """Live at the backward peak, likewise."""
    note: str
    """How it was obtained (trace options, peak module), for the plan's notes."""
