"""Read allocator counters per phase from JSON: ``memfit.record``'s stats files, or your own dump of
``torch.cuda.memory_stats()`` / ``torch.cuda.host_memory_stats()``.

Accepted shapes (each phase's counters may be flat, ``{"allocated_bytes.all.peak": ...}`` as
``memory_stats()`` returns them, or nested as ``memory_stats_as_nested_dict()`` returns them):

1. ``memfit.record``'s file: ``{"format": "memfit.record.stats", "version": 1, "rank": 0,
   "device": "cuda", "phases": [{"name": "forward", "t_start_us": ..., "t_end_us": ...,
   "memory_stats": {...}, "host_memory_stats": {...}, "mem_get_info": [free, total],
   "rss_peak_bytes": ...}, ...]}``;
2. ``{"phases": [{"name": ..., "memory_stats": {...}, ...}]}`` or ``{"phases": {"load": {...}, ...}}``;
3. ``{"load": <memory_stats>, "forward": <memory_stats>, ...}`` (phase name -> counters);
4. one ``memory_stats()`` dict alone: a single phase called ``recorded``.

Counter names are torch's (torch/cuda/memory.py: ``memory_stats``, ``host_memory_stats``; torch
2.13 names the host counters ``allocated_bytes.peak``, older builds ``allocated_bytes.all.peak``).
Peaks are per phase only if the peak counters were reset at the phase start (``memfit.record`` does);
a plain dump's peaks run from the start of the process or the last reset, and memfit says so.

Read through ``memfit.core.records.bounded.record_json`` (at most 64 MiB, 2,000,000 values, 64
levels); at most ``MAX_PHASES`` phases; every byte count at most 1 EiB, times and counters bounded,
so every figure renders.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from memfit.core.hardware import MAX_SIZE_BYTES
from memfit.core.records.bounded import MAX_PHASES, MAX_RANK, MAX_TIME_US, RecordError, check_count, quote, record_json
from memfit.core.records.types import PhaseStats, StatsRecording

FORMAT = "memfit.record.stats"
VERSION = 1

_DEVICE_KEYS = {
    "device_allocated_peak_bytes": "allocated_bytes.all.peak",
    "device_allocated_end_bytes": "allocated_bytes.all.current",
    "device_requested_peak_bytes": "requested_bytes.all.peak",
    "device_reserved_peak_bytes": "reserved_bytes.all.peak",
    "device_reserved_end_bytes": "reserved_bytes.all.current",
    "device_num_ooms": "num_ooms",
    "device_num_alloc_retries": "num_alloc_retries",
}
_HOST_KEYS = {
    "pinned_held_peak_bytes": ("allocated_bytes.peak", "allocated_bytes.all.peak"),
    "pinned_held_end_bytes": ("allocated_bytes.current", "allocated_bytes.all.current"),
    "pinned_in_use_peak_bytes": ("active_bytes.peak", "active_bytes.all.peak"),
}
_PLAIN_INT_KEYS = ("rss_start_bytes", "rss_end_bytes", "rss_peak_bytes", "t_start_us", "t_end_us", "step", "micro_step")
_LIMITS = {"t_start_us": MAX_TIME_US, "t_end_us": MAX_TIME_US}
"""The largest value of a field that is not a byte count (those stop at 1 EiB, ``MAX_SIZE_BYTES``)."""


def flatten(stats: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}`` (what torch.cuda.memory_stats does to the nested form)."""
    out: dict[str, Any] = {}
    stack = [(prefix, stats, 0)]
    while stack:
        pre, d, depth = stack.pop()
        if depth > 8:
            raise RecordError("counters nested more than 8 levels deep")
        for k, v in d.items():
            key = f"{pre}.{k}" if pre else str(k)
            if isinstance(v, Mapping):
                stack.append((key, v, depth + 1))
            else:
                out[key] = v
    return out


def _looks_like_stats(d: Any) -> bool:
    if not isinstance(d, Mapping):
        return False
    keys = flatten(d) if any(isinstance(v, Mapping) for v in d.values()) else d
    return any(str(k).startswith(("allocated_bytes", "reserved_bytes", "active_bytes")) for k in keys)


