"""``memfit.record``: record a training script's memory phase by phase, for ``memfit compare``.

::

    import memfit

    with memfit.record("runs/rec1", snapshot=True) as rec:      # before the model is built
        with rec.phase("load"):
            model = AutoModelForCausalLM.from_pretrained(...)
        with rec.phase("initialize"):                           # or "setup" without DeepSpeed
            engine, *_ = deepspeed.initialize(model=model, ...)
        for batch in loader:
            with rec.phase("forward"):
                loss = engine(**batch).loss
            with rec.phase("backward"):
                engine.backward(loss)
            with rec.phase("optimizer_step"):
                engine.step()

Phase names (BRIEF contract 1): the script says ``forward``/``backward``/``optimizer_step`` every
step; the recorder names step 1's ``forward``, ``backward``, ``optimizer_step``, step 1's later
micro-steps (gradient accumulation) ``accum.forward``/``accum.backward``, and every later step
``step2.*`` (the steady state; ``memfit compare`` takes the highest). Any other name is kept.

Per phase, on CUDA: ``torch.cuda.synchronize()``, then the peak counters are reset
(``reset_peak_memory_stats``, ``reset_peak_host_memory_stats``) at the start, and at the end
``memory_stats()``, ``host_memory_stats()`` and ``mem_get_info()`` are saved, with the process RSS.
On CPU torch's allocator keeps no statistics: the RSS alone is saved, and the file says so.
With ``snapshot=True`` (off by default) CUDA's allocation history is recorded from the start
(``torch.cuda.memory._record_memory_history``) and dumped per rank at the end
(``_dump_snapshot``), also when the run fails (an OOM's snapshot is the most useful one).

Each rank writes ``stats.rank<R>.json`` (and ``snapshot.rank<R>.pickle``) into the directory,
through memfit's one writer (``memfit.core.writing``): never through a symbolic link of either name
(refused when the recording starts, and again when it writes), never over an existing file unless
``overwrite=True``, which replaces the file itself (a new file renamed over it), never a link's
target. The recorder's own cost (synchronize + counters) is measured and saved as ``overhead_s``.

``max_entries`` (default ``DEFAULT_MAX_ENTRIES``, 200,000) bounds the allocation history's ring
buffer: a snapshot of that many entries, with torch's default Python and C++ stacks, stays within
what ``memfit compare`` reads (``memfit.core.records.bounded``: 128 MiB, 300,000 entries).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import math
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from memfit.core.records.stats_json import FORMAT, VERSION
from memfit.core.writing import FileExistsOnDisk, write_file
from memfit.errors import MemfitError

STEP_PHASES = ("forward", "backward", "optimizer_step")
DEFAULT_MAX_ENTRIES = 200_000
"""The allocation history's ring buffer (see the module docstring)."""
EXISTS_HINT = "record into a new directory (or overwrite=True)"
CPU_NOTE = ("device cpu: torch's CPU allocator keeps no statistics; each phase has the process RSS only "
            "(VmRSS at its start and end, VmHWM reset at its start for the peak where /proc/self/clear_refs allows)")


def _env_rank() -> int:
    for var in ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 0


def _numbers(stats: Any) -> dict[str, int | float]:
    """A flat counter dict as plain JSON numbers (memory_stats() values are ints; some host timings
    floats, never written when not finite: strict JSON has no NaN)."""
    out: dict[str, int | float] = {}
    for k, v in dict(stats).items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or (isinstance(v, float) and not math.isfinite(v)):
            continue
        out[str(k)] = v
    return out


def canonical_name(label: str, step: int, micro: int) -> str:
    """Contract 1's name for step phase ``label`` of 1-based ``step`` and ``micro`` step."""
    if step >= 2:
        return f"step2.{label}"
    if label != "optimizer_step" and micro > 1:
        return f"accum.{label}"
    return label


class StepNamer:
    """Canonical step phase names from the order the script marks them (pure; tested on its own)."""

    def __init__(self) -> None:
        self.step = 0
        self.micro = 0
        self.last = None

    def name(self, label: str) -> tuple[str, int | None, int | None]:
        if label not in STEP_PHASES:
            return label, None, None
        if label == "forward":
            if self.step == 0 or self.last == "optimizer_step":
                self.step, self.micro = self.step + 1, 1
            else:
                self.micro += 1
        elif self.step == 0:  # backward/step without a forward mark: step 1
            self.step, self.micro = 1, 1
        self.last = label
        return canonical_name(label, self.step, self.micro), self.step, self.micro


