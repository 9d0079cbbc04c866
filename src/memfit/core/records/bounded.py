"""The one bounded reader every record file goes through (snapshot pickles, stats JSON, nvidia-smi
CSV, logs with see_memory_usage lines): one ``RecordError`` line for anything over a cap, before the
work the cap saves.

The caps, and what each one protects:

- **size**, per kind of file, checked before a byte is read (``core/reading.read_bytes``: regular
  files only, bounded read);
- **memory while unpickling**: a pickle's opcodes can build 200 bytes of Python objects per byte of
  file (an empty set is one byte), so the unpickler reads through ``BudgetedFile``, which looks at the
  process's resident memory every 64 KiB the C unpickler asks for and stops it past
  ``MAX_UNPICKLE_GROWTH_BYTES``;
- **counts**, taken *per reference* before anything is converted (a shared list counts once for
  every place that refers to it, because that is how often the comparison walks it): segments,
  blocks, trace events, frames per stack, phases, nvidia-smi samples, record files;
- **values**: every byte count at most ``MAX_SIZE_BYTES`` (1 EiB, the cap of every other size memfit
  reads), ranks at most ``MAX_RANK``, times at most ``MAX_TIME_US``, numbers written as text at
  most ``MAX_DIGITS`` digits, so that every figure renders (as GiB, in a report, on the terminal);
- **depth and values of JSON**: ``core/reading.parse_json`` (64 levels), with at most
  ``MAX_STATS_VALUES`` values, counted on the text before it is parsed.

The largest file each cap allows is read within 10 s and 1 GiB on a 2-core machine
(``benchmarks/bench_records.py`` prints the figures).
"""

from __future__ import annotations

import contextlib
import gc
import io
import os
import reprlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from memfit.core.hardware import MAX_SIZE_BYTES
from memfit.core.reading import MiB, decode_text, parse_json, read_bytes
from memfit.errors import MemfitError

MAX_SNAPSHOT_BYTES = 128 * MiB
"""A ``_dump_snapshot`` pickle: 100,000 entries with 15-frame stacks pickle to 16 MiB, 300,000 to
about 45 MiB, and with Python and C++ stacks (70 frames) about 3 times that."""
MAX_UNPICKLE_GROWTH_BYTES = 512 * MiB
"""Resident memory the unpickled objects of one snapshot may take (300,000 entries with 15-frame
stacks take about 210 MiB, with 70-frame stacks about 400 MiB). With the file's bytes (freed once unpickled) and the frozen objects
memfit builds from them, a process stays under 1 GiB."""
MAX_SNAPSHOT_EVENTS = 300_000
"""Trace entries of a snapshot, all devices (``memfit.record`` records 200,000 by default, torch
100,000). The comparison attributes each allocation by its stack: 300,000 entries whose stacks all
differ (the worst case) took 7.5 s of CPU in all, measured on a loaded 2-core machine (load average
9; benchmarks/bench_records.py)."""
MAX_SNAPSHOT_BLOCKS = 500_000
"""Blocks of all segments of a snapshot (a full 80 GB card holds a few tens of thousands)."""
MAX_SNAPSHOT_SEGMENTS = 100_000
"""Segments of a snapshot (each is one cudaMalloc: at most a few thousand on a real card)."""
MAX_STACK_FRAMES = 10_000
"""Frames of one stack (Python stops at 1,000 frames of recursion; C++ frames add a few hundred)."""
MAX_STATS_BYTES = 64 * MiB
"""A stats JSON (memfit.record writes about 6 KiB per phase on CUDA: 10,000 phases)."""
MAX_STATS_VALUES = 2_000_000
"""Values in a stats JSON (about 140 per phase of ``memory_stats()`` and ``host_memory_stats()``)."""
MAX_PHASES = 100_000
"""Phases in one stats JSON."""
MAX_SMI_BYTES = 32 * MiB
"""An nvidia-smi CSV (``-lms 100`` on 8 GPUs writes about 13 MiB an hour)."""
MAX_SMI_SAMPLES = 1_000_000
"""Lines of an nvidia-smi CSV."""
MAX_RECORD_FILES = 256
"""Record files in one ``memfit compare`` (a directory's, and every file given)."""
MAX_DIR_ENTRIES = 10_000
"""Entries of a record directory memfit looks at."""
MAX_RANK = 2**20
"""The highest rank a record may name (1,048,576 ranks)."""
MAX_TIME_US = 2**62
"""Microseconds since the epoch, or a duration (about 146,000 years)."""
MAX_DIGITS = 20
"""Digits of a number written as text (2^64 has 20)."""
MAX_ADDRESS = 2**64
"""A device address (a 64-bit pointer)."""