class _Ctx:
    def __init__(self, where: str) -> None:
        self.where = where

    def fail(self, msg: str) -> RecordError:
        return RecordError(f"{self.where}: {msg}")

    def count(self, value: Any, what: str, maximum: int = MAX_SIZE_BYTES) -> int | None:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
            raise self.fail(f"{what} is {quote(value)}, not a byte count")
        if isinstance(value, float):
            if not value.is_integer():
                raise self.fail(f"{what} is {value!r}, not a whole number of bytes")
            if abs(value) > 2**63:
                raise self.fail(f"{what} is {value!r}, beyond {maximum:,}, the most memfit reads")
            value = int(value)
        if value < 0:
            raise self.fail(f"{what} is negative ({quote(value)})")
        if value > maximum:
            raise self.fail(f"{what} is {quote(value)}, beyond {maximum:,}"
                            + (" (1 EiB, the most memfit reads)" if maximum == MAX_SIZE_BYTES else ", the most memfit reads"))
        return value


def _phase(ctx: _Ctx, name: str, entry: Mapping[str, Any], *, nested_stats: bool) -> PhaseStats:
    if not isinstance(name, str) or not name or len(name) > 100:
        raise ctx.fail(f"phase name {quote(name)} is not a short text")
    if nested_stats:
        device = flatten(entry)
        host: dict[str, Any] = {}
        extra: Mapping[str, Any] = {}
    else:
        ms, hs = entry.get("memory_stats"), entry.get("host_memory_stats")
        for label, v in (("memory_stats", ms), ("host_memory_stats", hs)):
            if v is not None and not isinstance(v, Mapping):
                raise ctx.fail(f"phase {name!r}: {label} is {type(v).__name__}, not an object")
        device = flatten(ms) if ms else {}
        host = flatten(hs) if hs else {}
        extra = entry
    values: dict[str, Any] = {}
    for field, key in _DEVICE_KEYS.items():
        values[field] = ctx.count(device.get(key), f"phase {name!r} memory_stats[{key!r}]")
    for field, keys in _HOST_KEYS.items():
        found = next((host[k] for k in keys if k in host), None)
        values[field] = ctx.count(found, f"phase {name!r} host_memory_stats[{keys[0]!r}]")
    for key in _PLAIN_INT_KEYS:
        values[key] = ctx.count(extra.get(key), f"phase {name!r} {key}", _LIMITS.get(key, MAX_SIZE_BYTES))
    info = extra.get("mem_get_info")
    if info is not None:
        if not (isinstance(info, (list, tuple)) and len(info) == 2):
            raise ctx.fail(f"phase {name!r}: mem_get_info is not [free, total]")
        free, total = (ctx.count(x, f"phase {name!r} mem_get_info") for x in info)
        if free is not None and total is not None:
            if free > total:
                raise ctx.fail(f"phase {name!r}: mem_get_info free {free} exceeds total {total}")
            values["driver_used_end_bytes"] = total - free
            values["device_total_bytes"] = total
    label = extra.get("label", "")
    if not isinstance(label, str):
        raise ctx.fail(f"phase {name!r}: label is not text")
    if values["t_start_us"] is not None and values["t_end_us"] is not None and values["t_end_us"] < values["t_start_us"]:
        raise ctx.fail(f"phase {name!r} ends before it starts")
    return PhaseStats(name=name, label=label, **values)