class Recorder:
    """See the module docstring. Use ``memfit.record(...)`` to make one."""

    def __init__(self, out_dir: str | os.PathLike, *, snapshot: bool = False, max_entries: int = DEFAULT_MAX_ENTRIES,
                 device: str | None = None, overwrite: bool = False) -> None:
        self.out_dir = Path(out_dir)
        self.snapshot = snapshot
        self.max_entries = max_entries
        self.requested_device = device
        self.overwrite = overwrite
        self.phases: list[dict[str, Any]] = []
        self.notes: list[str] = []
        self.current: dict[str, Any] | None = None
        self.namer = StepNamer()
        self.overhead_s = 0.0
        self.torch = None
        self.cuda = False
        self.rss = None
        self.started = False
        self.written: list[Path] = []

    # ------------------------------------------------------------------------------ lifecycle

    def __enter__(self) -> "Recorder":
        self.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.finish(error=None if exc is None else f"{type(exc).__name__}: {str(exc)[:300]}")

    def start(self) -> None:
        import torch

        from memfit.replay.phases import RssMonitor

        t = time.perf_counter()
        self.torch = torch
        wanted = self.requested_device or ("cuda" if torch.cuda.is_available() else "cpu")
        if wanted not in ("cuda", "cpu"):
            raise MemfitError(f"memfit.record: device must be 'cuda' or 'cpu', not {wanted!r}")
        if wanted == "cuda" and not torch.cuda.is_available():
            raise MemfitError("memfit.record: device='cuda' but torch sees no CUDA device")
        self.cuda = wanted == "cuda"
        rank = _env_rank()
        self._check_targets(rank)
        try:
            self.out_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise MemfitError(f"memfit.record: cannot create {self.out_dir}: {e.strerror or type(e).__name__}") from None
        self.rss = RssMonitor()
        if not self.rss.exact:
            self.notes.append("RSS peaks are sampled every 2 ms (/proc/self/clear_refs refused): a short peak can be missed")
        if self.cuda:
            torch.cuda.init()  # the allocator exists per device once CUDA is initialised
            if self.snapshot:
                torch.cuda.memory._record_memory_history(max_entries=self.max_entries)
        else:
            self.notes.append(CPU_NOTE)
            if self.snapshot:
                self.notes.append("snapshot=True ignored: memory snapshots exist for CUDA only")
        self.started = True
        self.overhead_s += time.perf_counter() - t

    def _check_targets(self, rank: int) -> None:
        """Before anything is recorded: this rank's file names are no symbolic link, and no file
        unless ``overwrite``."""
        names = [f"stats.rank{rank}.json"] + ([f"snapshot.rank{rank}.pickle"] if self.snapshot else [])
        for name in names:
            target = self.out_dir / name
            if os.path.islink(target):
                raise FileExistsOnDisk(f"memfit.record: {target} is a symbolic link; memfit never writes through one "
                                       "(remove it, or record into a new directory)")
            if os.path.lexists(target) and not self.overwrite:
                raise FileExistsOnDisk(f"memfit.record: {target} exists; {EXISTS_HINT}")

    def finish(self, error: str | None = None) -> list[Path]:
        """Close the open phase and write this rank's files. Returns the paths written."""
        if not self.started:
            return []
        t = time.perf_counter()
        self.close_phase(error=error)
        torch = self.torch
        rank = _env_rank()
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            rank = torch.distributed.get_rank()
        world = torch.distributed.get_world_size() if torch.distributed.is_available() and torch.distributed.is_initialized() \
            else int(os.environ.get("WORLD_SIZE", "1") or 1)
        snapshot_file = None
        if self.cuda and self.snapshot:
            import pickle

            snapshot_file = f"snapshot.rank{rank}.pickle"
            # what torch.cuda.memory._dump_snapshot does (pickle.dump of _snapshot()), through memfit's writer
            data = pickle.dumps(torch.cuda.memory._snapshot())
            torch.cuda.memory._record_memory_history(enabled=None)
            self.written.append(write_file(self.out_dir / snapshot_file, data, what="memfit.record",
                                           overwrite=self.overwrite, exists_hint=EXISTS_HINT))
        if error:
            self.notes.append(f"the run failed: {error}")
        self.rss.close()
        self.overhead_s += time.perf_counter() - t
        name = None
        if self.cuda:
            idx = torch.cuda.current_device()
            props = torch.cuda.get_device_properties(idx)
            name = f"{props.name} (cuda:{idx})"
        offset = datetime.datetime.now().astimezone().utcoffset()
        doc = {"format": FORMAT, "version": VERSION, "rank": rank, "world_size": world, "device": "cuda" if self.cuda else "cpu",
               "device_name": name, "torch_version": torch.__version__,
               "utc_offset_s": int(offset.total_seconds()) if offset is not None else 0,
               "snapshot_file": snapshot_file, "overhead_s": round(self.overhead_s, 6), "notes": self.notes,
               "phases": self.phases}
        path = write_file(self.out_dir / f"stats.rank{rank}.json", json.dumps(doc, indent=1) + "\n",
                          what="memfit.record", overwrite=self.overwrite, exists_hint=EXISTS_HINT)
        self.written.append(path)
        self.started = False
        return self.written

    # ------------------------------------------------------------------------------------ phases

    def mark(self, label: str, *, step: int | None = None, micro_step: int | None = None) -> None:
        """Close the running phase and open ``label``. A loop that knows its own 1-based ``step`` and
        ``micro_step`` (gradient accumulation) may give them; otherwise they follow from the order of
        the marks (a ``forward`` after an ``optimizer_step`` starts a new step)."""
        if not self.started:
            raise RuntimeError("memfit.record: mark() outside the recording (use it inside `with memfit.record(...)`)")
        if not isinstance(label, str) or not label or len(label) > 100:
            raise MemfitError(f"memfit.record: a phase name is a short text, not {label!r}")
        self.close_phase()
        t = time.perf_counter()
        if step is not None and label in STEP_PHASES:
            micro = micro_step or 1
            name = canonical_name(label, step, micro)
        else:
            name, step, micro = self.namer.name(label)
        entry: dict[str, Any] = {"name": name, "label": label, "step": step, "micro_step": micro}
        if self.cuda:
            cuda = self.torch.cuda
            cuda.synchronize()
            cuda.reset_peak_memory_stats()
            try:
                cuda.reset_peak_host_memory_stats()
            except (AttributeError, RuntimeError):
                pass
        entry["rss_start_bytes"] = self.rss.current()
        self.rss.reset()
        entry["t_start_us"] = time.time_ns() // 1000
        self.current = entry
        self.overhead_s += time.perf_counter() - t

    def close_phase(self, error: str | None = None) -> None:
        entry, self.current = self.current, None
        if entry is None:
            return
        t = time.perf_counter()
        if self.cuda:
            cuda = self.torch.cuda
            try:
                cuda.synchronize()
            except RuntimeError as exc:  # a device fault: read what the allocator still knows
                entry["synchronize_error"] = str(exc)[:200]
            entry["memory_stats"] = _numbers(cuda.memory_stats())
            try:
                entry["host_memory_stats"] = _numbers(cuda.host_memory_stats())
            except (AttributeError, RuntimeError):
                pass
            free, total = cuda.mem_get_info()
            entry["mem_get_info"] = [int(free), int(total)]
        entry["t_end_us"] = time.time_ns() // 1000
        entry["rss_end_bytes"] = self.rss.current()
        entry["rss_peak_bytes"] = self.rss.peak()
        entry["completed"] = error is None
        if error:
            entry["error"] = error
        self.phases.append(entry)
        self.overhead_s += time.perf_counter() - t

    @contextlib.contextmanager
    def phase(self, label: str) -> Iterator[None]:
        """``with rec.phase("forward"): ...``: the block is one phase."""
        self.mark(label)
        try:
            yield
        except BaseException as exc:
            self.close_phase(error=f"{type(exc).__name__}: {str(exc)[:300]}")
            raise
        self.close_phase()


def record(out_dir: str | os.PathLike, *, snapshot: bool = False, max_entries: int = DEFAULT_MAX_ENTRIES,
           device: str | None = None, overwrite: bool = False) -> Recorder:
    """A ``Recorder`` to use as a context manager (see the module docstring).

    ``snapshot``: also record CUDA's allocation history and dump it per rank (off by default: it keeps
    a stack per allocation; ``max_entries`` bounds the ring buffer). ``device``: ``cuda`` (default when
    available) or ``cpu``. ``overwrite``: replace this rank's earlier files in ``out_dir`` (the files
    themselves: a symbolic link of either name is refused, never followed).
    """
    return Recorder(out_dir, snapshot=snapshot, max_entries=max_entries, device=device, overwrite=overwrite)
