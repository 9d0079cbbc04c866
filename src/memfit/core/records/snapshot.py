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
Shared sub-objects (torch shares frame dicts between entries) are converted once, so a hostile
file that references one list a million times costs no more than an honest one.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

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
from memfit.errors import MemfitError

ALLOWED_GLOBALS: frozenset[tuple[str, str]] = frozenset()
"""(module, name) pairs a snapshot may reference: none (see the module docstring)."""


class RecordError(MemfitError):
    """A record file memfit cannot read, explained in one line (newlines in what it quotes are folded)."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(str(message).split()))


class SnapshotUnpickler(pickle.Unpickler):
    """``pickle.Unpickler`` that builds plain data only: every global is refused."""

    def find_class(self, module: str, name: str):  # noqa: D102 - see the class docstring
        if (module, name) in ALLOWED_GLOBALS:  # pragma: no cover - the allow-list is empty
            return super().find_class(module, name)
        raise pickle.UnpicklingError(
            f"it references {module}.{name}; a memory snapshot holds only plain data (dicts, lists, "
            "strings, numbers), so memfit refuses to load it (nothing in it was run)")


def load_plain_pickle(data: bytes, what: str) -> Any:
    """Unpickle ``data`` with ``SnapshotUnpickler``; any failure becomes one ``RecordError`` line."""
    if data[:2] == b"PK":
        raise RecordError(f"{what}: a zip archive (torch.save format?), not a torch.cuda.memory._dump_snapshot "
                          "pickle; memfit reads only plain pickles")
    try:
        return SnapshotUnpickler(io.BytesIO(data)).load()
    except pickle.UnpicklingError as exc:
        raise RecordError(f"{what}: not a memory snapshot memfit can read: {exc}") from None
    except RecursionError:
        raise RecordError(f"{what}: not a memory snapshot: nested too deeply") from None
    except MemoryError:
        raise RecordError(f"{what}: not a memory snapshot: it asks for more memory than this machine has") from None
    except Exception as exc:  # EOFError, ValueError, KeyError, ... from a malformed stream
        raise RecordError(f"{what}: not a readable pickle ({type(exc).__name__}: {exc})") from None


def read_snapshot(path: str | Path, *, rank: int | None = None) -> MemorySnapshot:
    """Parse the snapshot pickle at ``path``."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise RecordError(f"cannot read {p}: {exc.strerror or exc}") from None
    return parse_snapshot(load_plain_pickle(data, str(p)), path=str(p), rank=rank)


# ------------------------------------------------------------------------------------- validation