def parse_stats(obj: Any, *, path: str = "<stats>") -> StatsRecording:
    """Type the counters of one JSON document (see the module docstring for the shapes)."""
    ctx = _Ctx(path)
    if not isinstance(obj, Mapping):
        raise ctx.fail(f"expected a JSON object of counters per phase, got {type(obj).__name__}")
    notes: list[str] = []
    phases: list[PhaseStats] = []
    fmt = obj.get("format")
    if fmt is not None and fmt != FORMAT:
        raise ctx.fail(f"format {fmt!r} is not {FORMAT!r}")
    if fmt == FORMAT and obj.get("version") != VERSION:
        raise ctx.fail(f"{FORMAT} version {obj.get('version')!r}; this memfit reads version {VERSION}")
    if "phases" in obj:
        raw = obj["phases"]
        if isinstance(raw, Mapping):
            raw = [dict(v, name=k) if isinstance(v, Mapping) and not _looks_like_stats(v) else (k, v) for k, v in raw.items()]
        if not isinstance(raw, list):
            raise ctx.fail("'phases' is neither a list nor an object")
        check_count(len(raw), MAX_PHASES, what="phases", where=path)
        for i, entry in enumerate(raw):
            if isinstance(entry, tuple):
                if not isinstance(entry[1], Mapping):
                    raise ctx.fail(f"phase {quote(entry[0])} is {type(entry[1]).__name__}, not an object of counters")
                phases.append(_phase(ctx, entry[0], entry[1], nested_stats=True))
                continue
            if not isinstance(entry, Mapping):
                raise ctx.fail(f"phase {i} is {type(entry).__name__}, not an object")
            phases.append(_phase(ctx, entry.get("name"), entry, nested_stats=False))
        if fmt != FORMAT:
            notes.append(f"{Path(path).name}: counters read as given; peaks are per phase only if the script reset "
                         "them at each phase start (torch.cuda.reset_peak_memory_stats)")
    elif _looks_like_stats(obj):
        phases.append(_phase(ctx, "recorded", obj, nested_stats=True))
        notes.append(f"{Path(path).name}: one memory_stats() dump without phases: shown as phase 'recorded' "
                     "(its peaks run from the process start or the last reset)")
    else:
        check_count(len(obj), MAX_PHASES, what="phases", where=path)
        for name, v in obj.items():
            if not _looks_like_stats(v):
                raise ctx.fail(f"{quote(name)} is not memory_stats() counters (no allocated_bytes/reserved_bytes keys); "
                               "see `memfit compare --help` for the JSON shapes memfit reads")
            phases.append(_phase(ctx, name, v, nested_stats=True))
        notes.append(f"{Path(path).name}: counters read as given; peaks are per phase only if the script reset "
                     "them at each phase start")
    if not phases:
        raise ctx.fail("no phases in it")
    if fmt != FORMAT:
        figures = [f for f in PhaseStats.__dataclass_fields__ if f.endswith("_bytes")]
        for ph in phases:
            if all(getattr(ph, f) is None for f in figures):
                raise ctx.fail(f"phase {ph.name!r} has no memory counters (memory_stats, host_memory_stats, mem_get_info "
                               "or rss_*_bytes)")
    rank = ctx.count(obj.get("rank"), "rank", MAX_RANK) if fmt == FORMAT else None
    device = obj.get("device") if fmt == FORMAT else None
    if device is None:
        device = "cuda" if any(p.device_allocated_peak_bytes is not None for p in phases) else "unknown"
    if device not in ("cuda", "cpu", "unknown"):
        raise ctx.fail(f"device {quote(device)} is not cuda or cpu")
    file_notes = obj.get("notes") or []
    if not isinstance(file_notes, list) or not all(isinstance(n, str) for n in file_notes):
        raise ctx.fail("'notes' is not a list of text")
    offset = obj.get("utc_offset_s")
    if offset is not None and (isinstance(offset, bool) or not isinstance(offset, int) or abs(offset) > 86400):
        raise ctx.fail(f"utc_offset_s {quote(offset)} is not a whole number of seconds within a day")
    overhead = obj.get("overhead_s")
    if overhead is not None and (isinstance(overhead, bool) or not isinstance(overhead, (int, float))
                                 or not 0 <= overhead < 10**9):
        raise ctx.fail(f"overhead_s {quote(overhead)} is not a non-negative number")
    text = {k: obj.get(k) for k in ("device_name", "torch_version", "snapshot_file")}
    for k, v in text.items():
        if v is not None and not isinstance(v, str):
            raise ctx.fail(f"{k} is not text")
    return StatsRecording(path=path, rank=rank, device=device, phases=tuple(phases), utc_offset_s=offset,
                          notes=tuple(file_notes) + tuple(notes), overhead_s=overhead, **text)


def read_stats(path: str | Path) -> StatsRecording:
    """The stats JSON at ``path``, read through the bounded reader (``bounded.record_json``)."""
    p = Path(path)
    return parse_stats(record_json(p), path=str(p))
