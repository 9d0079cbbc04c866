"""Allocation bookkeeping: a ledger is a sequence of allocations and frees, like the real run.

Recipes call ``alloc``/``free`` in the order the real code allocates; the timeline keeps the
bytes live per item and, for each phase, the peak per device and which items made it. Working at
the granularity of the code (one parameter at a time where the code loops over parameters) is
what makes transient peaks exact, e.g. the unpinned staging tensor that ``pin_memory()`` copies
from, or the window in which a parameter exists both on the GPU and as its CPU partition.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from memfit.core.ledger_types import Device, LedgerItem, PhaseLedger

HOST = (Device.CPU_PINNED, Device.CPU_PAGEABLE)


@dataclass(slots=True)
class _PhaseState:
    name: str
    description: str
    gpu_peak: int = -1
    gpu_items: dict[str, int] = field(default_factory=dict)
    host_peak: int = -1
    host_items: dict[str, int] = field(default_factory=dict)
    nvme_peak: int = -1
    nvme_items: dict[str, int] = field(default_factory=dict)
    end_items: dict[str, int] | None = None


class Timeline:
    """Mutable while a recipe runs; ``phases()`` turns it into frozen ``PhaseLedger`` objects.

    ``accelerator='cpu'`` models DeepSpeed's CPU accelerator: what the CUDA path puts on the GPU
    lives in (pageable) host memory, and ``pin_memory()`` returns the tensor unchanged.
    """

    def __init__(self, *, ranks_per_node: int, accelerator: str = "cuda") -> None:
        self.ranks_per_node = ranks_per_node
        self.accelerator = accelerator
        self._meta: dict[str, LedgerItem] = {}
        self._live: dict[str, int] = {}
        self._dev_live: dict[Device, int] = {d: 0 for d in Device}
        self._phases: list[_PhaseState] = []

    # -- placement -------------------------------------------------------------------------
    def place(self, device: Device) -> Device:
        """Where an allocation the CUDA path makes on ``device`` lands under this accelerator."""
        if self.accelerator == "cpu" and device in (Device.GPU, Device.CPU_PINNED):
            return Device.CPU_PAGEABLE
        return device

    @property
    def pinning_copies(self) -> bool:
        """``pin_memory()`` allocates a pinned copy (CUDA) or returns its input (CPU accelerator)."""
        return self.accelerator == "cuda"

    # -- recording -------------------------------------------------------------------------
    def phase(self, name: str, description: str) -> None:
        self._close_phase()
        self._phases.append(_PhaseState(name, description))
        self._observe()

    def end_phase(self) -> None:
        """Record what the current phase leaves live (done by ``phase()`` unless called earlier)."""
        if self._phases and self._phases[-1].end_items is None:
            self._phases[-1].end_items = {k: v for k, v in self._live.items() if v}

    _close_phase = end_phase

    def declare(self, key: str, *, name: str, device: Device, formula: str, source: str,
                category: str = "other", exact: bool = True, rank0_only: bool = False) -> None:
        """Describe an item before allocating into it (bytes accumulate over ``alloc`` calls)."""
        self._meta[key] = LedgerItem(key=key, name=name, device=self.place(device), bytes=0,
                                     formula=formula, source=source, category=category, exact=exact,
                                     rank0_only=rank0_only)

    def alloc(self, key: str, nbytes: int) -> None:
        if nbytes == 0:
            return
        self._live[key] = self._live.get(key, 0) + nbytes
        self._dev_live[self._meta[key].device] += nbytes
        self._observe()

    def free(self, key: str, nbytes: int | None = None) -> None:
        """Free ``nbytes`` of an item (all of it when None)."""
        live = self._live.get(key, 0)
        nbytes = live if nbytes is None else nbytes
        if nbytes > live:
            raise AssertionError(f"ledger bug: freeing {nbytes} B of {key} with {live} B live")
        if nbytes == 0:
            return
        self._live[key] = live - nbytes
        self._dev_live[self._meta[key].device] -= nbytes

    def live_bytes(self, key: str) -> int:
        return self._live.get(key, 0)


    def _observe(self) -> None:
        if not self._phases:
            return
        ph = self._phases[-1]
        gpu = self._dev_live[Device.GPU]
        host = self._dev_live[Device.CPU_PINNED] + self._dev_live[Device.CPU_PAGEABLE]
        nvme = self._dev_live[Device.NVME]
        if gpu > ph.gpu_peak:
            ph.gpu_peak = gpu
            ph.gpu_items = self._snapshot(Device.GPU)
        if host > ph.host_peak:
            ph.host_peak = host
            ph.host_items = self._snapshot(*HOST)
        if nvme > ph.nvme_peak:
            ph.nvme_peak = nvme
            ph.nvme_items = self._snapshot(Device.NVME)

    def _snapshot(self, *devices: Device) -> dict[str, int]:
        meta = self._meta
        return {k: v for k, v in self._live.items() if v and meta[k].device in devices}

    # -- results ---------------------------------------------------------------------------
    def phases(self) -> tuple[PhaseLedger, ...]:
        self._close_phase()
        out = []
        for ph in self._phases:
            live = {**ph.gpu_items, **ph.host_items, **ph.nvme_items}
            items = tuple(replace(self._meta[k], bytes=v) for k, v in live.items())
            pinned = sum(v for k, v in ph.host_items.items() if self._meta[k].device is Device.CPU_PINNED)
            host_peak = max(ph.host_peak, 0)
            rank0 = sum(v for k, v in ph.host_items.items() if self._meta[k].rank0_only)
            resident = tuple(replace(self._meta[k], bytes=v) for k, v in (ph.end_items or {}).items())
            out.append(PhaseLedger(
                name=ph.name, description=ph.description, items=items, resident=resident,
                gpu_peak_bytes=max(ph.gpu_peak, 0), cpu_pinned_bytes=pinned,
                cpu_pageable_bytes=host_peak - pinned, nvme_bytes=max(ph.nvme_peak, 0),
                ranks_per_node=self.ranks_per_node,
                node_cpu_peak_bytes=(host_peak - rank0) * self.ranks_per_node + rank0,
            ))
        return tuple(out)