class _Reader:
    """Checks the documented shapes; converts each shared container once (keyed by identity)."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.memo: dict[int, Any] = {}

    def fail(self, msg: str) -> RecordError:
        return RecordError(f"{self.where}: not a torch memory snapshot: {msg}")

    def int_(self, d: dict, key: str, ctx: str, *, default: int | None = None, minimum: int | None = 0) -> int:
        v = d.get(key, default)
        if v is None:
            raise self.fail(f"{ctx} has no {key!r}")
        if isinstance(v, bool) or not isinstance(v, int):
            raise self.fail(f"{ctx} {key!r} is {type(v).__name__}, not an integer")
        if minimum is not None and v < minimum:
            raise self.fail(f"{ctx} {key!r} is negative ({v})")
        return v

    def list_(self, v: Any, ctx: str) -> list:
        if not isinstance(v, (list, tuple)):
            raise self.fail(f"{ctx} is {type(v).__name__}, not a list")
        return list(v)

    def dict_(self, v: Any, ctx: str) -> dict:
        if not isinstance(v, dict):
            raise self.fail(f"{ctx} is {type(v).__name__}, not a dict")
        return v

    def frames(self, v: Any, ctx: str) -> tuple[StackFrame, ...]:
        if v is None:
            return ()
        key = id(v)
        if key in self.memo:
            return self.memo[key]
        out = []
        for f in self.list_(v, f"{ctx} frames"):
            out.append(self.frame(f, ctx))
        result = tuple(out)
        self.memo[key] = result
        return result

    def frame(self, f: Any, ctx: str) -> StackFrame:
        key = id(f)
        if key in self.memo:
            return self.memo[key]
        f = self.dict_(f, f"{ctx} frame")
        name, filename, line = f.get("name"), f.get("filename"), f.get("line", 0)
        if not isinstance(name, str) or not isinstance(filename, str):
            raise self.fail(f"{ctx} frame without a text 'name' and 'filename'")
        if isinstance(line, bool) or not isinstance(line, int):
            raise self.fail(f"{ctx} frame 'line' is not an integer")
        frame = StackFrame(filename=filename, line=line, name=name)
        self.memo[key] = frame
        return frame

    def block(self, b: Any, ctx: str, address: int) -> SnapshotBlock:
        b = self.dict_(b, ctx)
        size = self.int_(b, "size", ctx)
        state = b.get("state")
        if state not in BLOCK_STATES:
            raise self.fail(f"{ctx} state {state!r} is none of {', '.join(BLOCK_STATES)}")
        if "frames" in b or "history" not in b:
            requested = self.int_(b, "requested_size", ctx, default=size)
            frames = self.frames(b.get("frames"), ctx)
        else:  # legacy (torch 2.0): the allocation's size and stack live in history[0]
            history = self.list_(b["history"], f"{ctx} history")
            first = self.dict_(history[0], f"{ctx} history[0]") if history else {}
            requested = self.int_(first, "real_size", ctx, default=size) if first else size
            frames = self.frames(first.get("frames"), ctx) if first else ()
        return SnapshotBlock(address=self.int_(b, "address", ctx, default=address), size=size,
                             requested_size=requested, state=state, frames=frames)

    def segment(self, s: Any, i: int) -> SnapshotSegment:
        ctx = f"segment {i}"
        s = self.dict_(s, ctx)
        address = self.int_(s, "address", ctx)
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
            raise self.fail(f"{ctx} segment_type {seg_type!r} is neither 'large' nor 'small'")
        pool = s.get("segment_pool_id", (0, 0))
        if not (isinstance(pool, (list, tuple)) and len(pool) == 2
                and all(isinstance(x, int) and not isinstance(x, bool) for x in pool)):
            raise self.fail(f"{ctx} segment_pool_id is not a pair of integers")
        allocated = sum(b.size for b in blocks if b.state == "active_allocated")
        return SnapshotSegment(
            device=self.int_(s, "device", ctx, default=0), address=address, total_size=total,
            allocated_size=self.int_(s, "allocated_size", ctx, default=allocated),
            active_size=self.int_(s, "active_size", ctx, default=allocated),
            stream=self.int_(s, "stream", ctx, default=0, minimum=None), segment_type=seg_type,
            pool_id=(int(pool[0]), int(pool[1])), is_expandable=bool(s.get("is_expandable", False)),
            blocks=tuple(blocks))

    def event(self, e: Any, ctx: str) -> TraceEvent:
        e = self.dict_(e, ctx)
        action = e.get("action")
        if action not in TRACE_ACTIONS:
            raise self.fail(f"{ctx} action {action!r} is none of {', '.join(TRACE_ACTIONS)}")
        time_us = e.get("time_us")
        if time_us is not None and (isinstance(time_us, bool) or not isinstance(time_us, int)):
            raise self.fail(f"{ctx} time_us is not an integer")
        if action == "oom":  # the C++ TraceEntry keeps device_free in addr_ (Module.cpp writes it as device_free)
            free = self.int_(e, "device_free", ctx, default=0)
            return TraceEvent("oom", free, self.int_(e, "size", ctx), self.int_(e, "stream", ctx, default=0, minimum=None),
                              time_us, self.frames(e.get("frames"), ctx), free)
        return TraceEvent(action, self.int_(e, "addr", ctx), self.int_(e, "size", ctx),
                          self.int_(e, "stream", ctx, default=0, minimum=None), time_us,
                          self.frames(e.get("frames"), ctx))

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
            for k, div in roundup.items():
                try:
                    pairs.append((int(k), int(div)))
                except (TypeError, ValueError):
                    raise self.fail("allocator_settings roundup_power2_divisions is not a map of integers") from None
        known = {"PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "max_split_size", "garbage_collection_threshold",
                 "expandable_segments", "roundup_power2_divisions"}
        other = tuple(sorted((str(k), str(val)) for k, val in v.items() if k not in known))
        return AllocatorSettings(
            conf=conf if isinstance(conf, str) else None,
            expandable_segments=exp if isinstance(exp, bool) else None,
            max_split_size_bytes=split if isinstance(split, int) and not isinstance(split, bool) else None,
            garbage_collection_threshold=float(gc) if isinstance(gc, (int, float)) and not isinstance(gc, bool) else None,
            roundup_power2_divisions=tuple(sorted(pairs)), other=other)


def parse_snapshot(obj: Any, *, path: str = "<snapshot>", rank: int | None = None) -> MemorySnapshot:
    """Check ``obj`` (what ``_snapshot()`` returns) against the documented format and type it."""
    r = _Reader(path)
    if isinstance(obj, list):  # torch 1.13's _snapshot() returned the segment list alone
        obj = {"segments": obj, "device_traces": []}
    if not isinstance(obj, dict) or "segments" not in obj:
        raise r.fail(f"expected a dict with 'segments' and 'device_traces', got {type(obj).__name__}")
    segments = tuple(r.segment(s, i) for i, s in enumerate(r.list_(obj["segments"], "segments")))
    traces = []
    for dev, trace in enumerate(r.list_(obj.get("device_traces", []), "device_traces")):
        events = tuple(r.event(e, f"device {dev} trace entry {i}") for i, e in enumerate(r.list_(trace, f"device {dev} trace")))
        if events:
            traces.append(DeviceTrace(device=dev, events=events))
    legacy = any("history" in b for s in r.list_(obj["segments"], "segments") if isinstance(s, dict)
                 for b in (s.get("blocks") or []) if isinstance(b, dict))
    return MemorySnapshot(path=path, rank=rank, segments=segments, traces=tuple(traces),
                          allocator=r.settings(obj.get("allocator_settings")),
                          format="legacy" if legacy else "torch>=2.1")
