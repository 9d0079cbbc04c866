"""Log parsing: the failures a log holds (GPU/host/pinned out of memory, NCCL, op builds), with the
figures their messages print, grouped into one event per failure and rank."""

from __future__ import annotations

import re

from memfit.core.lean_dataclass import dataclass
from memfit.core.diagnose.logtext import (LogLine, _clean_lines, _frame_match, _STOP, _tracebacks,
                                           _window)
from memfit.core.diagnose.results import MEMORY_KINDS, EventKind, Frame, LogEvent, OomNumbers


# -------------------------------------------------------------------------------------- figures

_UNIT = {"byte": 1, "bytes": 1, "b": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
         "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
_SZ = r"(?<![\d.])(\d{1,15}(?:\.\d{1,15})?)[ \t]{0,3}(bytes?|[KMGT]i?B|B)\b"
"""A printed size. Linear on any input: it starts only where a number starts (the lookbehind), and
its digits and spaces are bounded (a longer number is no real figure, and would make a search
quadratic on a long digit run)."""


def parse_size(number: str, unit: str) -> tuple[int, int]:
    """``('1.88', 'GiB')`` -> ``(2_018_634_629, 5_368_709)``: bytes, and half a unit of the last
    printed digit (what the printed figure can be off by). GiB = 2**30, GB = 10**9."""
    scale = _UNIT[unit.lower()]
    decimals = len(number.split(".", 1)[1]) if "." in number else 0
    return round(float(number) * scale), (scale * 5 // 10 ** (decimals + 1) if decimals else scale // 2)


def _size(pattern: str, text: str) -> tuple[int, int] | None:
    """The first size ``pattern`` finds (``SIZE`` marks where; alternatives may each have one)."""
    m = re.search(pattern.replace("SIZE", _SZ), text)
    if not m:
        return None
    groups = [g for g in m.groups() if g is not None]
    return parse_size(groups[0], groups[1])


def _oom_numbers(text: str) -> OomNumbers:
    """The figures of a CUDA allocator OOM message (either torch form), from its joined window."""
    fields = {
        "tried_to_allocate_bytes": r"Tried to allocate SIZE",
        "total_capacity_bytes": r"(?:SIZE total capacity|total capacity of SIZE)",
        "free_bytes": r"(?:SIZE free;|of which SIZE is free)",
        "allocated_bytes": r"(?:SIZE already allocated|Of the allocated memory SIZE is allocated by PyTorch)",
        "reserved_bytes": r"SIZE (?:reserved in total by PyTorch|cached\))",
        "reserved_unallocated_bytes": r"SIZE is reserved by PyTorch but unallocated",
        "private_pools_bytes": r"with SIZE allocated in private pools",
        "process_in_use_bytes": r"this process has SIZE memory in use",
        "allowed_bytes": r"SIZE allowed;",
    }
    vals: dict[str, int] = {}
    prec = 0
    for name, pat in fields.items():
        got = _size(pat, text)
        if got is not None:
            vals[name], p = got
            prec = max(prec, p)
    others = tuple(parse_size(n, u)[0] for n, u in
                   re.findall(r"Process \d{1,12} has " + _SZ + r" memory in use", text))
    two = "is allocated by PyTorch" in text
    if two and "reserved_bytes" not in vals and "allocated_bytes" in vals:
        vals["reserved_bytes"] = vals["allocated_bytes"] + vals.get("reserved_unallocated_bytes", 0)
    if not two and "reserved_bytes" in vals and "allocated_bytes" in vals:
        diff = vals["reserved_bytes"] - vals["allocated_bytes"]
        if diff >= -2 * prec:  # the two printed figures round separately; a real log is never further apart
            vals["reserved_unallocated_bytes"] = max(diff, 0)
        # else: the log's figures contradict each other (reserved below allocated): no figure rather than a
        # negative one
    return OomNumbers(**vals, other_processes_bytes=others, precision_bytes=prec,
                      form="torch 2.x" if two else "torch 1.x")


# -------------------------------------------------------------------------------------- matching

_GPU_OOM = re.compile(r"\b(?:CUDA|HIP) out of memory\b")
_CUDA_ERR_OOM = re.compile(r"CUDA error: out of memory|cudaErrorMemoryAllocation|CUBLAS_STATUS_ALLOC_FAILED"
                           r"|CUDA_ERROR_OUT_OF_MEMORY")
_PINNED = re.compile(r"cudaHostAlloc|CachingHostAllocator|pin_memory|pinned|pin_empty", re.IGNORECASE)
_NCCL = re.compile(r"NCCL error|\bnccl(?:UnhandledCudaError|SystemError|InternalError|InvalidUsage|RemoteError"
                   r"|InvalidArgument)\b|NCCL WARN|NCCL communicator was aborted|Watchdog caught collective "
                   r"operation timeout")
_NCCL_CODE = re.compile(r"\b(nccl[A-Z]\w+)\b")
_BUILD = (  # (pattern, strength): the strongest line becomes the event's message
    (re.compile(r"Error building extension '(?P<op>\w+)'"), 3),
    (re.compile(r"CUDA_HOME environment variable is not set|CUDA_HOME does not exist|MissingCUDAException"
                r"|Unable to run \S{0,4096}?nvcc"), 3),
    (re.compile(r"Ninja is required to load C\+\+ extensions"), 3),
    (re.compile(r"ImportError: \S{0,512}?(?P<op>cpu_adam|fused_adam|cpu_adagrad|cpu_lion|fused_lamb|transformer_inference)"
                r"\S{0,512}?\.so"), 3),
    (re.compile(r"ninja: build stopped: subcommand failed"), 2),
    (re.compile(r"'DeepSpeed(?P<op>CPUAdam|CPUAdagrad|CPULion)' object has no attribute 'ds_opt_\w+'"), 1),
)
_BUILD_OP = re.compile(r"(?:Building extension module |Emitting ninja build file \S{0,4096}/|extension directory "
                       r"\S{0,4096}/)(\w+)")
_BUILD_CAUSE = re.compile(r"fatal error:|\berror:|nvcc fatal|unsupported GNU version|No such file or directory")
_HOST = (  # (pattern, strength)
    (re.compile(r"DefaultCPUAllocator: can't allocate memory|(?<![A-Za-z])MemoryError\b|_ArrayMemoryError"
                r"|\[Errno 12\] Cannot allocate memory"), 3),
    (re.compile(r"Out of memory: Kill(?:ed)? process|oom-kill|oom_reaper|invoked oom-killer"), 3),
    (re.compile(r"Signal 9 \(SIGKILL\)|Signals\.SIGKILL|exitcode\s*:\s*-9\b"
                r"|exit(?:ed with)? code[ \t]{0,3}(?:[:=][ \t]{0,3})?(?:-9|137)\b"
                r"|return code\s*=\s*(?:-9|137)\b|exit status\s*(?:-9|137)\b|\bexitcode\s*[:=]\s*137\b"), 2),
    (re.compile(r"^\s*Killed\s*$|(?<!\d)\d{1,12} Killed\s+\S|^Killed\s+\S"), 2),
)
_EXIT = re.compile(r"(?:exitcode|exit(?:ed with)? code|return code[ \t]{0,3}=|exit status)[ \t]{0,3}(?:[:=][ \t]{0,3})?"
                   r"(-?\d{1,12})"
                   r"|SIGKILL: (9)|Signal (9) \(SIGKILL\)")
_LAUNCHERS = ("torch/distributed/elastic/", "torch/distributed/run.py", "deepspeed/launcher/")
_ROOT_RANK = re.compile(r"\brank\s*:\s*(\d{1,9})\s*\(local_rank")
_GPU_IDX = re.compile(r"\(GPU (\d{1,9});|GPU (\d{1,9}) has a total capacity|cuda:(\d{1,9})\b")


@dataclass(slots=True)
class _Hit:
    kind: EventKind
    strength: int
    stream: str
    idx: int
    line: LogLine
    window: str
    frames: tuple[Frame, ...]


def _classify(text: str) -> tuple[EventKind, int] | None:
    if _GPU_OOM.search(text) and "CUDA error" not in text:
        return EventKind.GPU_OOM, 3
    if _CUDA_ERR_OOM.search(text):
        return EventKind.CUDA_ERROR_OOM, 3
    if _NCCL.search(text):
        return EventKind.NCCL_ERROR, 3 if re.search(r"NCCL error|nccl[A-Z]", text) else 1
    for pat, strength in _BUILD:
        if pat.search(text):
            return EventKind.OP_BUILD_ERROR, strength
    for pat, strength in _HOST:
        if pat.search(text):
            return EventKind.HOST_OOM, strength
    return None


def _is_pinned(hit: _Hit) -> bool:
    """A numberless CUDA OOM raised by a page-locked host allocation: ``pin_memory`` (or
    ``cudaHostAlloc``) in the message or in the innermost frames' code or names."""
    if _PINNED.search(hit.window):
        return True
    for f in hit.frames[-3:]:
        if _PINNED.search(f.code) or _PINNED.search(f.function) or f.function in (
                "_create_param_groups_fp16_flat_cpu_memory",):
            return True
    return False


# ----------------------------------------------------------------------------------------- events

@dataclass(frozen=True, slots=True, kw_only=True)
class ParsedLog:
    """What the log says, before any plan: the events and the facts around them."""

    events: tuple[LogEvent, ...]
    deepspeed_version: str | None
    torch_version: str | None
    zero3: bool
    """The log shows ZeRO-3 at work (stage3.py / partition_parameters.py frames or log lines)."""
    lines: tuple[LogLine, ...]


def _first_int(m: re.Match[str]) -> int:
    return int(next(g for g in m.groups() if g is not None))


def _host_facts(hits: list[_Hit], window: str,
                lines: list[LogLine]) -> tuple[OomNumbers | None, int | None, int | None]:
    """A host OOM's request size (DefaultCPUAllocator, numpy), exit code and the rank torchrun names
    as its root cause (torch/distributed/elastic/multiprocessing/errors: ChildFailedError.format_msg)."""
    numbers = None
    m = re.search(r"you tried to allocate (\d{1,20}) bytes", window)
    if m:
        numbers = OomNumbers(tried_to_allocate_bytes=int(m.group(1)), form="host")
    elif (got := _size(r"Unable to allocate SIZE", window)) is not None:
        numbers = OomNumbers(tried_to_allocate_bytes=got[0], precision_bytes=got[1], form="host")
    exit_code = None
    for h in hits:
        m = _EXIT.search(h.line.text)
        if m and _HOST[2][0].search(h.line.text):
            code = _first_int(m)
            exit_code = -9 if code == 9 else code
            break
    rank = None
    for i, ln in enumerate(lines):
        if "Root Cause (first observed failure)" in ln.text:
            rank = next((int(m.group(1)) for x in lines[i + 1:i + 6] if (m := _ROOT_RANK.search(x.text))), None)
    if rank is None and (m := _ROOT_RANK.search(window)):
        rank = int(m.group(1))
    return numbers, exit_code, rank


def _nccl_facts(hits: list[_Hit], window: str) -> tuple[str, bool]:
    """The NCCL error codes, its ``Last error`` line and version; whether CUDA ran out of memory."""
    codes = [c for c in dict.fromkeys(_NCCL_CODE.findall(window)) if c != "ncclCommInitRank"]
    last = next((m for h in hits if (m := re.search(
        r"Last error: (.+?)(?= nccl[A-Z]\w*:| Exception raised from| \[|$)", h.window))), None)
    ver = re.search(r"NCCL version (\S+)", window)
    parts = [", ".join(codes)]
    if last:
        parts.append(f"last error: {last.group(1).strip()}")
    elif "timeout" in window.lower():
        parts.append("collective timed out")
    if ver:
        parts.append(f"NCCL {ver.group(1).rstrip(',')}")
    return "; ".join(p for p in parts if p), "out of memory" in window.lower()


def _op_name(hits: list[_Hit], lines: list[LogLine]) -> str:
    """The op that failed to build (``cpu_adam``...), and the first compiler error of its build."""
    op = ""
    for h in hits:
        for pat, _ in _BUILD:
            m = pat.search(h.window)
            if m and m.groupdict().get("op"):
                op = {"CPUAdam": "cpu_adam", "CPUAdagrad": "cpu_adagrad", "CPULion": "cpu_lion"}.get(
                    m.group("op"), m.group("op"))
                break
        if op:
            break
    before = min(h.line.no for h in hits)
    earlier = [ln for ln in lines if ln.no < before]
    start = max((i for i, ln in enumerate(earlier) if _BUILD_OP.search(ln.text)), default=max(len(earlier) - 60, 0))
    for ln in earlier[start:]:
        if not op and (m := _BUILD_OP.search(ln.text)):
            op = m.group(1)
        if _BUILD_CAUSE.search(ln.text) and not _frame_match(ln.text):
            cause = ln.text.strip()
            cause = cause if len(cause) <= 160 else cause[:157] + "..."
            return f"{op}: {cause}" if op else cause
    return op


def _event(hits: list[_Hit], lines: list[LogLine]) -> LogEvent:
    """One event from the hits of one failure (same kind, same rank): the strongest line is its
    message, the longest traceback its frames, the earliest line its position."""
    kind = hits[0].kind
    top = max(hits, key=lambda h: (h.strength, -h.idx))
    with_frames = [h for h in hits if h.frames]
    frames = max(with_frames, key=lambda h: len(h.frames)).frames if with_frames else ()
    window = " ".join(h.window for h in hits)
    first = min(hits, key=lambda h: h.line.no)
    m = _GPU_IDX.search(window)
    gpu = _first_int(m) if m else None
    numbers, exit_code, rank, detail, oom = None, None, first.line.rank, "", False
    if kind == EventKind.GPU_OOM:
        numbers = _oom_numbers(next((h.window for h in hits if "Tried to allocate" in h.window), top.window))
    elif kind == EventKind.CUDA_ERROR_OOM and any(_is_pinned(h) for h in hits):
        kind, gpu = EventKind.PINNED_HOST_OOM, None
    elif kind == EventKind.HOST_OOM:
        numbers, exit_code, named = _host_facts(hits, window, lines)
        rank = rank if rank is not None else named
        if exit_code is not None:
            detail = "SIGKILL (exit code -9; shells report 137 = 128 + 9)"
    elif kind == EventKind.NCCL_ERROR:
        detail, oom = _nccl_facts(hits, window)
    elif kind == EventKind.OP_BUILD_ERROR:
        detail = _op_name(hits, lines)
    return LogEvent(kind=kind, message=top.line.text.strip(), line=first.line.no, rank=rank, host=first.line.host,
                    gpu_index=gpu, numbers=numbers, exit_code=exit_code, detail=detail, out_of_memory=oom,
                    frames=frames)


def parse_log(text: str) -> ParsedLog:
    """Recognise every failure in ``text`` (any noise around it, ranks interleaved, colours)."""
    lines = _clean_lines(text)
    streams: dict[str, list[LogLine]] = {}
    for ln in lines:
        streams.setdefault(ln.stream, []).append(ln)
    hits: list[_Hit] = []
    for stream, sl in streams.items():
        by_exc, inside = _tracebacks(sl)
        exc_of: dict[int, tuple[Frame, ...]] = {}
        for e, frames in by_exc.items():
            if any(x in f.path for f in frames for x in _LAUNCHERS):
                continue  # the launcher's own traceback (ChildFailedError), not the worker's
            j = e
            while j < len(sl) and j - e < 12:
                t = sl[j].text
                if j > e and (not t.strip() or any(s in t for s in _STOP)):
                    break
                exc_of.setdefault(j, frames)
                j += 1
        for i, ln in enumerate(sl):
            if i in inside:
                continue
            got = _classify(ln.text)
            if got is None:
                continue
            kind, strength = got
            window = _window(sl, i)
            if kind == EventKind.HOST_OOM:  # torchrun prints "rank : N (local_rank: M)" above the exit code
                window = " ".join(x.text.strip() for x in sl[max(i - 2, 0):i]) + " " + window
            hits.append(_Hit(kind, strength, stream, i, ln, window, exc_of.get(i, ())))
    groups: dict[tuple, list[_Hit]] = {}
    for h in hits:
        key = (h.kind,) if h.kind in (EventKind.HOST_OOM, EventKind.OP_BUILD_ERROR) else (h.kind, h.stream)
        groups.setdefault(key, []).append(h)
    events = []
    for key, hs in groups.items():
        if key[0] == EventKind.HOST_OOM and all(h.strength < 2 for h in hs):
            continue
        events.append(_event(hs, lines))
    events.sort(key=lambda e: e.line)
    joined = "\n".join(ln.text for ln in lines)
    ds = re.search(r"DeepSpeed info: version=([0-9][\w.+]*)|deepspeed info \.+ ([0-9][\w.+]*)", joined)
    tv = re.search(r"torch version \.+ ([0-9][\w.+]*)|torch(?:==| )([12]\.\d+\.\d+[\w.+]*)", joined)
    zero3 = bool(re.search(r"zero/stage3\.py|partition_parameters\.py|parameter_offload\.py|ZeRO Stage 3"
                           r"|ZeRO stage 3|\"stage\": 3", joined))
    return ParsedLog(events=tuple(events), deepspeed_version=next((g for g in ds.groups() if g), None) if ds else None,
                     torch_version=next((g for g in tv.groups() if g), None) if tv else None, zero3=zero3,
                     lines=tuple(lines))


def primary_event(events: tuple[LogEvent, ...]) -> LogEvent | None:
    """The root cause (see ``Diagnosis.primary``)."""
    for pick in (lambda e: e.kind == EventKind.OP_BUILD_ERROR,
                 lambda e: e.kind in MEMORY_KINDS or (e.kind == EventKind.NCCL_ERROR and e.out_of_memory),
                 lambda e: True):
        found = [e for e in events if pick(e)]
        if found:
            return found[0]
    return None
