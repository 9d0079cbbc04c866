"""Reading a log: its lines cleaned of colours, timestamps and rank prefixes, and the Python
tracebacks in them (frames with their source lines)."""

from __future__ import annotations

import re
from pathlib import Path

from memfit.core.lean_dataclass import dataclass
from memfit.core.diagnose.results import Frame
from memfit.core.reading import MAX_LOG_BYTES, MAX_LOG_LINES, read_bytes
from memfit.errors import MemfitError


# --------------------------------------------------------------------------------------- reading

def read_log(path: str | Path) -> str:
    """The log's text; ``-`` reads standard input. At most ``MAX_LOG_BYTES`` (the failure is in the
    last lines: ``tail -c`` cuts a longer log); undecodable bytes are replaced, as terminals show
    them. Bad paths, binary files and longer logs raise ``MemfitError``."""
    import sys

    if str(path) == "-":
        data = sys.stdin.buffer.read(MAX_LOG_BYTES + 1)
        if len(data) > MAX_LOG_BYTES:
            raise MemfitError(f"the log on standard input is over {MAX_LOG_BYTES // 2**20} MiB, the most memfit reads; "
                              "pass its end (tail -c 8M)")
        where = "standard input"
    else:
        data = read_bytes(path, what="log file", max_bytes=MAX_LOG_BYTES)
        where = str(path)
    if b"\x00" in data[:4096]:
        raise MemfitError(f"{where}: not a text file")
    return data.decode("utf-8", errors="replace")


_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)")
_TAG = re.compile(r"^\s*(?:\[(?:rank|default)(?P<r>\d{1,9})\]:[ ]?|\[\d{1,9},(?P<m>\d{1,9})\]<std(?:out|err)>:[ ]?)")
_HOST_PREFIX = re.compile(r"^([A-Za-z0-9][\w.-]*): ")
_HOST_TAG = re.compile(r"^(?P<h>[A-Za-z0-9][\w.-]*): (?=Traceback \(most recent call last\):|  File \")")
_STAMP = re.compile(r"^\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})? (?:std(?:out|err) [FP] )?")


@dataclass(frozen=True, slots=True)
class LogLine:
    """One line of the log, cleaned, with the rank (or host) that printed it."""

    no: int
    stream: str
    rank: int | None
    host: str | None
    text: str


def _clean_lines(text: str) -> list[LogLine]:
    """Split at newlines and carriage returns (progress bars), strip colours, a leading ISO
    timestamp (log collectors) and per-rank prefixes (``[rank0]:``, ``[default0]:`` from torchrun,
    ``[1,0]<stderr>:`` from mpirun, ``host: `` from pdsh). A line that another rank's prefix
    interrupts is two lines (same number); what follows a carriage return belongs to the rank of the
    line it continues (a tee'd tqdm bar keeps its carriage returns, and only its first frame has the
    prefix)."""
    breaks = sum(text.count(c) for c in "\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029") - text.count("\r\n")  # str.splitlines'
    if breaks > MAX_LOG_LINES:
        raise MemfitError(f"the log has over {MAX_LOG_LINES:,} lines, the most memfit reads; pass the part around the "
                          f"failure (e.g. tail -n {MAX_LOG_LINES // 2})")
    raw: list[tuple[int, str, bool]] = []  # (line number, text, whether it follows a carriage return)
    after_cr = False
    for i, piece in enumerate(text.splitlines(keepends=True), 1):
        body = piece.rstrip("\r\n\v\f\x1c\x1d\x1e\x85\u2028\u2029")
        for k, part in enumerate(_EMBEDDED_TAG.split(_ANSI.sub("", body), maxsplit=MAX_EMBEDDED_TAGS)):
            raw.append((i, _STAMP.sub("", part), after_cr and k == 0))
        after_cr = piece.endswith("\r")
    hosts = {m.group("h") for _, ln, _ in raw if (m := _HOST_TAG.match(ln))}
    out: list[LogLine] = []
    for i, ln, cont in raw:
        rank, host, stream = None, None, ""
        m = _TAG.match(ln)
        if m:
            rank = int(m.group("r") or m.group("m"))
            stream, ln = f"rank{rank}", ln[m.end():]
        elif cont and out:  # a progress bar's next frame: printed by the rank whose line it continues
            rank, host, stream = out[-1].rank, out[-1].host, out[-1].stream
        else:
            hm = _HOST_PREFIX.match(ln) if hosts else None  # one set lookup per line, not one per host
            if hm and hm.group(1) in hosts:
                host = hm.group(1)
                stream, ln = f"host:{host}", ln[hm.end():]
        out.append(LogLine(i, stream, rank, host, ln))
    return out


