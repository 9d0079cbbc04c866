"""Allocation bookkeeping: a ledger is a sequence of allocations and frees, like the real run.

Recipes call ``alloc``/``free`` in the order the real code allocates; the timeline keeps the
bytes live per item and, for each phase, the peak per device and which items made it. Working at
the granularity of the code (one parameter at a time where the code loops over parameters) is
what makes transient peaks exact, e.g. the unpinned staging tensor that ``pin_memory()`` copies
from, or the window in which a parameter exists both on the GPU and as its CPU partition.

Tensor granularity (BRIEF contract 2): one ``alloc(key, n)`` call is one tensor; ``free(key, n)``
frees the most recently allocated live tensor of exactly n bytes of that key, ``free(key)`` all of
them. The ordered event log is ``events``. With a ``MemoryTracker`` (CUDA runs), every GPU and pinned
tensor also goes through the allocator simulators (``core/alloc``), which give the per-phase
allocated / reserved / OOM-relevant / pinned-locked figures and each item's block or locked bytes. A
``free`` that matches no single tensor (a recipe freeing part of a lump) frees the most recent
tensors and re-allocates the remainder; each such call is listed in ``granularity_notes``.
"""

from __future__ import annotations

from dataclasses import asdict, field, replace
from typing import Callable

from memfit.core.lean_dataclass import dataclass
from memfit.core.ledger_types import Device, LedgerItem, PhaseLedger

HOST = (Device.CPU_PINNED, Device.CPU_PAGEABLE)
TRACKED = (Device.GPU, Device.CPU_PINNED)


@dataclass(slots=True)
class _PhaseState:
    """A phase being recorded: its peaks so far and the items live at them."""

    name: str
    description: str
    gpu_peak: int = -1
    gpu_items: dict[str, int] = field(default_factory=dict)
    gpu_blocks: dict[str, int] = field(default_factory=dict)
    host_peak: int = -1
    host_items: dict[str, int] = field(default_factory=dict)
    host_locked: dict[str, int] = field(default_factory=dict)
    host_cached: int = 0
    nvme_peak: int = -1
    nvme_items: dict[str, int] = field(default_factory=dict)
    end_items: dict[str, int] | None = None
    locked_host_peak: int = -1
    locked_rank0: int = 0
    figures: object = None


