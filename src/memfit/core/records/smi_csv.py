"""Read nvidia-smi samples: ``nvidia-smi --query-gpu=timestamp,memory.used --format=csv [-lms 100]``.

Variants read: with or without the header line (``--format=csv,noheader``), with or without units
(``nounits``: ``1234`` instead of ``1234 MiB``), extra columns (``index``, ``memory.total``, ...)
when the header names them, and several GPUs (one line per GPU per sample; without an ``index``
column they are numbered in the order each timestamp lists them). nvidia-smi prints memory in MiB
(2**20 B) and its timestamp in local time without a zone (``2024/05/01 12:00:00.123``); memfit keeps
it as printed and aligns it with a recording's phases through the recording's UTC offset.
Unsupported readings (``[N/A]``, ``[Not Supported]``) are skipped and counted.

Bounded (``memfit.core.records.bounded``): at most 32 MiB and 1,000,000 lines, counted before the
CSV is parsed; a reading of more than 20 digits, or over 1 EiB, is one error line.
"""

from __future__ import annotations

import csv
import io
import re
from datetime import datetime, timezone
from pathlib import Path

from memfit.core.records.bounded import (
    MAX_SMI_BYTES,
    MAX_SMI_SAMPLES,
    RecordError,
    check_bytes,
    check_count,
    check_digits,
    quote,
    record_text,
)
from memfit.core.records.types import SmiRecording, SmiSample

_STAMP = re.compile(r"^(\d{4})/(\d{2})/(\d{2}) (\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?$", re.ASCII)
_MEM_VALUE = re.compile(r"^(\d+)\s*(MiB|KiB|GiB)?$", re.ASCII)
_UNIT_SCALE = {"KiB": 2**10, "MiB": 2**20, "GiB": 2**30, None: 2**20}


def _stamp_us(text: str, seconds: dict[str, int] | None = None) -> int:
    """``2024/05/01 12:00:00.123`` as microseconds, reading the clock as UTC (memfit aligns it with
    the recording's UTC offset). ``seconds`` caches the whole-second part (samples 100 ms apart
    share it). ``ValueError`` for a date that does not exist."""
    m = _STAMP.match(text)
    if m is None:
        raise ValueError(text)
    whole = text[:19]
    base = seconds.get(whole) if seconds is not None else None
    if base is None:
        y, mo, d, h, mi, sec = (int(g) for g in m.groups()[:6])
        base = int(datetime(y, mo, d, h, mi, sec, tzinfo=timezone.utc).timestamp()) * 1_000_000
        if seconds is not None:
            seconds[whole] = base
    frac = m.group(7)
    return base + (int(frac[:6].ljust(6, "0")) if frac else 0)


def looks_like_smi(text: str) -> bool:
    head = text.lstrip()[:400]
    first = head.splitlines()[0] if head else ""
    if "memory.used" in first:
        return True
    cells = [c.strip() for c in first.split(",")]
    return bool(cells) and _STAMP.match(cells[0]) is not None and any(_MEM_VALUE.match(c) for c in cells[1:])


