"""Typed records of a real run: what torch, DeepSpeed and nvidia-smi wrote, parsed once at the edge.

Glossary
- *record*: one file a real run left behind (a memory snapshot pickle, a JSON of
  ``torch.cuda.memory_stats()`` per phase, DeepSpeed ``see_memory_usage`` lines, an nvidia-smi CSV).
  A *record directory* (what ``memfit.record`` writes) holds several, one set per rank.
- *trace event*: one entry of a snapshot's ``device_traces``: what the CUDA caching allocator did
  (``c10/cuda/CUDACachingAllocator.cpp``, ``record_trace``). ``alloc``/``free_requested``/
  ``free_completed`` carry the *requested* size (``orig_size``/``block->requested_size``);
  ``segment_alloc``/``segment_free`` the ``cudaMalloc``'d segment size; ``segment_map``/
  ``segment_unmap`` the pages an expandable segment maps; ``oom`` the failed request and the
  ``device_free`` bytes CUDA reported.
- *phase*: a memfit phase name (``memfit.core.ledger_types.PHASES``), or the coarser names a
  training script can mark (``initialize`` for the whole ``deepspeed.initialize``, ``setup``).

No torch here; renderers and ``memfit compare`` take these objects and never re-read a file.
"""

from __future__ import annotations


from memfit.core.lean_dataclass import dataclass

TRACE_ACTIONS = ("alloc", "free_requested", "free_completed", "segment_alloc", "segment_free",
                 "segment_map", "segment_unmap", "oom", "snapshot")
"""``TraceEntry::Action`` names as ``torch.cuda.memory._snapshot()`` spells them (torch/csrc/cuda/
Module.cpp:THCPModule_memorySnapshot, ``action_to_str``)."""

ALLOCATOR_ACTIONS = TRACE_ACTIONS[:-1]
"""The actions the allocator simulator replays (BRIEF contract 4); ``snapshot`` only marks when a
snapshot was taken."""

BLOCK_STATES = ("active_allocated", "active_pending_free", "active_awaiting_free", "inactive")
"""Block states: ``active_pending_free`` is what the C++ writes, ``active_awaiting_free`` what the
TypedDict in torch/cuda/memory.py documents; both mean freed by the program, awaiting its streams."""


@dataclass(frozen=True, slots=True)
class StackFrame:
    """One frame of a recorded stack (``Frame`` TypedDict): innermost first in every list."""

    filename: str
    line: int
    name: str

    def short(self) -> str:
        """``.../site-packages/deepspeed/runtime/engine.py:forward`` -> ``deepspeed/runtime/engine.py:forward``."""
        path = self.filename.replace("\\", "/")
        for mark in ("site-packages/", "dist-packages/"):
            if mark in path:
                path = path.rsplit(mark, 1)[1]
                break
        return f"{path}:{self.name}"


@dataclass(frozen=True, slots=True)
class TraceEvent:
    """One allocator action (BRIEF contract 4: ``TraceEvent(action, addr, size, stream)``)."""

    action: str
    addr: int
    """Block or segment address; for ``oom`` the free device memory CUDA reported (the C++
    ``TraceEntry::addr_`` holds it; the snapshot's dict calls it ``device_free``)."""
    size: int
    stream: int
    time_us: int | None = None
    """Unix time in microseconds (torch >= 2.1 records it; converted from the allocator's approximate
    clock to ``c10::getTime()``, CLOCK_REALTIME on Linux)."""
    frames: tuple[StackFrame, ...] = ()
    device_free: int | None = None
    """``oom`` only: the bytes CUDA still reported free."""


