"""Read a ``torch.cuda.memory._dump_snapshot`` pickle without ever running code from it.

What a real snapshot holds: ``_dump_snapshot`` pickles the dict ``torch.cuda.memory._snapshot()``
returns, which the C++ side builds from Python built-ins only (torch/csrc/cuda/Module.cpp:
``THCPModule_memorySnapshot``: ``py::dict``, ``py::list``, ``py::str``, ints, a ``std::pair`` pool id
that becomes a tuple, bools, a float ``garbage_collection_threshold``). Pickling built-ins needs no
``GLOBAL``/``STACK_GLOBAL`` opcode at any protocol (0 to 5; a test pickles a snapshot-shaped dict at
each), so ``find_class`` is never called for an honest snapshot. ``SnapshotUnpickler.find_class``
therefore refuses every global: ``os.system``, ``builtins.eval``, any class with a ``__reduce__``.
Persistent ids (``persistent_load``) are refused by ``pickle.Unpickler`` itself, and extension
codes go through ``find_class`` too. No other opcode can call anything.

The parsed dict is then checked against the documented format (the TypedDicts ``Segment``,
``Block``, ``Frame``, ``TraceEntry`` in torch/cuda/memory.py, and the older ``history`` form that
torch/cuda/_memory_viz.py:_block_extra_legacy still reads) and turned into frozen objects.

Bounded (``memfit.core.records.bounded``): the file's size, the memory its unpickling takes, the
number of segments, blocks, trace entries and frames per stack, each counted per reference (a list
shared by a thousand entries counts a thousand times: the comparison walks it that often), and every
integer (sizes at most 1 EiB, addresses 64-bit). Every shared object (torch shares frame dicts
between entries; a hostile file may share segments, blocks, events or whole traces) is converted
once, memoized by identity, and stacks with the same frames become one tuple, so the comparison
attributes each distinct stack once.
"""

from __future__ import annotations

import math
import pickle
from pathlib import Path
from typing import Any

from memfit.core.hardware import MAX_SIZE_BYTES
from memfit.core.records.bounded import (
    MAX_ADDRESS,
    MAX_RANK,
    MAX_SNAPSHOT_BLOCKS,
    MAX_SNAPSHOT_BYTES,
    MAX_SNAPSHOT_EVENTS,
    MAX_SNAPSHOT_SEGMENTS,
    MAX_STACK_FRAMES,
    MAX_TIME_US,
    MAX_UNPICKLE_GROWTH_BYTES,
    BudgetedFile,
    MemoryBudgetExceeded,
    RecordError,
    check_count,
    gc_paused,
    quote,
    record_bytes,
)
from memfit.core.records.types import (
    BLOCK_STATES,
    TRACE_ACTIONS,
    AllocatorSettings,
    DeviceTrace,
    MemorySnapshot,
    SnapshotBlock,
    SnapshotSegment,
    StackFrame,
    TraceEvent,
)

__all__ = ["RecordError", "SnapshotUnpickler", "load_plain_pickle", "parse_snapshot", "read_snapshot"]

ALLOWED_GLOBALS: frozenset[tuple[str, str]] = frozenset()
"""(module, name) pairs a snapshot may reference: none (see the module docstring)."""
MAX_LINE = 2**63
"""A frame's line number (C++ frames write 0; anything past a 64-bit int is not a line)."""
SMALLER = ("record a shorter window: torch.cuda.memory._record_memory_history(max_entries=...) or "
           "memfit.record(..., max_entries=...)")


class SnapshotUnpickler(pickle.Unpickler):
    """``pickle.Unpickler`` that builds plain data only: every global is refused."""

    def find_class(self, module: str, name: str):  # noqa: D102 - see the class docstring
        if (module, name) in ALLOWED_GLOBALS:  # pragma: no cover - the allow-list is empty
            return super().find_class(module, name)
        raise pickle.UnpicklingError(
            f"it references {module}.{name}; a memory snapshot holds only plain data (dicts, lists, "
            "strings, numbers), so memfit refuses to load it (nothing in it was run)")


