"""Typed results of ``memfit compare``: a plan reconciled with what a real run recorded.

Glossary
- *quantity*: ``allocated`` (bytes in live tensors: the ledger's kind of figure), ``reserved``
  (segments the CUDA caching allocator holds), ``pinned`` (page-locked host memory, per process),
  ``nvidia_smi`` (used memory on the card as the driver sees it: the CUDA context, every process).
- *figure*: one number with where it came from (``source``) and how exact it is.
- *source*: ``memory_stats`` (the allocator's counters, peaks reset per phase by memfit.record),
  ``snapshot trace`` (replayed from the snapshot's device_traces: requested bytes, exact),
  ``deepspeed log`` (see_memory_usage, rounded), ``nvidia-smi`` (sampled), ``mem_get_info`` (at
  the phase end), ``plan`` (the ledger) or ``plan estimate`` (a figure the plan marks as estimated).
- *attribution*: which ledger item(s) an allocation belongs to, read from its stack frames.
Renderers take these and never recompute.
"""

from __future__ import annotations


from memfit.core.lean_dataclass import dataclass

QUANTITIES = ("allocated", "reserved", "pinned", "nvidia_smi", "host")
QUANTITY_TITLES = {"allocated": "allocated (GPU)", "reserved": "reserved (GPU)", "pinned": "pinned (host)",
                   "nvidia_smi": "nvidia-smi (GPU)", "host": "host RAM (process)"}
"""``host``: the process's host memory, the plan's per-process host figure (pageable + pinned) against the
recorded resident set (``rss_peak_bytes``: what memfit.record measures on CPU, and on CUDA too)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Figure:
    bytes: int
    source: str
    tolerance_bytes: int = 0
    """How far the recorded figure can be from the truth (printing precision); 0 when exact."""
    note: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Cell:
    """One quantity of one phase: the plan's figure and every recorded one."""

    planned: Figure | None
    recorded: tuple[Figure, ...] = ()

    @property
    def primary(self) -> Figure | None:
        """The recorded figure compared with the plan: the first source (the most exact one present)."""
        return self.recorded[0] if self.recorded else None

    @property
    def diff_bytes(self) -> int | None:
        """planned - recorded (positive: the plan holds more)."""
        if self.planned is None or self.primary is None:
            return None
        return self.planned.bytes - self.primary.bytes

    @property
    def rel_diff(self) -> float | None:
        d = self.diff_bytes
        if d is None or not self.primary or not self.primary.bytes:
            return None
        return d / self.primary.bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class PhaseRow:
    phase: str
    plan_phases: tuple[str, ...]
    """The plan's phases this row's planned figures come from (the max over them)."""
    occurrences: int
    """How many times the recording went through this phase (later steps fold into step2.*)."""
    allocated: Cell
    reserved: Cell
    pinned: Cell
    nvidia_smi: Cell
    host: Cell = Cell(planned=None)
    note: str = ""

    def cell(self, quantity: str) -> Cell:
        return getattr(self, quantity)


@dataclass(frozen=True, slots=True, kw_only=True)
class KeyRow:
    """Bytes of one ledger item (or of items the frames cannot tell apart) at a phase's peak."""

    keys: tuple[str, ...]
    name: str
    planned_bytes: int | None
    """``None``: the plan has no such item in this phase."""
    recorded_bytes: int
    exact: bool = True
    """False when any of the planned items is an estimate."""

    @property
    def diff_bytes(self) -> int | None:
        return None if self.planned_bytes is None else self.planned_bytes - self.recorded_bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class PhaseAttribution:
    phase: str
    plan_phase: str | None
    """The plan phase whose items are compared (the one with the highest tensor bytes)."""
    peak_bytes: int
    """Live requested bytes at the phase's peak (from the trace)."""
    peak_time_us: int | None
    rows: tuple[KeyRow, ...]
    unattributed_bytes: int = 0
    """Live at the peak with frames no rule recognises (see ``Attribution.unplanned``)."""
    before_trace_bytes: int = 0
    """Live at the peak but allocated before the trace began (no frames to read)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class UnplannedAllocation:
    where: str
    """The innermost frame of interest, ``package/file.py:function``."""
    keys: tuple[str, ...]
    """The ledger key a rule points to that the plan does not have on the GPU; ``()`` when no rule matched."""
    peak_live_bytes: int
    """Most bytes of these allocations live at one time."""
    count: int
    stack: tuple[str, ...]
    """A few frames of one of them, innermost first."""
    phases: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class MissingItem:
    key: str
    name: str
    planned_bytes: int
    phases: tuple[str, ...]
    reason: str
    """``never allocated in the recorded trace`` or ``its phases were not recorded``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Attribution:
    rank: int
    trace_events: int
    phases: tuple[PhaseAttribution, ...]
    unplanned: tuple[UnplannedAllocation, ...]
    missing: tuple[MissingItem, ...]
    not_visible: tuple[str, ...] = ()
    """Planned GPU items the caching allocator never sees (CUDA context, NCCL): not compared."""
    rules: tuple[str, ...] = ()
    """How frames were read: each rule, ``file:function -> key``, and where it comes from."""
    notes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class SimulatorCheck:
    """The CUDA caching allocator simulator replayed on a recorded alloc/free sequence (contract 4)."""

    rank: int
    device: int
    status: str
    """``checked``, ``unavailable`` (no simulator in this memfit), ``not exact`` (the trace does not
    start from an empty allocator) or ``no trace``."""
    events: int
    recorded_reserved_peak_bytes: int | None
    simulated_reserved_peak_bytes: int | None = None
    divergences: tuple[str, ...] = ()
    reason: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class SeriesPoint:
    x: float
    """Position on the chart's phase axis: phase index + fraction of the phase's time elapsed."""
    bytes: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Series:
    label: str
    """e.g. ``allocated (snapshot trace)``, ``reserved``, ``nvidia-smi``."""
    points: tuple[SeriesPoint, ...]
    style: str = "line"
    """``line`` (continuous), ``step`` (one value per phase) or ``dots`` (samples)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Timeline:
    """Memory over the run on the phase axis, for the chart drawn under the plan's."""

    phases: tuple[str, ...]
    plan: Series
    """The plan's GPU per-rank peak per phase (a step line), or its host figure per process when the
    recording has no GPU figures (a CPU recording: ``device`` ``host``)."""
    recorded: tuple[Series, ...]
    capacity_bytes: int | None = None
    device: str = "gpu"
    """``gpu`` (per rank) or ``host`` (per process)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RecordSummary:
    """What one record file gives: shown so the reader knows where each number comes from."""

    path: str
    kind: str
    provides: tuple[str, ...]
    detail: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Reconciliation:
    scenario_name: str
    rank: int
    ranks: tuple[int, ...]
    rows: tuple[PhaseRow, ...]
    records: tuple[RecordSummary, ...]
    attribution: Attribution | None
    simulator: SimulatorCheck | None
    timeline: Timeline | None
    ds_reports: tuple[tuple[str, str | None, int, int], ...] = ()
    """DeepSpeed reports not compared: (message, phase, MA bytes, Max_MA bytes)."""
    notes: tuple[str, ...] = ()