@dataclass(frozen=True, slots=True)
class DeviceTrace:
    device: int
    events: tuple[TraceEvent, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class SnapshotBlock:
    """A piece of a segment at the moment of the snapshot (``Block`` TypedDict)."""

    address: int
    size: int
    requested_size: int
    state: str
    frames: tuple[StackFrame, ...] = ()

    @property
    def live(self) -> bool:
        """Held by a tensor, or freed but still in use by a stream (not yet reusable)."""
        return self.state != "inactive"


@dataclass(frozen=True, slots=True, kw_only=True)
class SnapshotSegment:
    """One ``cudaMalloc`` (or expandable) segment (``Segment`` TypedDict)."""

    device: int
    address: int
    total_size: int
    allocated_size: int
    active_size: int
    stream: int
    segment_type: str
    """``large`` (blocks over 1 MiB) or ``small``."""
    pool_id: tuple[int, int] = (0, 0)
    is_expandable: bool = False
    blocks: tuple[SnapshotBlock, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class AllocatorSettings:
    """``allocator_settings`` of a snapshot (torch >= 2.4): how the caching allocator was configured."""

    conf: str | None = None
    """``PYTORCH_CUDA_ALLOC_CONF`` (or ``PYTORCH_ALLOC_CONF``) as the allocator last read it."""
    expandable_segments: bool | None = None
    max_split_size_bytes: int | None = None
    """-1 (SIZE_MAX) or absent: no limit."""
    garbage_collection_threshold: float | None = None
    roundup_power2_divisions: tuple[tuple[int, int], ...] = ()
    """(interval start in MiB, divisions) as the snapshot lists them."""
    other: tuple[tuple[str, str], ...] = ()
    """Any other setting, as text."""


@dataclass(frozen=True, slots=True, kw_only=True)
class MemorySnapshot:
    """A ``torch.cuda.memory._dump_snapshot`` pickle, parsed."""

    path: str
    rank: int | None
    segments: tuple[SnapshotSegment, ...]
    traces: tuple[DeviceTrace, ...]
    """One per device index that has a trace (empty when history was off or ``enabled="state"``)."""
    allocator: AllocatorSettings | None = None
    format: str = "torch>=2.1"
    """``torch>=2.1`` (blocks carry ``frames``) or ``legacy`` (blocks carry ``history``)."""

    def trace(self, device: int) -> DeviceTrace | None:
        for t in self.traces:
            if t.device == device:
                return t
        return None

    def devices(self) -> tuple[int, ...]:
        return tuple(sorted({s.device for s in self.segments} | {t.device for t in self.traces}))


@dataclass(frozen=True, slots=True, kw_only=True)
class PhaseStats:
    """The allocator counters over one phase, as one rank saw them (peaks reset at the phase start).

    ``None`` where the record has no such counter (on CPU torch keeps no allocator statistics).
    """

    name: str
    """Canonical phase name (``forward``, ``step2.forward``, ``initialize``, ...)."""
    label: str = ""
    """What the script called it, when that differs (e.g. ``forward`` of step 3)."""
    step: int | None = None
    micro_step: int | None = None
    t_start_us: int | None = None
    t_end_us: int | None = None
    """Unix time in microseconds."""
    device_allocated_peak_bytes: int | None = None
    """``memory_stats()["allocated_bytes.all.peak"]``: block sizes (requests rounded up to 512 B)."""
    device_allocated_end_bytes: int | None = None
    device_requested_peak_bytes: int | None = None
    """``requested_bytes.all.peak``: what tensors asked for (the ledger's kind of figure)."""
    device_reserved_peak_bytes: int | None = None
    """``reserved_bytes.all.peak``: segments held from ``cudaMalloc``."""
    device_reserved_end_bytes: int | None = None
    device_num_ooms: int | None = None
    device_num_alloc_retries: int | None = None
    driver_used_end_bytes: int | None = None
    """``total - free`` of ``torch.cuda.mem_get_info()`` at the phase end: the whole card, every
    process and the CUDA context included (what nvidia-smi calls used)."""
    device_total_bytes: int | None = None
    pinned_held_peak_bytes: int | None = None
    """``host_memory_stats()["allocated_bytes.peak"]``: page-locked blocks the pinned allocator
    holds (in use or cached), each rounded up to a power of two."""
    pinned_held_end_bytes: int | None = None
    pinned_in_use_peak_bytes: int | None = None
    """``active_bytes.peak`` (torch sums per-bucket peaks: "best-effort approximation")."""
    rss_start_bytes: int | None = None
    rss_end_bytes: int | None = None
    rss_peak_bytes: int | None = None
    """Process resident set (VmRSS; the peak is VmHWM reset at the phase start where Linux allows)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StatsRecording:
    """Counters per phase for one rank (a ``memfit.record`` stats file, or a JSON of memory_stats)."""

    path: str
    rank: int | None
    device: str
    """``cuda`` (allocator counters present), ``cpu`` (process RSS only) or ``unknown``."""
    phases: tuple[PhaseStats, ...]
    device_name: str | None = None
    torch_version: str | None = None
    utc_offset_s: int | None = None
    """The recording machine's local time minus UTC, to align nvidia-smi's local timestamps."""
    snapshot_file: str | None = None
    notes: tuple[str, ...] = ()
    overhead_s: float | None = None
    """Time the recorder itself spent (synchronize + reading counters), as it measured."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DsMemoryLine:
    """One DeepSpeed ``see_memory_usage`` report (deepspeed/runtime/utils.py:see_memory_usage).

    DeepSpeed divides by 1024**3 and prints "GB": the figures are GiB. MA/Max_MA/CA are rounded to
    2 decimals (+-0.005 GiB); Max_CA to a whole GiB (+-0.5 GiB). Max_MA and Max_CA are peaks since the
    previous report (the function resets the peak counters after printing)."""

    line: int
    message: str
    rank: int | None
    allocated_bytes: int
    peak_allocated_bytes: int
    reserved_bytes: int
    peak_reserved_bytes: int
    host_used_bytes: int | None = None
    """``CPU Virtual Memory: used = X GB`` (psutil total - available, the whole host, GiB)."""
    phase: str | None = None
    """The phase whose end this report marks (``None`` when its message names none memfit knows)."""
    precision_bytes: int = 5_368_709
    """Half a unit of the last printed digit of MA/Max_MA/CA (0.005 GiB)."""
    peak_reserved_precision_bytes: int = 2**29
    """Max_CA is printed as a whole number of GiB."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DsLogRecording:
    path: str
    lines: tuple[DsMemoryLine, ...]
    notes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class SmiSample:
    """One nvidia-smi reading: ``memory.used`` in MiB (2**20 B) as printed."""

    local_time_us: int | None
    """The timestamp as nvidia-smi prints it (local wall time, no zone), as microseconds since the
    epoch *read as if UTC*; ``None`` when the CSV has no timestamp column."""
    gpu: int
    used_bytes: int


@dataclass(frozen=True, slots=True, kw_only=True)
class SmiRecording:
    path: str
    samples: tuple[SmiSample, ...]
    notes: tuple[str, ...] = ()

    def gpus(self) -> tuple[int, ...]:
        return tuple(sorted({s.gpu for s in self.samples}))


Record = MemorySnapshot | StatsRecording | DsLogRecording | SmiRecording


@dataclass(frozen=True, slots=True, kw_only=True)
class RecordSet:
    """Every record given to ``memfit compare`` (files and record directories together)."""

    snapshots: tuple[MemorySnapshot, ...] = ()
    stats: tuple[StatsRecording, ...] = ()
    ds_logs: tuple[DsLogRecording, ...] = ()
    smi: tuple[SmiRecording, ...] = ()
    notes: tuple[str, ...] = ()
    """What was read, skipped or assumed, said out loud."""

    def ranks(self) -> tuple[int, ...]:
        found = {r.rank for r in (*self.snapshots, *self.stats) if r.rank is not None}
        return tuple(sorted(found)) or (0,)

    def stats_for(self, rank: int) -> StatsRecording | None:
        for s in self.stats:
            if (s.rank or 0) == rank:
                return s
        return None

    def snapshot_for(self, rank: int) -> MemorySnapshot | None:
        for s in self.snapshots:
            if (s.rank or 0) == rank:
                return s
        return None