def load_plain_pickle(data: bytes, what: str, *, budget: int = MAX_UNPICKLE_GROWTH_BYTES) -> Any:
    """Unpickle ``data`` with ``SnapshotUnpickler``, stopped once its objects take more than
    ``budget`` bytes of memory; any failure becomes one ``RecordError`` line."""
    if data[:2] == b"PK":
        raise RecordError(f"{what}: a zip archive (torch.save format?), not a torch.cuda.memory._dump_snapshot "
                          "pickle; memfit reads only plain pickles")
    try:
        return SnapshotUnpickler(BudgetedFile(data, budget)).load()
    except MemoryBudgetExceeded:
        raise RecordError(f"{what}: unpickling it took over {budget // 2**20:,} MiB of memory and was stopped; memfit "
                          f"reads snapshots of up to {MAX_SNAPSHOT_EVENTS:,} entries ({SMALLER})") from None
    except pickle.UnpicklingError as exc:
        raise RecordError(f"{what}: not a memory snapshot memfit can read: {exc}") from None
    except RecursionError:
        raise RecordError(f"{what}: not a memory snapshot: nested too deeply") from None
    except MemoryError:
        raise RecordError(f"{what}: not a memory snapshot: it asks for more memory than this machine has") from None
    except Exception as exc:  # EOFError, ValueError, KeyError, ... from a malformed stream
        raise RecordError(f"{what}: not a readable pickle ({type(exc).__name__}: {str(exc)[:200]})") from None


def read_snapshot(path: str | Path, *, rank: int | None = None) -> MemorySnapshot:
    """Parse the snapshot pickle at ``path`` (at most ``MAX_SNAPSHOT_BYTES``)."""
    p = Path(path)
    data = record_bytes(p, what="memory snapshot", max_bytes=MAX_SNAPSHOT_BYTES)
    with gc_paused():  # millions of containers built, none garbage (gc_paused says what it saves)
        obj = load_plain_pickle(data, str(p))
        del data  # the objects are built: the file's bytes are no longer needed
        try:
            return parse_snapshot(obj, path=str(p), rank=rank)
        finally:
            del obj  # freed before the collector is back on, which would walk them all once more


# ------------------------------------------------------------------------------------- validation

def _whole(v: Any, lo: int, hi: int) -> bool:
    return type(v) is int and lo <= v <= hi  # ``type() is``: bool is not a count