_EMBEDDED_TAG = re.compile(r"(?<=\S)(?=\[(?:rank|default)\d{1,9}\]:)")
"""Where another rank's prefix starts inside a line: torchrun's ``TailLog`` writes a worker's partial
last line (a tqdm bar has no newline) with its prefix, and the next line of any rank lands after it."""
MAX_EMBEDDED_TAGS = 4
"""Splits of one line at other ranks' prefixes (a real line holds one or two: a bar, then the line
that landed after it); the rest stays in the last part, so a line of a million prefixes stays one
line's work (tests/robustness/test_exhaustion.py)."""


# ------------------------------------------------------------------------------------ tracebacks

_FRAME = re.compile(r'^\s*File "(?P<path>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)')
_IPY_FRAME = re.compile(r"^\s*File (?P<path>\S+?\.py):(?P<line>\d+), in (?P<func>[\w.<>]+)")  # IPython 8
_CELL = re.compile(r"^\s*Cell (?P<path>In ?\[\d+\]), line (?P<line>\d+)")  # IPython 8: the notebook cell
_ARROW = re.compile(r"^\s*-*>\s*\d*\s?")  # IPython marks the frame's line: "---> 12     loss = ..."
_CARETS = re.compile(r"^\s*[~^]+\s*$")
_MANGLED = re.compile(r"^_[A-Za-z0-9]+(__\w+)$")
_STOP = ("Traceback (most recent call last)", "The above exception was", "During handling of the above")


def _frame_match(text: str):
    return _FRAME.match(text) or _IPY_FRAME.match(text) or _CELL.match(text)


def _tracebacks(lines: list[LogLine]) -> tuple[dict[int, tuple[Frame, ...]], set[int]]:
    """For one stream: the frames of the traceback each exception line ends (index -> frames), and
    the indices that are frame or source lines (never error messages)."""
    by_exc: dict[int, tuple[Frame, ...]] = {}
    inside: set[int] = set()
    i = 0
    while i < len(lines):
        headless = _frame_match(lines[i].text) is not None  # its header went to another line (another rank's)
        if "Traceback (most recent call last)" not in lines[i].text and not headless:
            i += 1
            continue
        inside.add(i)
        frames: list[Frame] = []
        j = i if headless else i + 1
        while j < len(lines):
            t = lines[j].text
            m = _frame_match(t)
            if m:
                inside.add(j)
                code: list[str] = []
                marked: list[str] = []
                k = j + 1
                while k < len(lines):
                    s = lines[k].text
                    if _frame_match(s) or not s.strip() or not (s.startswith((" ", "\t")) or _ARROW.match(s)):
                        break
                    inside.add(k)
                    if _ARROW.match(s):
                        marked.append(_ARROW.sub("", s).strip())
                    elif not _CARETS.match(s) and not s.strip().startswith("[Previous line repeated"):
                        code.append(s.strip())
                    k += 1
                func = m.groupdict().get("func") or "<cell>"
                func = _MANGLED.sub(r"\1", func.rsplit(".", 1)[-1])
                frames.append(Frame(path=m.group("path").replace("\\", "/"), line=int(m.group("line")),
                                    function=func, code=" ".join(marked or code)))
                j = k
                continue
            if not t.strip() or t.startswith((" ", "\t")):
                inside.add(j)
                j += 1
                continue
            break
        if j < len(lines):
            by_exc[j] = tuple(frames)
        i = j
    return by_exc, inside


def _window(lines: list[LogLine], i: int, n: int = 12) -> str:
    """The message at line ``i`` and its continuation, joined (torch's messages get wrapped)."""
    parts = [lines[i].text]
    for ln in lines[i + 1:i + n]:
        t = ln.text
        if not t.strip() or any(s in t for s in _STOP) or _frame_match(t):
            break
        parts.append(t)
    return " ".join(" ".join(parts).split())
