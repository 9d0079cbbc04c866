"""Records of real runs, read into typed objects (no torch): ``read_records(paths) -> RecordSet``.

A path is a file (the kind is told by its extension, else by its first bytes) or a record directory
written by ``memfit.record`` / ``MemfitCallback`` / the GPU validation kit:

- ``stats.rank<R>.json``: counters per phase (``memfit.core.records.stats_json``);
- ``snapshot.rank<R>.pickle``: ``torch.cuda.memory._dump_snapshot`` (``...records.snapshot``);
- ``*.csv``: nvidia-smi samples (``...records.smi_csv``);
- ``*.log`` / ``*.txt``: DeepSpeed ``see_memory_usage`` reports (``...records.ds_log``).

Anything else in a directory is skipped and said so. A bad file is one ``RecordError`` line. Every
file is read through ``memfit.core.records.bounded`` (caps on size, memory, counts and values); a
directory's first ``MAX_DIR_ENTRIES`` entries are looked at, and at most ``MAX_RECORD_FILES`` files
are read in all.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from memfit.core.records.bounded import MAX_DIR_ENTRIES, MAX_RANK, MAX_RECORD_FILES, check_count, quote
from memfit.core.records.snapshot import RecordError, read_snapshot
from memfit.core.records.types import (
    DsLogRecording,
    MemorySnapshot,
    RecordSet,
    SmiRecording,
    StatsRecording,
)

__all__ = ["RecordError", "RecordSet", "read_record", "read_records"]

_RANK = re.compile(r"rank[_-]?([0-9]+)", re.ASCII)


def _rank_of(name: str) -> int | None:
    """The rank a record's file name says (``stats.rank3.json``): ASCII digits, at most ``MAX_RANK``."""
    m = _RANK.search(name)
    if not m:
        return None
    digits = m.group(1)
    if len(digits) > len(str(MAX_RANK)) or int(digits) > MAX_RANK:
        raise RecordError(f"{quote(name)}: the rank in the file name is over {MAX_RANK:,}")
    return int(digits)


def _kind(p: Path) -> str:
    suffix = p.suffix.lower()
    if suffix in (".pickle", ".pkl"):
        return "snapshot"
    if suffix == ".json":
        return "stats"
    if suffix == ".csv":
        return "smi"
    try:
        with p.open("rb") as fh:
            head = fh.read(4096)
    except OSError as exc:
        raise RecordError(f"cannot read {p}: {exc.strerror or exc}") from None
    if head[:1] == b"\x80":
        return "snapshot"
    if head[:2] == b"PK":
        raise RecordError(f"{p}: a zip archive (torch.save format?), not a record memfit reads")
    text = head.decode("utf-8", errors="replace")
    if text.lstrip().startswith("{"):
        return "stats"
    from memfit.core.records.smi_csv import looks_like_smi

    if looks_like_smi(text):
        return "smi"
    return "ds_log"


def read_record(path: str | Path) -> MemorySnapshot | StatsRecording | DsLogRecording | SmiRecording:
    """One record file."""
    p = Path(path)
    if not p.exists():
        raise RecordError(f"record not found: {p}")
    if not p.is_file():
        raise RecordError(f"not a file: {p}")
    kind = _kind(p)
    if kind == "snapshot":
        return read_snapshot(p, rank=_rank_of(p.name))
    if kind == "stats":
        from memfit.core.records.stats_json import read_stats

        return read_stats(p)
    if kind == "smi":
        from memfit.core.records.smi_csv import read_smi_csv

        return read_smi_csv(p)
    from memfit.core.records.ds_log import read_ds_log

    try:
        return read_ds_log(p)
    except RecordError as exc:
        if "no DeepSpeed see_memory_usage report" not in str(exc):
            raise  # a log of reports with a bad figure: its own message says which
        raise RecordError(f"{p}: not a record memfit reads (a memory snapshot .pickle, a memory_stats .json, an "
                          f"nvidia-smi .csv or a log with DeepSpeed see_memory_usage lines): {exc}") from None


def _required(name: str) -> bool:
    """Files memfit.record writes: in a directory these must parse; anything else is tried and skipped."""
    n = name.lower()
    return (n.startswith("stats") and n.endswith(".json")) or n.endswith((".pickle", ".pkl"))


def _directory(d: Path, notes: list[str]) -> list[tuple[Path, bool]]:
    try:
        with os.scandir(d) as it:
            entries = []
            for entry in it:
                entries.append(entry.name)
                check_count(len(entries), MAX_DIR_ENTRIES, what="entries or more", where=str(d),
                            hint="give the record files themselves")
    except OSError as exc:
        raise RecordError(f"cannot list {d}: {exc.strerror or type(exc).__name__}") from None
    files = sorted(f for f in (d / name for name in entries) if f.is_file())
    keep = []
    for f in files:
        name = f.name.lower()
        if name.endswith((".pickle", ".pkl", ".json", ".csv", ".log", ".txt")):
            keep.append((f, _required(f.name)))
        else:
            notes.append(f"{d.name}/{f.name}: skipped (not a record kind memfit reads)")
    if not keep:
        raise RecordError(f"{d}: no record in this directory (memfit.record writes stats.rank<R>.json and, if asked, "
                          "snapshot.rank<R>.pickle)")
    return keep


def read_records(paths: list[str] | tuple[str, ...] | list[Path]) -> RecordSet:
    """Every record under ``paths`` (files and record directories)."""
    if not paths:
        raise RecordError("give at least one record (a file or a memfit.record directory)")
    notes: list[str] = []
    files: list[tuple[Path, bool]] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            files.extend(_directory(p, notes))
        elif p.exists():
            files.append((p, True))
        else:
            raise RecordError(f"record not found: {p}")
    check_count(len(files), MAX_RECORD_FILES, what="record files", where=", ".join(str(p) for p in paths)[:200])
    snapshots, stats, logs, smi = [], [], [], []
    for f, required in files:
        try:
            rec = read_record(f)
        except RecordError as exc:
            if required:
                raise
            notes.append(f"{f.parent.name}/{f.name}: skipped ({str(exc).replace(str(f) + ': ', '')[:160]})")
            continue
        if isinstance(rec, MemorySnapshot):
            snapshots.append(rec)
        elif isinstance(rec, StatsRecording):
            if rec.rank is None and _rank_of(f.name) is not None:
                from dataclasses import replace

                rec = replace(rec, rank=_rank_of(f.name))
            stats.append(rec)
        elif isinstance(rec, DsLogRecording):
            logs.append(rec)
        else:
            smi.append(rec)
        notes.extend(getattr(rec, "notes", ()))
    if not (snapshots or stats or logs or smi):
        skipped = "; ".join(n for n in notes if "skipped" in n)[:300]
        raise RecordError(f"no record in {', '.join(str(p) for p in paths)} (memfit.record writes stats.rank<R>.json and, "
                          "if asked, snapshot.rank<R>.pickle)" + (f"; {skipped}" if skipped else ""))
    seen: dict[tuple[str, int], str] = {}
    for rec in (*stats, *snapshots):
        key = (type(rec).__name__, rec.rank or 0)
        if key in seen:
            raise RecordError(f"two {'stats files' if key[0] == 'StatsRecording' else 'snapshots'} for rank {key[1]}: "
                              f"{seen[key]} and {rec.path}; give one recording at a time")
        seen[key] = rec.path
    return RecordSet(snapshots=tuple(snapshots), stats=tuple(stats), ds_logs=tuple(logs), smi=tuple(smi),
                     notes=tuple(notes))