def parse_smi_csv(text: str, *, path: str = "<csv>") -> SmiRecording:
    check_count(max(text.count("\n"), text.count("\r")), MAX_SMI_SAMPLES, what="lines", where=path,
                hint="nvidia-smi -lms 1000 samples less often; or cut the CSV to the run's time window")
    try:
        rows = [r for r in csv.reader(io.StringIO(text)) if any(c.strip() for c in r)]
    except csv.Error as exc:
        raise RecordError(f"{path}: not an nvidia-smi CSV ({exc})") from None
    if not rows:
        raise RecordError(f"{path}: empty nvidia-smi CSV")
    header = [c.strip().lower() for c in rows[0]]
    notes: list[str] = []
    col_time = col_mem = col_index = None
    header_unit = None
    if any(h.startswith("memory.used") for h in header):
        for i, h in enumerate(header):
            if h.startswith("timestamp"):
                col_time = i
            elif h.startswith("memory.used"):
                col_mem = i
                u = re.search(r"\[(\w+)\]", rows[0][i])
                header_unit = u.group(1) if u else None
            elif h == "index":
                col_index = i
        body = rows[1:]
    else:  # noheader: timestamp first if it looks like one, memory.used the first size-like column
        body = rows
        first = [c.strip() for c in rows[0]]
        col_time = 0 if _STAMP.match(first[0]) else None
        for i, c in enumerate(first):
            if i != col_time and _MEM_VALUE.match(c):
                col_mem = i
                break
        notes.append(f"{Path(path).name}: no header line; read column {col_mem} as memory.used"
                     + (" and column 0 as the timestamp" if col_time == 0 else ""))
    if col_mem is None:
        raise RecordError(f"{path}: no memory.used column (run nvidia-smi --query-gpu=timestamp,memory.used --format=csv)")
    if header_unit is not None and header_unit not in _UNIT_SCALE:
        raise RecordError(f"{path}: memory.used in unknown unit [{quote(header_unit)}]")
    samples: list[SmiSample] = []
    skipped = 0
    order: dict[int | None, int] = {}
    seconds: dict[str, int] = {}
    for n, row in enumerate(body, start=2 if body is not rows else 1):
        cells = [c.strip() for c in row]
        if len(cells) <= col_mem:
            raise RecordError(f"{path}: line {n} has {len(cells)} columns, expected at least {col_mem + 1}")
        value = cells[col_mem]
        m = _MEM_VALUE.match(value)
        if not m:
            if value.startswith("[") or value.upper() in ("N/A", ""):
                skipped += 1
                continue
            raise RecordError(f"{path}: line {n}: memory.used {quote(value)} is not a size in MiB")
        unit = m.group(2) or header_unit
        if m.group(2) is None and header_unit is None and "assumed MiB" not in " ".join(notes):
            notes.append(f"{Path(path).name}: memory.used has no unit; assumed MiB (nvidia-smi's only memory unit)")
        check_digits(m.group(1), what="memory.used", where=f"{path}: line {n}")
        used = check_bytes(int(m.group(1)) * _UNIT_SCALE[unit], what="memory.used", where=f"{path}: line {n}")
        t_us = None
        if col_time is not None:
            stamp = cells[col_time] if len(cells) > col_time else ""
            if not _STAMP.match(stamp):
                raise RecordError(f"{path}: line {n}: timestamp {quote(stamp)} is not nvidia-smi's YYYY/MM/DD HH:MM:SS.mmm")
            try:
                t_us = _stamp_us(stamp, seconds)
            except (ValueError, OverflowError):
                raise RecordError(f"{path}: line {n}: timestamp {quote(stamp)} is not a valid date") from None
        if col_index is not None:
            index = cells[col_index] if len(cells) > col_index else ""
            if not (index.isascii() and index.isdigit() and len(index) <= 7):
                raise RecordError(f"{path}: line {n}: GPU index {quote(index)} is not a number of at most 7 digits")
            gpu = int(index)
        else:
            seen = order.get(t_us, 0) if t_us is not None else 0
            gpu = seen
            if t_us is not None:
                order[t_us] = seen + 1
        samples.append(SmiSample(local_time_us=t_us, gpu=gpu, used_bytes=used))
    if not samples:
        raise RecordError(f"{path}: no memory.used reading in it")
    if skipped:
        notes.append(f"{Path(path).name}: {skipped} reading(s) were not numbers ([N/A] or [Not Supported]) and are skipped")
    if col_time is None:
        notes.append(f"{Path(path).name}: no timestamps: the samples cannot be placed in phases, only their maximum is used")
    return SmiRecording(path=path, samples=tuple(samples), notes=tuple(notes))


def read_smi_csv(path: str | Path) -> SmiRecording:
    """The nvidia-smi CSV at ``path``, at most ``MAX_SMI_BYTES``."""
    p = Path(path)
    return parse_smi_csv(record_text(p, what="nvidia-smi CSV", max_bytes=MAX_SMI_BYTES), path=str(p))