class RecordError(MemfitError):
    """A record file memfit cannot read, explained in one line (newlines in what it quotes are folded)."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(str(message).split()))


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother, _REPR.maxlist, _REPR.maxdict = 2, 40, 40, 4, 4
_REPR.maxlong = 24


def quote(value: Any) -> str:
    """A short, safe ``repr`` for a message: bounded in length and depth (a value nested 100,000
    levels deep, or a 100 MB string, prints as a few dozen characters)."""
    try:
        return _REPR.repr(value)
    except Exception:  # noqa: BLE001 - a message must never fail
        return f"<{type(value).__name__}>"


# ----------------------------------------------------------------------------------- the files

def record_bytes(path: str | Path, *, what: str, max_bytes: int) -> bytes:
    """The bytes of a record file of at most ``max_bytes`` (``RecordError`` otherwise)."""
    try:
        return read_bytes(path, what=what, max_bytes=max_bytes)
    except RecordError:
        raise
    except MemfitError as exc:
        raise RecordError(str(exc)) from None


def record_text(path: str | Path, *, what: str, max_bytes: int) -> str:
    """A UTF-8 record file of at most ``max_bytes``."""
    data = record_bytes(path, what=what, max_bytes=max_bytes)
    try:
        return decode_text(data, what=f"{what} {path}")
    except MemfitError as exc:
        raise RecordError(str(exc)) from None


def record_json(path: str | Path, *, what: str = "stats JSON", max_bytes: int = MAX_STATS_BYTES,
                max_values: int = MAX_STATS_VALUES) -> Any:
    """A JSON record: at most ``max_bytes``, ``max_values`` values (counted on the text first: every
    value but the first follows a ``,``, ``[``, ``{`` or ``:``, so their count bounds what
    ``json.loads`` would build), 64 levels, numbers of at most 4,300 digits. Python's NaN/Infinity
    are read (``json.dumps`` writes them for a float counter torch left undefined); every figure
    memfit takes from the file is then checked to be a finite whole number where it is read."""
    text = record_text(path, what=what, max_bytes=max_bytes)
    separators = text.count(",") + text.count("[") + text.count("{")
    if separators > max_values:
        raise RecordError(f"{path}: holds about {separators:,} values; memfit reads at most {max_values:,} in a {what}")
    try:
        return parse_json(text, what=f"{what} {path}", max_nodes=max_values, allow_non_finite=True)
    except MemfitError as exc:
        if "integer string conversion" in str(exc):  # int()'s own limit (sys.int_info.default_max_str_digits)
            raise RecordError(f"{what} {path}: holds a number of over 4,300 digits; a memory figure has at most "
                              f"{MAX_DIGITS}") from None
        raise RecordError(str(exc)) from None


def check_count(n: int, cap: int, *, what: str, where: str, hint: str = "") -> None:
    """``n`` things of a kind against its cap: one line naming both."""
    if n > cap:
        raise RecordError(f"{where}: {n:,} {what}; memfit reads at most {cap:,}" + (f" ({hint})" if hint else ""))


def check_digits(text: str, *, what: str, where: str) -> None:
    """A number written as text: at most ``MAX_DIGITS`` digits before the decimal point."""
    whole = text.split(".", 1)[0].lstrip("0")
    if len(whole) > MAX_DIGITS:
        raise RecordError(f"{where}: {what} has {len(whole):,} digits; a memory figure has at most {MAX_DIGITS}")


def check_bytes(n: int, *, what: str, where: str) -> int:
    """A byte count of at most 1 EiB (``MAX_SIZE_BYTES``), as every size memfit reads."""
    if n > MAX_SIZE_BYTES:
        raise RecordError(f"{where}: {what} is {_magnitude(n)} bytes, over 1 EiB (2^60 bytes), the most memfit reads")
    return n


def _magnitude(n: int) -> str:
    if n < 10**24:
        return f"{n:,}"
    bits = n.bit_length()
    return f"about 2^{bits - 1}"


# ------------------------------------------------------------------------- bounded unpickling

@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while a record's objects are built, as it was after.

    Building millions of containers (a snapshot's entry dicts and frame lists) triggers a collection
    every 700 allocations, and the older generations' collections walk everything built so far:
    unpickling the issue's 123 MiB snapshot (850,000 entries) took 2.0-3.0 s of CPU with it on and
    0.7 s with it off (benchmarks/bench_records.py prints the whole command's figures). Nothing built
    here is garbage until the caller drops it; a cycle a hostile file builds is collected after."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
CHECK_EVERY_BYTES = 64 * 1024
"""The C unpickler prefetches through ``peek`` in blocks of this order; memory is looked at as often."""


def resident_bytes() -> int | None:
    """This process's resident memory (``/proc/self/statm``; else the peak from ``getrusage``)."""
    try:
        with open("/proc/self/statm", "rb") as fh:
            return int(fh.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        pass
    try:
        import resource
        import sys

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024
    except (ImportError, OSError, ValueError):  # pragma: no cover - no resource module
        return None


class MemoryBudgetExceeded(Exception):
    """Raised from inside the unpickler's reads (never escapes ``BudgetedFile``'s caller)."""


class BudgetedFile:
    """A read-only file over ``data`` for ``pickle.Unpickler`` that stops the load once the process
    has grown by more than ``budget`` bytes since it was made (checked every ``CHECK_EVERY_BYTES``
    the unpickler consumes, so the overshoot is at most one block's worth of objects)."""

    def __init__(self, data: bytes, budget: int = MAX_UNPICKLE_GROWTH_BYTES) -> None:
        self._buf = io.BytesIO(data)
        self._budget = budget
        self._base = resident_bytes()
        self._next_check = CHECK_EVERY_BYTES
        self.peak_growth = 0

    def _check(self) -> None:
        pos = self._buf.tell()
        if pos < self._next_check or self._base is None:
            return
        self._next_check = pos + CHECK_EVERY_BYTES
        now = resident_bytes()
        if now is None:
            return
        growth = now - self._base
        self.peak_growth = max(self.peak_growth, growth)
        if growth > self._budget:
            raise MemoryBudgetExceeded(growth)

    def read(self, n: int = -1) -> bytes:
        self._check()
        return self._buf.read(n)

    def readinto(self, b) -> int:
        self._check()
        return self._buf.readinto(b)

    def readline(self, size: int | None = -1) -> bytes:
        self._check()
        return self._buf.readline(-1 if size is None else size)

    def peek(self, n: int = 0) -> bytes:
        self._check()
        pos = self._buf.tell()
        data = self._buf.read(max(n, 1))
        self._buf.seek(pos)
        return data
