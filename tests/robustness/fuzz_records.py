"""Seeded generator of record files (the four kinds ``memfit compare`` reads) and the properties every
one must keep.

``record_case(seed)`` writes one file: a ``memory_stats`` JSON (memfit.record's format, the nested
and flat ``memory_stats()`` dumps), a ``_dump_snapshot`` pickle, an nvidia-smi CSV or a log with
DeepSpeed ``see_memory_usage`` lines. Each starts as an honest file of its kind with random figures;
most are then damaged: values replaced by junk (wrong types, negative, huge, 400- to 5,000-digit
numbers, NaN, deep nesting), keys dropped or misspelled, references shared, bytes truncated, flipped
or spliced (pickle opcodes that call code, among them). ``check_record(path, plan)`` reads it and,
when it is read, reconciles it with the plan and renders the result, and returns what went wrong:

- anything raised other than ``MemfitError`` (a crash), or a message over one line;
- a figure in the typed record or the reconciliation (a field named ``*bytes``, a size, an address)
  that is negative or not an integer, or any number that is NaN or infinite;
- a hostile pickle that ran (it would create a marker file).

tests/robustness/test_fuzz_records.py runs 2,000 seeds in every test run and 10,000 behind ``slow``.
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import pickle
import random
from pathlib import Path
from typing import Any

from memfit.errors import MemfitError

KINDS = ("stats", "snapshot", "smi", "ds_log")
JUNK: tuple[Any, ...] = ("", "x", "12", None, True, False, -1, -(2**70), 0, 1.5, float("nan"), float("inf"), 2**61,
                         10**30, [], {}, [1, 2], {"a": 1}, "y" * 300)
HUGE_DIGITS = (20, 21, 400, 4000, 5000)


def _placeholder(digits: int) -> str:
    return f"@@{digits}@@"


def _digits_in(text: str) -> str:
    """JSON text with each ``"@@N@@"`` placeholder replaced by an N-digit number (``json.dumps`` will
    not write an int of over 4,300 digits itself)."""
    for n in HUGE_DIGITS:
        text = text.replace(f'"{_placeholder(n)}"', "9" * n)
    return text


class _Rng(random.Random):
    as_json = False

    def junk(self) -> Any:
        if self.random() < 0.2:
            if self.random() < 0.5:
                n = self.choice(HUGE_DIGITS)
                return _placeholder(n) if self.as_json else 10**n - 1
            return self.choice(JUNK)
        v = self.choice(JUNK)
        if isinstance(v, (list, dict)):  # a fresh container: the mutations below must not alias JUNK
            return json.loads(json.dumps(v))
        return v

    def deep(self) -> Any:
        depth = self.choice([10, 70, 1000, 100_000])
        v: Any = 1
        for _ in range(depth):
            v = [v]
        return v


def _mutate_tree(rng: _Rng, tree: Any, n: int) -> Any:
    """``n`` random edits anywhere in a JSON-like tree (values replaced, keys dropped or renamed,
    containers shared)."""
    for _ in range(n):
        path = []
        node = tree
        while isinstance(node, (dict, list)) and node and rng.random() < 0.8:
            key = rng.choice(list(node)) if isinstance(node, dict) else rng.randrange(len(node))
            path.append((node, key))
            node = node[key]
        if not path:
            continue
        parent, key = path[-1]
        r = rng.random()
        if r < 0.55:
            parent[key] = rng.junk()
        elif r < 0.65:
            parent[key] = rng.deep()
        elif r < 0.8 and isinstance(parent, dict):
            value = parent.pop(key)
            if rng.random() < 0.5:
                parent[key[:-1] + "x" if key else "x"] = value  # a misspelled key
        elif r < 0.9 and isinstance(parent, list):
            parent.extend([parent[key]] * rng.choice([2, 50]))  # one object shared many times
        else:
            try:
                parent[key] = str(parent[key])[:100]
            except (RecursionError, ValueError):  # a deep list has no repr, a 5,000-digit int no str
                parent[key] = "unprintable"
    return tree


# ------------------------------------------------------------------------------- the four kinds

def _counters(rng: _Rng) -> dict[str, int]:
    peak = rng.choice([0, 512, 2**20, 3 * 2**30, 80 * 2**30])
    return {"allocated_bytes.all.peak": peak, "allocated_bytes.all.current": peak // 2,
            "requested_bytes.all.peak": peak - min(peak, 100), "reserved_bytes.all.peak": peak + 2**21,
            "reserved_bytes.all.current": peak, "num_ooms": rng.choice([0, 1]), "num_alloc_retries": 0}


def _stats(rng: _Rng) -> bytes:
    rng.as_json = True
    shape = rng.choice(["record", "record", "phases-object", "flat", "one-dump", "nested"])
    names = ["load", "initialize", "forward", "backward", "optimizer_step", "step2.forward", "save"]
    phases = names[: rng.randint(1, len(names))]
    if shape == "record":
        doc: Any = {"format": "memfit.record.stats", "version": 1, "rank": rng.choice([0, 1, 7]), "device": "cuda",
                    "utc_offset_s": 3600, "overhead_s": 0.01, "notes": [],
                    "phases": [{"name": n, "t_start_us": 1_700_000_000_000_000 + 10 * i,
                                "t_end_us": 1_700_000_000_000_000 + 10 * i + 5, "memory_stats": _counters(rng),
                                "host_memory_stats": {"allocated_bytes.peak": rng.choice([0, 2**21])},
                                "mem_get_info": [2**30, 80 * 2**30], "rss_peak_bytes": 2**30} for i, n in enumerate(phases)]}
    elif shape == "phases-object":
        doc = {"phases": {n: {"memory_stats": _counters(rng)} for n in phases}}
    elif shape == "flat":
        doc = {n: _counters(rng) for n in phases}
    elif shape == "nested":
        doc = {n: {"allocated_bytes": {"all": {"peak": c["allocated_bytes.all.peak"]}}} for n, c in
               ((n, _counters(rng)) for n in phases)}
    else:
        doc = _counters(rng)
    if rng.random() < 0.7:
        doc = _mutate_tree(rng, doc, rng.randint(1, 4))
    try:
        text = _digits_in(json.dumps(doc))
    except (ValueError, RecursionError):  # a 100,000-deep list: write it as text
        text = '{"forward": ' + "[" * 100_000 + "]" * 100_000 + "}"
    return text.encode()


def _snapshot_doc(rng: _Rng) -> dict[str, Any]:
    frames = [{"filename": rng.choice(["/x/site-packages/deepspeed/runtime/engine.py", "/x/site-packages/torch/nn/modules/linear.py",
                                       "train.py", "??"]), "line": rng.randint(0, 900), "name": rng.choice(["forward", "step", "f"])}
              for _ in range(rng.randint(0, 6))]
    segments, events = [], []
    address = 1 << 40
    for _ in range(rng.randint(0, 6)):
        sizes = [rng.choice([512, 2**20, 2**21]) for _ in range(rng.randint(1, 4))]
        blocks = [{"address": address + sum(sizes[:j]), "size": s, "requested_size": s - rng.randint(0, 8),
                   "state": rng.choice(["active_allocated", "inactive", "active_pending_free"]),
                   "frames": rng.sample(frames, len(frames))} for j, s in enumerate(sizes)]
        segments.append({"device": 0, "address": address, "total_size": sum(sizes), "allocated_size": sizes[0],
                         "active_size": sizes[0], "requested_size": 0, "stream": 0,
                         "segment_type": rng.choice(["large", "small"]), "segment_pool_id": (0, 0),
                         "is_expandable": False, "frames": [], "blocks": blocks})
        events.append({"action": "segment_alloc", "addr": address, "size": sum(sizes), "stream": 0, "time_us": len(events),
                       "frames": frames})
        for b in blocks:
            events.append({"action": "alloc", "addr": b["address"], "size": b["size"], "stream": 0,
                           "time_us": len(events), "frames": frames})
            if b["state"] == "inactive":
                events.append({"action": "free_completed", "addr": b["address"], "size": b["size"], "stream": 0,
                               "time_us": len(events), "frames": frames})
        address += 2**32
    if rng.random() < 0.1:
        events.append({"action": "oom", "device_free": 123, "size": 2**30, "stream": 0, "time_us": len(events)})
    doc: dict[str, Any] = {"segments": segments, "device_traces": [events] + [[]] * rng.randint(0, 2)}
    if rng.random() < 0.5:
        doc["allocator_settings"] = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False", "max_split_size": -1,
                                     "garbage_collection_threshold": 0.0, "expandable_segments": False,
                                     "roundup_power2_divisions": {"1": 0}}
    return doc


def _snapshot(rng: _Rng, marker: Path) -> bytes:
    doc = _snapshot_doc(rng)
    if rng.random() < 0.6:
        doc = _mutate_tree(rng, doc, rng.randint(1, 4))
    traces = doc.get("device_traces") if isinstance(doc, dict) else None
    if rng.random() < 0.1 and isinstance(traces, list) and traces and isinstance(traces[0], list):
        doc["device_traces"] = [traces[0] * 1000] * rng.choice([10, 1000])  # shared past the caps
    protocol = rng.randint(0, pickle.HIGHEST_PROTOCOL)
    try:
        try:
            data = pickle.dumps(doc, protocol=protocol)
        except ValueError:  # protocols 0-1 write ints as text: not over 4,300 digits
            data = pickle.dumps(doc, protocol=pickle.HIGHEST_PROTOCOL)
    except RecursionError:
        data = pickle.dumps({"segments": [], "device_traces": []})
    r = rng.random()
    if r < 0.05:  # code: an os.system call that would create the marker
        data = f"cos\nsystem\n(S'touch {marker}'\ntR.".encode()
    elif r < 0.1:
        data = b"\x80\x04\x95" + data[3:] if len(data) > 3 else data  # a frame opcode over real data
    elif r < 0.2:
        data = data[: rng.randrange(len(data) + 1)]
    elif r < 0.3:
        b = bytearray(data)
        for _ in range(rng.randint(1, 5)):
            b[rng.randrange(len(b))] = rng.randrange(256)
        data = bytes(b)
    elif r < 0.33:
        data = b"\x80\x04(" + b"]" * rng.choice([10, 10_000]) + b"l."
    return data


def _stamp(rng: _Rng, i: int) -> str:
    return f"2024/05/01 12:{(i // 600) % 60:02d}:{(i // 10) % 60:02d}.{(i % 10) * 100:03d}"


def _smi(rng: _Rng) -> bytes:
    header = rng.choice(["timestamp, memory.used [MiB]", "timestamp, index, memory.used [MiB]", "index, memory.used [MiB]",
                         "timestamp, memory.used", None])
    gpus = rng.randint(1, 3)
    lines = [] if header is None else [header]
    for i in range(rng.randint(1, 40)):
        for g in range(gpus):
            used = f"{rng.randint(0, 81920)} MiB" if "[MiB]" in (header or "") or rng.random() < 0.5 else str(rng.randint(0, 81920))
            if header is None or header.startswith("timestamp, memory"):
                lines.append(f"{_stamp(rng, i)}, {used}")
            elif header.startswith("timestamp, index"):
                lines.append(f"{_stamp(rng, i)}, {g}, {used}")
            else:
                lines.append(f"{g}, {used}")
    for _ in range(rng.randint(0, 4) if rng.random() < 0.7 else 0):
        k = rng.randrange(len(lines))
        cells = lines[k].split(", ")
        j = rng.randrange(len(cells))
        cells[j] = rng.choice(["[N/A]", "[Not Supported]", "", "-5 MiB", "9" * rng.choice(HUGE_DIGITS), "1.5 MiB", "5 TiB",
                               "2024/13/45 99:99:99.999", "2024/05/01 12:00:00." + "1" * 400, "٣ MiB", "x" * 200,
                               '"quoted, cell"', "9" * 30 + " GiB"])
        lines[k] = ", ".join(cells)
    text = "\n".join(lines) + "\n"
    if rng.random() < 0.05:
        text = "x" * 200_000  # one field over csv's limit
    return text.encode()


def _ds_log(rng: _Rng) -> bytes:
    messages = ["Engine before forward", "Engine after forward", "Engine after backward", "Engine after step",
                "DeepSpeed Engine: After args sanity test", "After initializing ZeRO optimizer", "my own note"]
    lines = []
    for _ in range(rng.randint(1, 12)):
        prefix = rng.choice(["", "[rank0]: ", "[rank1]: ", "[INFO] [utils.py:781:see_memory_usage] "])
        unit = rng.choice(["GB", "GB", "MB"])
        figures = [f"{rng.randint(0, 80)}.{rng.randint(0, 99):02d}" for _ in range(3)] + [str(rng.randint(0, 80))]
        if rng.random() < 0.15:
            k = rng.randrange(4)
            figures[k] = rng.choice(["9" * rng.choice(HUGE_DIGITS), "1." + "9" * rng.choice(HUGE_DIGITS), "0" * 500 + "1",
                                     "1e9", "-1"])
        sep = rng.choice(["         ", " | "])
        lines.append(prefix + rng.choice(messages))
        lines.append(prefix + sep.join(f"{k} {v} {unit}" for k, v in zip(("MA", "Max_MA", "CA", "Max_CA"), figures)))
        if rng.random() < 0.5:
            cpu = "9" * 400 if rng.random() < 0.05 else f"{rng.randint(1, 500)}.{rng.randint(0, 99)}"
            lines.append(prefix + f"CPU Virtual Memory:  used = {cpu} GB, percent = 12.1%")
    if rng.random() < 0.1:
        lines.insert(rng.randrange(len(lines) + 1), "\x1b[31m" + "x" * rng.choice([10, 100_000]))
    return ("\n".join(lines) + "\n").encode()


SUFFIX = {"stats": ".json", "snapshot": ".pickle", "smi": ".csv", "ds_log": ".log"}


def record_case(seed: int, workdir: Path) -> tuple[str, Path, Path]:
    """(kind, the file written, the marker a hostile pickle would create) for ``seed``."""
    rng = _Rng(seed)
    kind = KINDS[seed % len(KINDS)]
    marker = workdir / f"ran-{seed}"
    data = {"stats": lambda: _stats(rng), "snapshot": lambda: _snapshot(rng, marker), "smi": lambda: _smi(rng),
            "ds_log": lambda: _ds_log(rng)}[kind]()
    if kind != "snapshot" and rng.random() < 0.05:
        data = data[: rng.randrange(len(data) + 1)] + rng.choice([b"\xff\xfe", b"\x00", b""])
    path = workdir / f"rec-{seed}{SUFFIX[kind] if rng.random() < 0.9 else ''}"
    path.write_bytes(data)
    return kind, path, marker


# --------------------------------------------------------------------------------- the checks

_SIGNED = {"stream", "line", "time_us", "utc_offset_s", "pool_id", "x", "diff_bytes", "plan_minus_recorded_bytes",
           "max_split_size_bytes"}
"""Integer fields that may be negative (a CUDA stream handle, a C++ frame's line, a difference, and
the allocator's ``max_split_size``, whose -1 is torch's SIZE_MAX: no limit, ``AllocatorSettings``)."""


def figure_problems(value: Any, where: str = "") -> list[str]:
    """Negative or non-integer byte figures and non-finite numbers anywhere in a typed result."""
    out: list[str] = []
    stack: list[tuple[Any, str]] = [(value, where)]
    seen: set[int] = set()
    while stack:
        v, at = stack.pop()
        if isinstance(v, float):
            if not math.isfinite(v):
                out.append(f"{at} is {v!r}")
            elif _is_figure(at):
                out.append(f"{at} is a float ({v!r}), not a whole number of bytes")
        elif isinstance(v, bool) or v is None or isinstance(v, str):
            continue
        elif isinstance(v, int):
            if v < 0 and _is_figure(at) and not _signed(at):
                out.append(f"{at} is negative ({v})")
        elif id(v) in seen:
            continue
        elif dataclasses.is_dataclass(v) and not isinstance(v, type):
            seen.add(id(v))
            stack.extend((getattr(v, f.name), f"{at}.{f.name}") for f in dataclasses.fields(v))
        elif isinstance(v, dict):
            seen.add(id(v))
            stack.extend((x, f"{at}.{k}") for k, x in v.items())
        elif isinstance(v, (list, tuple)):
            seen.add(id(v))
            stack.extend((x, f"{at}[{i}]") for i, x in enumerate(v[:2000]))
    return out


def _field(at: str) -> str:
    return at.rsplit(".", 1)[-1].split("[", 1)[0]


def _is_figure(at: str) -> bool:
    name = _field(at)
    return name.endswith("bytes") or name in ("size", "address", "addr", "total_size", "allocated_size", "active_size",
                                               "requested_size", "device_free")


def _signed(at: str) -> bool:
    return _field(at) in _SIGNED or "diff" in _field(at) or "minus" in _field(at)


def check_record(path: Path, marker: Path, plan: Any, *, render: bool = False) -> tuple[str, list[str]]:
    """``("read" | "refused" | "crashed", problems)``: read the file, and when it is read reconcile it
    with ``plan`` (JSON always, the terminal tables when ``render``)."""
    from memfit.core.compare import reconcile
    from memfit.core.records import read_records
    from memfit.render.compare_out import reconciliation_to_dict, render_reconciliation

    try:
        records = read_records([str(path)])
    except MemfitError as e:
        problems = [] if "\n" not in str(e) else [f"a multi-line error: {str(e)[:200]!r}"]
        return "refused", problems + _ran(marker)
    except Exception as e:  # noqa: BLE001 - the property under test
        return "crashed", [f"reading: {type(e).__name__}: {str(e)[:300]}"] + _ran(marker)
    problems = figure_problems(records, "records") + _ran(marker)
    try:
        rc = reconcile(plan, records, capacity_bytes=80 * 2**30)
        doc = reconciliation_to_dict(rc)
        json.dumps(doc, allow_nan=False)
        if render:
            from rich.console import Console

            render_reconciliation(rc, Console(file=io.StringIO(), width=120))
    except MemfitError as e:
        return "refused", problems + ([] if "\n" not in str(e) else [f"a multi-line error: {str(e)[:200]!r}"])
    except Exception as e:  # noqa: BLE001 - the property under test
        return "crashed", problems + [f"reconciling: {type(e).__name__}: {str(e)[:300]}"]
    return "read", problems + figure_problems(rc, "reconciliation")


def _ran(marker: Path) -> list[str]:
    return [f"a hostile pickle ran ({marker.name} exists)"] if marker.exists() else []
