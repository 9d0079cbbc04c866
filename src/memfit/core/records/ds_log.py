"""Read DeepSpeed ``see_memory_usage`` reports out of a training log.

deepspeed/runtime/utils.py:see_memory_usage (0.19.8; earlier versions log the same two lines through
``logger.info``) prints the message, then::

    MA 0.0 GB         Max_MA 0.0 GB         CA 0.0 GB         Max_CA 0 GB
    CPU Virtual Memory:  used = 7.56 GB, percent = 12.1%

MA = ``memory_allocated``, Max_MA = ``max_memory_allocated``, CA = ``memory_reserved``, Max_CA =
``max_memory_reserved``, each divided by 1024**3 although labelled "GB" (so GiB), MA/Max_MA/CA
rounded to 2 decimals and Max_CA to a whole number; then it resets the peak counters, so Max_MA
and Max_CA are the peaks since the previous report. Some forks print MB (1024**2, MiB) or separate
the fields with ``|``; both are read. Only rank 0 prints.

Which phase a report closes is read from its message (``PHASE_MESSAGES``): with
``"memory_breakdown": true`` the engine reports "Engine before/after forward", "... backward",
"... step" (engine.py), and ZeRO reports its own milestones. The first step's reports are
``forward``/``backward``/``optimizer_step``; further micro-steps before the first optimizer step
``accum.*``; every later step ``step2.*`` (BRIEF contract 1). Reports whose message memfit does not
know keep ``phase=None`` and are listed, not guessed.

Line cleaning (colours, timestamps, ``[rank0]:`` prefixes) is ``memfit.core.diagnose``'s, and so is
the bounded read (``read_log``: at most 16 MiB and 250,000 lines). A figure of more than 20 digits
(before or after the point), or over 1 EiB, is one error line naming the line.
"""

from __future__ import annotations

import re
from pathlib import Path

from memfit.core.diagnose import _clean_lines, parse_size, read_log
from memfit.core.records.bounded import MAX_DIGITS, RecordError, check_bytes, check_digits
from memfit.core.records.types import DsLogRecording, DsMemoryLine

_NUM = r"(\d+(?:\.\d+)?)\s*(GB|MB|GiB|MiB)"
_MEM = re.compile(rf"\bMA {_NUM}[\s|]+Max_MA {_NUM}[\s|]+CA {_NUM}[\s|]+Max_CA {_NUM}")
_CPU = re.compile(r"CPU Virtual Memory:\s+used = (\d+(?:\.\d+)?) GB")
_LOGGER_PREFIX = re.compile(r"^\s*(?:\[[^\]]*\]\s*)*(?:\[(?:INFO|WARNING|DEBUG)\]\s*)(?:\[[^\]]*\]\s*)?")
_MP_PREFIX = re.compile(r"^\[\d+\] mp: ")
_UNIT = {"GB": "GiB", "GiB": "GiB", "MB": "MiB", "MiB": "MiB"}
"""DeepSpeed divides by 1024**3 and writes GB (deepspeed/runtime/utils.py:see_memory_usage)."""

PHASE_MESSAGES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"^Engine after forward", re.I), "forward"),
    (re.compile(r"^Engine after backward", re.I), "backward"),
    (re.compile(r"^Engine after step", re.I), "optimizer_step"),
    (re.compile(r"DeepSpeed Engine: (After args sanity test|Before configure distributed model)"), "load"),
    (re.compile(r"After initializing ZeRO optimizer|After initializing optimizer states|DeepSpeedZeRoOffload initialize \[end\]"
                r"|end bf16_? ?optimizer|After creating fp(16|32) partitions|Stage 3 initialize beginning"
                r"|After (flattening|Flattening)|after initializing group", re.I), "initialize"),
)
"""Message -> the phase whose end the report marks (its Max_MA covers the time since the previous
report). "DeepSpeed Engine: ..." is printed at the start of ``deepspeed.initialize`` (engine.py
``__init__``), so its peaks are those of loading the model."""

_BETWEEN = re.compile(r"^Engine before (forward|backward|step)", re.I)
"""Reports between phases (the engine's "before" reports): kept, not compared, except that an
"Engine before forward" right after a report from the start of ``deepspeed.initialize`` closes
``initialize`` (its Max_MA covers the whole call)."""