class Timeline:
    """Mutable while a recipe runs; ``phases()`` turns it into frozen ``PhaseLedger`` objects.

    ``accelerator='cpu'`` models DeepSpeed's CPU accelerator: what the CUDA path puts on the GPU
    lives in (pageable) host memory, and ``pin_memory()`` returns the tensor unchanged.
    """

    def __init__(self, *, ranks_per_node: int, accelerator: str = "cuda", tracker=None) -> None:  # noqa: ANN001
        self.ranks_per_node = ranks_per_node
        self.accelerator = accelerator
        self.tracker = tracker if accelerator == "cuda" else None
        """``core.alloc.tracker.MemoryTracker`` or None (no allocator simulation)."""
        self._meta: dict[str, LedgerItem] = {}
        self._live: dict[str, int] = {}
        self._dev_live: dict[Device, int] = {d: 0 for d in Device}
        self._phases: list[_PhaseState] = []
        self.events: list[tuple[str, str, Device, int]] = []
        """(``alloc``|``free``, key, device, bytes) in call order."""
        self._tensors: dict[str, list[list]] = {}
        self._block_live: dict[str, int] = {}
        self._rank0_live = 0
        self._hooks: dict[str, list[Callable[[], None]]] = {}
        self.granularity_notes: list[str] = []
        self.phase_starts: list[tuple[str, int]] = []
        """(phase name, index into ``events`` of its first event), in phase order."""
        self._pending_gpu = self._pending_host = self._pending_nvme = False
        """A new peak whose items are not yet copied: the copy is taken at the next free on that device
        (or at the phase's end), when the live items first differ from the peak's (``_observe``)."""
        self.streams: dict[str, int] = {}
        """Ledger key -> the CUDA stream its GPU tensors are allocated on (default 0), for the
        allocator simulation (a block cached for one stream serves only that stream)."""
        self.deferred_frees: set[str] = set()
        """Keys whose GPU tensors are freed after ``record_stream`` on another stream (the block is
        reusable once that stream's event completes)."""

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
    def at_phase(self, name: str, fn: Callable[[], None]) -> None:
        """Run ``fn`` right after phase ``name`` begins (runtime allocations at a phase's first op)."""
        self._hooks.setdefault(name, []).append(fn)

    def phase(self, name: str, description: str) -> None:
        self._close_phase()
        self._finish_figures()
        self._phases.append(_PhaseState(name, description))
        self.phase_starts.append((name, len(self.events)))
        if self.tracker is not None:
            self.tracker.start_phase()
        self._observe()
        for fn in self._hooks.pop(name, ()):
            fn()

    def end_phase(self) -> None:
        """Record what the current phase leaves live (done by ``phase()`` unless called earlier)."""
        self._take_pending()
        if self._phases and self._phases[-1].end_items is None:
            self._phases[-1].end_items = {k: v for k, v in self._live.items() if v}

    _close_phase = end_phase

    def _finish_figures(self) -> None:
        if self._phases and self.tracker is not None and self._phases[-1].figures is None:
            self._phases[-1].figures = self.tracker.figures()

    def declare(self, key: str, *, name: str, device: Device, formula: str, source: str,
                category: str = "other", exact: bool = True, rank0_only: bool = False,
                outside_allocator: bool = False) -> None:
        """Describe an item before allocating into it (bytes accumulate over ``alloc`` calls).
        ``outside_allocator``: GPU memory PyTorch's caching allocator never sees (CUDA context)."""
        self._meta[key] = LedgerItem(key=key, name=name, device=self.place(device), bytes=0,
                                     formula=formula, source=source, category=category, exact=exact,
                                     rank0_only=rank0_only, outside_allocator=outside_allocator)

    def describe(self, key: str, formula: str) -> None:
        """Restate a declared item's formula once its content is known (an item that gathers tensors
        over several steps, e.g. params loaded, upcast and joined by adapters)."""
        self._meta[key] = replace(self._meta[key], formula=formula)

    def alloc(self, key: str, nbytes: int) -> None:
        if nbytes == 0:
            return
        meta = self._meta[key]
        dev = meta.device
        self._live[key] = self._live.get(key, 0) + nbytes
        self._dev_live[dev] += nbytes
        self.events.append(("alloc", key, dev, nbytes))
        if meta.rank0_only:
            self._rank0_live += nbytes
        if self.tracker is not None and dev in TRACKED:
            self._track(key, dev, nbytes, meta.outside_allocator)
        if dev is Device.GPU and self._phases:  # _observe for a GPU tensor: only the GPU figure can rise
            ph = self._phases[-1]
            gpu = self._dev_live[dev]
            if gpu > ph.gpu_peak:
                ph.gpu_peak = gpu
                self._pending_gpu = True
        else:
            self._observe()

    def alloc_many(self, key: str, sizes) -> None:  # noqa: ANN001 (an iterable of ints)
        """``alloc(key, n)`` for each size, in order (one tensor each); the phase peaks are observed once,
        after the last: allocations in a row only raise what is live, so the peaks are the same."""
        meta = self._meta[key]
        dev = meta.device
        tracked = self.tracker is not None and dev in TRACKED
        total = 0
        for n in sizes:
            if n == 0:
                continue
            total += n
            self.events.append(("alloc", key, dev, n))
            if tracked:
                self._track(key, dev, n, meta.outside_allocator)
        if not total:
            return
        self._live[key] = self._live.get(key, 0) + total
        self._dev_live[dev] += total
        if meta.rank0_only:
            self._rank0_live += total
        self._observe()

    def _track(self, key: str, dev: Device, nbytes: int, outside: bool) -> None:
        if dev is Device.GPU:
            handle, blk = self.tracker.alloc_gpu(nbytes, outside=outside, stream=self.streams.get(key, 0))
        else:
            handle, blk = self.tracker.alloc_pinned(key, nbytes)
        ts = self._tensors.get(key)
        if ts is None:
            ts = self._tensors[key] = []
        ts.append([nbytes, handle, blk])
        bl = self._block_live
        bl[key] = bl.get(key, 0) + blk

    def free(self, key: str, nbytes: int | None = None) -> None:
        """Free the most recent live tensor of ``nbytes`` of an item (all of it when None)."""
        live = self._live.get(key, 0)
        nbytes = live if nbytes is None else nbytes
        if nbytes > live:
            raise AssertionError(f"ledger bug: freeing {nbytes} B of {key} with {live} B live")
        if nbytes == 0:
            return
        meta = self._meta[key]
        dev = meta.device
        if self._pending_gpu or self._pending_host or self._pending_nvme:
            self._take_pending(dev)
        self._live[key] = live - nbytes
        self._dev_live[dev] -= nbytes
        self.events.append(("free", key, dev, nbytes))
        if meta.rank0_only:
            self._rank0_live -= nbytes
        if key in self._tensors:
            self._untrack(key, dev, nbytes, all_of_it=nbytes == live)

    def _untrack(self, key: str, dev: Device, nbytes: int, *, all_of_it: bool) -> None:
        ts = self._tensors[key]
        if dev is Device.GPU and key in self.deferred_frees:
            def release(handle: object) -> None:
                self.tracker.free_gpu(handle, deferred=True)
        else:
            release = self.tracker.free_gpu if dev is Device.GPU else self.tracker.free_pinned
        if all_of_it:
            for t in reversed(ts):
                release(t[1])
            ts.clear()
            self._block_live[key] = 0
            return
        for i in range(len(ts) - 1, -1, -1):
            if ts[i][0] == nbytes:
                release(ts[i][1])
                self._block_live[key] -= ts.pop(i)[2]
                return
        self.granularity_notes.append(f"{key}: freed {nbytes:,} B, which is no single live tensor of it")
        remaining = nbytes
        while remaining > 0:
            n, handle, blk = ts.pop()
            release(handle)
            self._block_live[key] -= blk
            if n > remaining:
                self._track(key, dev, n - remaining, self._meta[key].outside_allocator)
                remaining = 0
            else:
                remaining -= n

    def item(self, key: str) -> LedgerItem:
        """The declared line ``key`` (its device, category, formula)."""
        return self._meta[key]

    def live_bytes(self, key: str) -> int:
        return self._live.get(key, 0)

    def live_on(self, device: Device) -> int:
        """Bytes live on ``device`` now (what a recipe compares with free memory, as the code does)."""
        return self._dev_live[device]

    def _observe(self) -> None:
        """Note a new peak per device. Between a peak and the next free on its device only allocations
        happen, which make a new peak of their own, so the peak's items are copied lazily: at that free
        (``_take_pending``) or at the phase's end; a phase climbing tensor by tensor copies once."""
        if not self._phases:
            return
        ph = self._phases[-1]
        dev_live = self._dev_live
        gpu = dev_live[Device.GPU]
        pageable = dev_live[Device.CPU_PAGEABLE]
        host = dev_live[Device.CPU_PINNED] + pageable
        tr = self.tracker
        if gpu > ph.gpu_peak:
            ph.gpu_peak = gpu
            self._pending_gpu = True
        if host > ph.host_peak:
            ph.host_peak = host
            self._pending_host = True
            if tr is not None:
                ph.host_cached = tr.host.cached_bytes
        locked_host = pageable + (tr.pinned_locked if tr is not None else dev_live[Device.CPU_PINNED])
        if locked_host > ph.locked_host_peak:
            ph.locked_host_peak = locked_host
            ph.locked_rank0 = self._rank0_live
        nvme = dev_live[Device.NVME]
        if nvme > ph.nvme_peak:
            ph.nvme_peak = nvme
            self._pending_nvme = True

    def _take_pending(self, device: Device | None = None) -> None:
        """Copy the items of the pending peaks (of ``device``'s kind only, when given): the live items
        are still those of the peak."""
        if not self._phases:
            return
        ph = self._phases[-1]
        if self._pending_gpu and device in (None, Device.GPU):
            self._pending_gpu = False
            ph.gpu_items = self._snapshot(Device.GPU)
            if self.tracker is not None:
                ph.gpu_blocks = {k: self._block_live.get(k, 0) for k in ph.gpu_items}
        if self._pending_host and device in (None, *HOST):
            self._pending_host = False
            ph.host_items = self._snapshot(*HOST)
            if self.tracker is not None:
                ph.host_locked = {k: self._block_live[k] for k in ph.host_items if k in self._block_live}
        if self._pending_nvme and device in (None, Device.NVME):
            self._pending_nvme = False
            ph.nvme_items = self._snapshot(Device.NVME)

    def _snapshot(self, *devices: Device) -> dict[str, int]:
        meta = self._meta
        return {k: v for k, v in self._live.items() if v and meta[k].device in devices}

    # -- results ---------------------------------------------------------------------------
    def phases(self) -> tuple[PhaseLedger, ...]:
        self._close_phase()
        self._finish_figures()
        out = []
        R = self.ranks_per_node
        for ph in self._phases:
            items = [replace(self._meta[k], bytes=v, block_bytes=ph.gpu_blocks.get(k)) for k, v in ph.gpu_items.items()]
            items += [replace(self._meta[k], bytes=v, locked_bytes=ph.host_locked.get(k)) for k, v in ph.host_items.items()]
            items += [replace(self._meta[k], bytes=v) for k, v in ph.nvme_items.items()]
            if ph.host_cached:
                items.append(pinned_cache_item(ph.host_cached))
            pinned = sum(v for k, v in ph.host_items.items() if self._meta[k].device is Device.CPU_PINNED)
            host_peak = max(ph.host_peak, 0)
            rank0 = sum(v for k, v in ph.host_items.items() if self._meta[k].rank0_only)
            resident = tuple(replace(self._meta[k], bytes=v) for k, v in (ph.end_items or {}).items())
            locked_peak = max(ph.locked_host_peak, 0)
            f = ph.figures
            extra = {} if f is None else asdict(f)  # type: ignore[call-overload]
            if f is None:  # no simulation (CPU accelerator): the requested figures stand in
                gpu = max(ph.gpu_peak, 0)
                extra = dict(gpu_allocated_bytes=gpu, gpu_oom_relevant_bytes=gpu, cpu_pinned_requested_bytes=pinned,
                             cpu_pinned_locked_bytes=pinned)
            out.append(PhaseLedger(
                name=ph.name, description=ph.description, items=tuple(items), resident=resident,
                gpu_peak_bytes=max(ph.gpu_peak, 0), cpu_pinned_bytes=pinned,
                cpu_pageable_bytes=host_peak - pinned, nvme_bytes=max(ph.nvme_peak, 0),
                ranks_per_node=R, node_cpu_peak_bytes=(host_peak - rank0) * R + rank0,
                allocators_simulated=f is not None, cpu_locked_peak_bytes=locked_peak,
                node_cpu_locked_peak_bytes=(locked_peak - ph.locked_rank0) * R + ph.locked_rank0,
                **extra,
            ))
        return tuple(out)


def pinned_cache_item(cached: int) -> LedgerItem:
    from memfit.core.alloc.tracker import PINNED_CACHE_KEY

    return LedgerItem(key=PINNED_CACHE_KEY, name="freed pinned blocks torch's host allocator keeps page-locked",
                      device=Device.CPU_PINNED, bytes=0, locked_bytes=cached, category="buffers",
                      formula=f"{cached:,} B cached, reused only by a request of the same power-of-two bucket "
                              "(torch <= 1.10: by any smaller request), until empty_host_cache()",
                      source="ATen/core/CachingHostAllocator.h:maybe_cache_block / THCCachingHostAllocator.cpp:free")