class _Reader:
    """Checks the documented shapes; converts each shared object once (memoized by identity: the raw
    tree stays alive while it is read, so no identity is reused)."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.frame_memo: dict[int, StackFrame] = {}
        self.list_memo: dict[int, tuple[StackFrame, ...]] = {}
        self.stacks: dict[int, list[tuple[StackFrame, ...]]] = {}
        self.blocks: dict[tuple[int, int], SnapshotBlock] = {}
        self.segments: dict[int, SnapshotSegment] = {}
        self.events: dict[int, TraceEvent] = {}
        self.legacy = False

    def fail(self, msg: str) -> RecordError:
        return RecordError(f"{self.where}: not a torch memory snapshot: {msg}")

    def int_(self, d: dict, key: str, ctx: str, *, default: int | None = None, minimum: int | None = 0,
             maximum: int = MAX_SIZE_BYTES) -> int:
        v = d.get(key, default)
        if v is None:
            raise self.fail(f"{ctx} has no {key!r}")
        if isinstance(v, bool) or not isinstance(v, int):
            raise self.fail(f"{ctx} {key!r} is {type(v).__name__}, not an integer")
        if minimum is not None and v < minimum:
            raise self.fail(f"{ctx} {key!r} is negative ({quote(v)})")
        lowest = -maximum if minimum is None else minimum
        if not lowest <= v <= maximum:
            raise self.fail(f"{ctx} {key!r} is {quote(v)}, beyond {maximum:,}"
                            + (" (1 EiB, the most memfit reads)" if maximum == MAX_SIZE_BYTES else ""))
        return v

    def list_(self, v: Any, ctx: str) -> list | tuple:
        if not isinstance(v, (list, tuple)):
            raise self.fail(f"{ctx} is {type(v).__name__}, not a list")
        return v

    def dict_(self, v: Any, ctx: str) -> dict:
        if not isinstance(v, dict):
            raise self.fail(f"{ctx} is {type(v).__name__}, not a dict")
        return v

    def frames(self, v: Any, ctx: str) -> tuple[StackFrame, ...]:
        if v is None:
            return ()
        hit = self.list_memo.get(id(v))
        if hit is not None:
            return hit
        raw = self.list_(v, f"{ctx} frames")
        if len(raw) > MAX_STACK_FRAMES:
            raise self.fail(f"{ctx} has a stack of {len(raw):,} frames; memfit reads at most {MAX_STACK_FRAMES:,}")
        ids = tuple(map(id, raw))
        result = tuple(map(self.frame_memo.get, ids))
        if not all(result):  # a frame not seen yet (frames are always true; None is not)
            result = tuple(self.frame_memo.get(i) or self.frame(f, ctx) for i, f in zip(ids, raw))
        # one tuple per distinct stack: frames are memoized, so equal stacks hold the same objects
        # (and tuple equality tests identity first: a hit costs no frame comparison)
        same = self.stacks.setdefault(hash(ids), [])
        for known in same:
            if known == result:
                result = known
                break
        else:
            same.append(result)
        self.list_memo[id(v)] = result
        return result

    def frame(self, f: Any, ctx: str) -> StackFrame:
        f = self.dict_(f, f"{ctx} frame")
        name, filename, line = f.get("name"), f.get("filename"), f.get("line", 0)
        if not isinstance(name, str) or not isinstance(filename, str):
            raise self.fail(f"{ctx} frame without a text 'name' and 'filename'")
        if not _whole(line, -MAX_LINE, MAX_LINE):
            raise self.fail(f"{ctx} frame 'line' is not an integer of at most 64 bits ({quote(line)})")
        frame = StackFrame(filename=filename, line=line, name=name)
        self.frame_memo[id(f)] = frame
        return frame

    def block(self, b: Any, ctx: str, address: int) -> SnapshotBlock:
        key = (id(b), address)
        hit = self.blocks.get(key)
        if hit is not None:
            return hit
        b = self.dict_(b, ctx)
        size = self.int_(b, "size", ctx)
        state = b.get("state")
        if not isinstance(state, str) or state not in BLOCK_STATES:
            raise self.fail(f"{ctx} state {quote(state)} is none of {', '.join(BLOCK_STATES)}")
        if "frames" in b or "history" not in b:
            requested = self.int_(b, "requested_size", ctx, default=size)
            frames = self.frames(b.get("frames"), ctx)
        else:  # legacy (torch 2.0): the allocation's size and stack live in history[0]
            self.legacy = True
            history = self.list_(b["history"], f"{ctx} history")
            first = self.dict_(history[0], f"{ctx} history[0]") if history else {}
            requested = self.int_(first, "real_size", ctx, default=size) if first else size
            frames = self.frames(first.get("frames"), ctx) if first else ()
        blk = SnapshotBlock(address=self.int_(b, "address", ctx, default=address, maximum=MAX_ADDRESS), size=size,
                            requested_size=requested, state=state, frames=frames)
        self.blocks[key] = blk
        return blk

    def segment(self, s: Any, i: int) -> SnapshotSegment:
        hit = self.segments.get(id(s))
        if hit is not None:
            return hit
        ctx = f"segment {i}"
        s = self.dict_(s, ctx)
        address = self.int_(s, "address", ctx, maximum=MAX_ADDRESS)
        blocks = []
        offset = address
        for j, b in enumerate(self.list_(s.get("blocks", []), f"{ctx} blocks")):
            blk = self.block(b, f"{ctx} block {j}", offset)
            blocks.append(blk)
            offset += blk.size
        total = self.int_(s, "total_size", ctx)
        if blocks and sum(b.size for b in blocks) != total:
            raise self.fail(f"{ctx}: its blocks add up to {sum(b.size for b in blocks):,} B, not its "
                            f"total_size {total:,} B")
        seg_type = s.get("segment_type", "large")
        if seg_type not in ("large", "small"):
            raise self.fail(f"{ctx} segment_type {quote(seg_type)} is neither 'large' nor 'small'")
        pool = s.get("segment_pool_id", (0, 0))
        if not (isinstance(pool, (list, tuple)) and len(pool) == 2 and all(_whole(x, -MAX_ADDRESS, MAX_ADDRESS) for x in pool)):
            raise self.fail(f"{ctx} segment_pool_id is not a pair of integers")
        allocated = sum(b.size for b in blocks if b.state == "active_allocated")
        seg = SnapshotSegment(
            device=self.int_(s, "device", ctx, default=0, maximum=MAX_RANK), address=address, total_size=total,
            allocated_size=self.int_(s, "allocated_size", ctx, default=allocated),
            active_size=self.int_(s, "active_size", ctx, default=allocated),
            stream=self.int_(s, "stream", ctx, default=0, minimum=None, maximum=MAX_ADDRESS), segment_type=seg_type,
            pool_id=(int(pool[0]), int(pool[1])), is_expandable=s.get("is_expandable", False) is True,
            blocks=tuple(blocks))
        self.segments[id(s)] = seg
        return seg

    def event(self, e: Any, dev: int, i: int) -> TraceEvent:
        hit = self.events.get(id(e))
        if hit is not None:
            return hit
        if type(e) is dict:  # the fast path: an honest entry, checked without building messages
            action, addr, size, stream, time_us = (e.get("action"), e.get("addr"), e.get("size"), e.get("stream", 0),
                                                   e.get("time_us"))
            if (action in TRACE_ACTIONS and action != "oom" and _whole(addr, 0, MAX_ADDRESS)
                    and _whole(size, 0, MAX_SIZE_BYTES) and _whole(stream, -MAX_ADDRESS, MAX_ADDRESS)
                    and (time_us is None or _whole(time_us, -MAX_TIME_US, MAX_TIME_US))):
                ev = TraceEvent(action, addr, size, stream, time_us, self.frames(e.get("frames"), f"device {dev} trace entry {i}"))
                self.events[id(e)] = ev
                return ev
        ev = self._event_checked(e, f"device {dev} trace entry {i}")
        self.events[id(e)] = ev
        return ev

    def _event_checked(self, e: Any, ctx: str) -> TraceEvent:
        e = self.dict_(e, ctx)
        action = e.get("action")
        if not isinstance(action, str) or action not in TRACE_ACTIONS:
            raise self.fail(f"{ctx} action {quote(action)} is none of {', '.join(TRACE_ACTIONS)}")
        time_us = e.get("time_us")
        if time_us is not None and not _whole(time_us, -MAX_TIME_US, MAX_TIME_US):
            raise self.fail(f"{ctx} time_us is not an integer of at most 62 bits ({quote(time_us)})")
        stream = self.int_(e, "stream", ctx, default=0, minimum=None, maximum=MAX_ADDRESS)
        if action == "oom":  # the C++ TraceEntry keeps device_free in addr_ (Module.cpp writes it as device_free)
            free = self.int_(e, "device_free", ctx, default=0)
            return TraceEvent("oom", free, self.int_(e, "size", ctx), stream, time_us, self.frames(e.get("frames"), ctx), free)
        return TraceEvent(action, self.int_(e, "addr", ctx, maximum=MAX_ADDRESS), self.int_(e, "size", ctx), stream,
                          time_us, self.frames(e.get("frames"), ctx))

    def settings(self, v: Any) -> AllocatorSettings | None:
        if v is None:
            return None
        v = self.dict_(v, "allocator_settings")
        conf = v.get("PYTORCH_CUDA_ALLOC_CONF", v.get("PYTORCH_ALLOC_CONF"))
        split = v.get("max_split_size")
        gc = v.get("garbage_collection_threshold")
        exp = v.get("expandable_segments")
        roundup = v.get("roundup_power2_divisions") or {}
        pairs = []
        if isinstance(roundup, dict):
            check_count(len(roundup), 64, what="roundup_power2_divisions entries", where=self.where)
            for k, div in roundup.items():
                k = int(k) if isinstance(k, str) and k.isascii() and k.isdigit() and len(k) <= 20 else k
                if not (_whole(k, 0, MAX_SIZE_BYTES) and _whole(div, 0, MAX_SIZE_BYTES)):
                    raise self.fail("allocator_settings roundup_power2_divisions is not a map of integers")
                pairs.append((k, div))
        known = {"PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "max_split_size", "garbage_collection_threshold",
                 "expandable_segments", "roundup_power2_divisions"}
        check_count(len(v), 256, what="allocator settings", where=self.where)
        other = tuple(sorted((k if isinstance(k, str) else quote(k), val if isinstance(val, str) else quote(val))
                             for k, val in v.items() if k not in known))
        return AllocatorSettings(
            conf=conf if isinstance(conf, str) else None,
            expandable_segments=exp if isinstance(exp, bool) else None,
            max_split_size_bytes=split if _whole(split, -1, MAX_ADDRESS) else None,
            garbage_collection_threshold=float(gc) if (isinstance(gc, float) and math.isfinite(gc)) or _whole(gc, 0, 1)
            else None,
            roundup_power2_divisions=tuple(sorted(pairs)), other=other)


def parse_snapshot(obj: Any, *, path: str = "<snapshot>", rank: int | None = None) -> MemorySnapshot:
    """Check ``obj`` (what ``_snapshot()`` returns) against the documented format and type it."""
    r = _Reader(path)
    if isinstance(obj, list):  # torch 1.13's _snapshot() returned the segment list alone
        obj = {"segments": obj, "device_traces": []}
    if not isinstance(obj, dict) or "segments" not in obj:
        raise r.fail(f"expected a dict with 'segments' and 'device_traces', got {type(obj).__name__}")
    raw_segments = r.list_(obj["segments"], "segments")
    raw_traces = r.list_(obj.get("device_traces", []), "device_traces")
    # the counts, per reference, before anything is converted
    check_count(len(raw_segments), MAX_SNAPSHOT_SEGMENTS, what="segments", where=path, hint=SMALLER)
    blocks = sum(len(s["blocks"]) for s in raw_segments
                 if isinstance(s, dict) and isinstance(s.get("blocks"), (list, tuple)))
    check_count(blocks, MAX_SNAPSHOT_BLOCKS, what="blocks in its segments", where=path)
    check_count(len(raw_traces), MAX_RANK, what="device traces", where=path)
    events = sum(len(t) for t in raw_traces if isinstance(t, (list, tuple)))
    check_count(events, MAX_SNAPSHOT_EVENTS, what="trace entries", where=path, hint=SMALLER)
    segments = tuple(r.segment(s, i) for i, s in enumerate(raw_segments))
    traces = []
    for dev, trace in enumerate(raw_traces):
        trace = r.list_(trace, f"device {dev} trace")
        converted = tuple(r.event(e, dev, i) for i, e in enumerate(trace))
        if converted:
            traces.append(DeviceTrace(device=dev, events=converted))
    return MemorySnapshot(path=path, rank=rank, segments=segments, traces=tuple(traces),
                          allocator=r.settings(obj.get("allocator_settings")),
                          format="legacy" if r.legacy else "torch>=2.1")