def _clean_message(text: str) -> str:
    return _MP_PREFIX.sub("", _LOGGER_PREFIX.sub("", text)).strip()


def _bytes(number: str, unit: str, where: str) -> tuple[int, int]:
    check_digits(number, what=f"the figure {number[:12]}...", where=where)
    if len(number.partition(".")[2]) > MAX_DIGITS:
        raise RecordError(f"{where}: the figure {number[:12]}... has over {MAX_DIGITS} decimals")
    size, precision = parse_size(number, _UNIT[unit])
    return check_bytes(size, what=f"the figure {number[:24]} {unit}", where=where), precision


def _step_phase(base: str, step: int, micro: int) -> str:
    if step > 1:
        return f"step2.{base}"
    if base in ("forward", "backward") and micro > 1:
        return f"accum.{base}"
    return base


def parse_ds_log(text: str, *, path: str = "<log>") -> DsLogRecording:
    lines = _clean_lines(text)
    out: list[DsMemoryLine] = []
    notes: list[str] = []
    step, micro = 1, 0
    known_between = 0
    last_text: dict[str, str] = {}
    for i, ln in enumerate(lines):
        m = _MEM.search(ln.text)
        if not m:
            if ln.text.strip() and not _CPU.search(ln.text):
                last_text[ln.stream] = ln.text
            continue
        message = _clean_message(last_text.pop(ln.stream, ""))
        where = f"{path}: line {ln.no}"
        (ma, prec), (max_ma, _), (ca, _), (max_ca, max_ca_prec) = (
            _bytes(m.group(k), m.group(k + 1), where) for k in (1, 3, 5, 7))
        cpu = None
        for nxt in lines[i + 1:i + 3]:
            c = _CPU.search(nxt.text)
            if c and nxt.stream == ln.stream:
                cpu = _bytes(c.group(1), "GB", f"{path}: line {nxt.no}")[0]
                break
        phase = None
        for pattern, name in PHASE_MESSAGES:
            if pattern.search(message):
                phase = name
                break
        between = phase is None and _BETWEEN.search(message) is not None
        if between and message.lower().startswith("engine before forward") and out and out[-1].phase == "load":
            phase, between = "initialize", False
        if between:
            known_between += 1
        if phase == "forward":
            micro += 1
        if phase in ("forward", "backward", "optimizer_step"):
            phase = _step_phase(phase, step, max(micro, 1))
        if phase is not None and phase.endswith("optimizer_step"):
            step, micro = step + 1, 0
        out.append(DsMemoryLine(line=ln.no, message=message or "(no message line)", rank=ln.rank,
                                allocated_bytes=ma, peak_allocated_bytes=max_ma, reserved_bytes=ca,
                                peak_reserved_bytes=max_ca, host_used_bytes=cpu, phase=phase,
                                precision_bytes=prec, peak_reserved_precision_bytes=max_ca_prec))
    if not out:
        raise RecordError(f"{path}: no DeepSpeed see_memory_usage report in it (lines like 'MA 1.2 GB  Max_MA 3.4 GB  "
                          "CA 5.6 GB  Max_CA 6 GB'; DeepSpeed prints them with \"memory_breakdown\": true)")
    unplaced = [ln for ln in out if ln.phase is None and not _BETWEEN.search(ln.message)]
    if known_between:
        notes.append(f"{Path(path).name}: {known_between} of {len(out)} see_memory_usage reports are the engine's "
                     "'before' reports (between phases): listed, not compared")
    if unplaced:
        notes.append(f"{Path(path).name}: {len(unplaced)} of {len(out)} see_memory_usage reports name no phase memfit "
                     f"knows (e.g. {unplaced[0].message[:60]!r}); listed, not compared")
    return DsLogRecording(path=path, lines=tuple(out), notes=tuple(notes))


def looks_like_ds_log(text: str) -> bool:
    return _MEM.search(text) is not None


def read_ds_log(path: str | Path) -> DsLogRecording:
    try:
        text = read_log(path)
    except RecordError:
        raise
    except Exception as exc:  # MemfitError from read_log already says what
        raise RecordError(str(exc)) from None
    return parse_ds_log(text, path=str(path))
