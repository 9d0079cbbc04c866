"""``memfit diagnose``: read a pasted traceback or log, say what failed, in which phase, and how it
squares with a plan.

Glossary
- *event*: one recognised failure (a CUDA allocator OOM, a failed pinned host allocation, a host
  OOM kill, an NCCL error, a DeepSpeed op build failure). The lines one rank prints about the same
  failure are one event; each rank that reports it has its own.
- *frame*: one ``File "...", line N, in f`` entry of a Python traceback, with its source line.
- *phase*: a memfit ledger phase (``memfit.core.ledger_types.PHASES``). The boundaries are the
  replay's (``memfit/replay/seams.py``): ``initialize.cast`` up to ``module.to(device)`` in
  ``DeepSpeedEngine._configure_distributed_model``, ``initialize.move`` that call (and the
  broadcast), ``initialize.partition`` from there through the basic optimizer and ZeRO-3's
  parameter conversion, ``initialize.optimizer`` the rest of ``deepspeed.initialize``.
- *progress line*: a line DeepSpeed or transformers logs on the way (``DeepSpeed info: version=``,
  ``DeepSpeed Flops Profiler Enabled``, ...); the last one before a failure bounds its phase when no
  traceback does (a process killed by the kernel prints none).

Sizes in the messages are parsed as printed: PyTorch's ``format_size`` (c10/cuda/
CUDACachingAllocator.cpp) prints ``bytes``, ``KiB``, ``MiB``, ``GiB`` (binary) with two decimals, so
a parsed figure is exact to half a unit of its last digit (``precision_bytes``). The core never
imports torch; this module is text in, typed results out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING

from memfit.core.ledger_types import Device, Failure, Finding, LedgerItem, Plan
from memfit.core.units import fmt_bytes
from memfit.errors import MemfitError

if TYPE_CHECKING:
    from memfit.core.scenario import Scenario

GiB = 2**30


class EventKind(str, Enum):
    GPU_OOM = "gpu_oom"
    """PyTorch's caching allocator: ``CUDA out of memory. Tried to allocate ...`` with its figures."""
    CUDA_ERROR_OOM = "cuda_error_oom"
    """``CUDA error: out of memory`` (or cuBLAS ``ALLOC_FAILED``) outside the caching allocator, no figures."""
    PINNED_HOST_OOM = "pinned_host_oom"
    """The same CUDA error from a page-locked host allocation (``cudaHostAlloc`` via ``pin_memory``)."""
    HOST_OOM = "host_oom"
    """Host RAM ran out: the kernel killed the process (SIGKILL, exit -9/137) or an allocation failed."""
    NCCL_ERROR = "nccl_error"
    OP_BUILD_ERROR = "op_build_error"
    """A DeepSpeed op (cpu_adam, fused_adam, ...) failed to JIT-compile or load."""


TITLES = {
    EventKind.GPU_OOM: "GPU out of memory (PyTorch caching allocator)",
    EventKind.CUDA_ERROR_OOM: "CUDA error: out of memory (outside PyTorch's caching allocator)",
    EventKind.PINNED_HOST_OOM: "pinned (page-locked) host memory allocation failed",
    EventKind.HOST_OOM: "host RAM ran out",
    EventKind.NCCL_ERROR: "NCCL error",
    EventKind.OP_BUILD_ERROR: "DeepSpeed op build failed",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Frame:
    path: str
    line: int
    function: str
    code: str = ""
    """The source line(s) the traceback shows under the frame."""

    @property
    def short_path(self) -> str:
        """``.../site-packages/deepspeed/runtime/engine.py`` -> ``deepspeed/runtime/engine.py``."""
        p = self.path.replace("\\", "/")
        for mark in ("site-packages/", "dist-packages/"):
            if mark in p:
                return p.rsplit(mark, 1)[1]
        return p.rsplit("/", 1)[-1]


@dataclass(frozen=True, slots=True, kw_only=True)
class OomNumbers:
    """The figures of an out-of-memory message, in bytes; ``None`` where the message has none.

    torch 1.x: ``Tried to allocate A (GPU g; T total capacity; L already allocated; F free;
    R reserved in total by PyTorch)`` (``cached`` before 1.5). torch 2.x: ``Tried to allocate A. GPU g
    has a total capacity of T of which F is free. Including non-PyTorch memory, this process has P
    memory in use. Of the allocated memory L is allocated by PyTorch, [with X allocated in private
    pools,] and U is reserved by PyTorch but unallocated.`` (so R = L + U).
    """

    tried_to_allocate_bytes: int | None = None
    total_capacity_bytes: int | None = None
    free_bytes: int | None = None
    allocated_bytes: int | None = None
    """In live tensors: "already allocated" (1.x) / "allocated by PyTorch" (2.x)."""
    reserved_bytes: int | None = None
    """Held by this process's caching allocator: printed (1.x) or allocated + unallocated (2.x)."""
    reserved_unallocated_bytes: int | None = None
    """Reserved but not in any tensor (2.x prints it; 1.x: reserved - allocated)."""
    private_pools_bytes: int | None = None
    process_in_use_bytes: int | None = None
    """2.x: this process's use of the GPU, including non-PyTorch memory (CUDA context, NCCL)."""
    other_processes_bytes: tuple[int, ...] = ()
    """2.x when NVML lists them: ``Process N has X memory in use`` for each process."""
    allowed_bytes: int | None = None
    """Cap set by ``torch.cuda.set_per_process_memory_fraction``."""
    precision_bytes: int = 0
    """Half a unit of the last printed digit of the coarsest figure (0.005 GiB = 5,368,709 B)."""
    form: str = ""
    """``torch 1.x``, ``torch 2.x`` or ``host`` (``DefaultCPUAllocator``/numpy)."""

    @property
    def outside_allocator_bytes(self) -> int | None:
        """Used on the GPU but not by this process's caching allocator: total - free - reserved (the
        CUDA context, NCCL and cuBLAS workspaces, and every other process on the same GPU)."""
        if None in (self.total_capacity_bytes, self.free_bytes, self.reserved_bytes):
            return None
        return self.total_capacity_bytes - self.free_bytes - self.reserved_bytes  # type: ignore[operator]


@dataclass(frozen=True, slots=True, kw_only=True)
class LogEvent:
    kind: EventKind
    message: str
    """The line that says it, as printed (colours and rank prefix removed)."""
    line: int
    """1-based line number in the log."""
    rank: int | None = None
    host: str | None = None
    gpu_index: int | None = None
    numbers: OomNumbers | None = None
    exit_code: int | None = None
    detail: str = ""
    """Kind-specific: the op that failed to build and the first compiler error; the NCCL error code
    and its ``Last error``; the signal."""
    out_of_memory: bool = False
    """For NCCL errors: the CUDA failure behind it was out of memory."""
    frames: tuple[Frame, ...] = ()
    """Outermost first, as the traceback prints them."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ReconRow:
    """One figure set side by side: what the log says and what the plan says."""

    label: str
    log_bytes: int | None
    plan_bytes: int | None
    note: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Reconciliation:
    """The log's figures against the plan's, for the phase and device that failed."""

    scenario_name: str
    phase: str
    phase_basis: str
    """Why this phase: where the log places the failure, or (without one) the plan's peak."""
    device: str
    """``gpu`` (per rank) or ``cpu`` (host RAM per node)."""
    rows: tuple[ReconRow, ...]
    items: tuple[LedgerItem, ...]
    """The plan's items live at the phase's peak on that device, largest first."""
    plan_verdict: str
    """``predicted`` (the plan fails here too), ``predicted_elsewhere`` (it fails, but first in
    another phase or device) or ``not_predicted`` (the plan says this phase fits)."""
    plan_failure: Failure | None
    """The plan's first failure, if any."""
    lines: tuple[str, ...]
    """Where the log and the plan agree or disagree, in words."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Diagnosis:
    events: tuple[LogEvent, ...]
    """Every recognised failure, in log order."""
    primary: LogEvent | None
    """The root cause: an op build failure first (nothing runs without it), else the earliest
    memory failure, else the earliest NCCL error (often another rank's failure seen from here)."""
    headline: str
    phase: str | None
    phase_reason: str
    phase_source: str
    """``traceback``, ``progress`` (a log line, no traceback) or ``none``."""
    phase_frame: Frame | None
    explanation: tuple[str, ...]
    fixes: tuple[str, ...]
    reconciliation: Reconciliation | None
    findings: tuple[Finding, ...]
    deepspeed_version: str | None = None
    torch_version: str | None = None


# --------------------------------------------------------------------------------------- reading

def read_log(path: str | Path) -> str:
    """The log's text; ``-`` reads standard input. Bad paths raise ``MemfitError``."""
    import sys

    if str(path) == "-":
        return sys.stdin.read()
    p = Path(path)
    if not p.exists():
        raise MemfitError(f"log file not found: {p}")
    if not p.is_file():
        raise MemfitError(f"not a file: {p}")
    data = p.read_bytes()
    if b"\x00" in data[:4096]:
        raise MemfitError(f"{p}: not a text file")
    return data.decode("utf-8", errors="replace")


_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)")
_TAG = re.compile(r"^\s*(?:\[(?:rank|default)(?P<r>\d+)\]:[ ]?|\[\d+,(?P<m>\d+)\]<std(?:out|err)>:[ ]?)")
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
    ``[1,0]<stderr>:`` from mpirun, ``host: `` from pdsh)."""
    raw = [_STAMP.sub("", _ANSI.sub("", ln)) for ln in text.splitlines()]
    hosts = {m.group("h") for ln in raw if (m := _HOST_TAG.match(ln))}
    out = []
    for i, ln in enumerate(raw, 1):
        rank, host, stream = None, None, ""
        m = _TAG.match(ln)
        if m:
            rank = int(m.group("r") or m.group("m"))
            stream, ln = f"rank{rank}", ln[m.end():]
        else:
            for h in hosts:
                if ln.startswith(h + ": "):
                    host, stream, ln = h, f"host:{h}", ln[len(h) + 2:]
                    break
        out.append(LogLine(i, stream, rank, host, ln))
    return out


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
        if "Traceback (most recent call last)" not in lines[i].text:
            i += 1
            continue
        inside.add(i)
        frames: list[Frame] = []
        j = i + 1
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


# -------------------------------------------------------------------------------------- figures

_UNIT = {"byte": 1, "bytes": 1, "b": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
         "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
_SZ = r"(\d+(?:\.\d+)?)\s*(bytes?|[KMGT]i?B|B)\b"


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
                   re.findall(r"Process \d+ has " + _SZ + r" memory in use", text))
    two = "is allocated by PyTorch" in text
    if two and "reserved_bytes" not in vals and "allocated_bytes" in vals:
        vals["reserved_bytes"] = vals["allocated_bytes"] + vals.get("reserved_unallocated_bytes", 0)
    if not two and "reserved_bytes" in vals and "allocated_bytes" in vals:
        vals["reserved_unallocated_bytes"] = vals["reserved_bytes"] - vals["allocated_bytes"]
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
                r"|Unable to run \S*nvcc"), 3),
    (re.compile(r"Ninja is required to load C\+\+ extensions"), 3),
    (re.compile(r"ImportError: \S*(?P<op>cpu_adam|fused_adam|cpu_adagrad|cpu_lion|fused_lamb|transformer_inference)"
                r"\S*\.so"), 3),
    (re.compile(r"ninja: build stopped: subcommand failed"), 2),
    (re.compile(r"'DeepSpeed(?P<op>CPUAdam|CPUAdagrad|CPULion)' object has no attribute 'ds_opt_\w+'"), 1),
)
_BUILD_OP = re.compile(r"(?:Building extension module |Emitting ninja build file \S*/|extension directory \S*/)(\w+)")
_BUILD_CAUSE = re.compile(r"fatal error:|\berror:|nvcc fatal|unsupported GNU version|No such file or directory")
_HOST = (  # (pattern, strength)
    (re.compile(r"DefaultCPUAllocator: can't allocate memory|(?<![A-Za-z])MemoryError\b|_ArrayMemoryError"
                r"|\[Errno 12\] Cannot allocate memory"), 3),
    (re.compile(r"Out of memory: Kill(?:ed)? process|oom-kill|oom_reaper|invoked oom-killer"), 3),
    (re.compile(r"Signal 9 \(SIGKILL\)|Signals\.SIGKILL|exitcode\s*:\s*-9\b|exit(?:ed with)? code\s*[:=]?\s*(?:-9|137)\b"
                r"|return code\s*=\s*(?:-9|137)\b|exit status\s*(?:-9|137)\b|\bexitcode\s*[:=]\s*137\b"), 2),
    (re.compile(r"^\s*Killed\s*$|\d+ Killed\s+\S|^Killed\s+\S"), 2),
)
_EXIT = re.compile(r"(?:exitcode\s*:?|exit(?:ed with)? code\s*[:=]?|return code\s*=|exit status)\s*(-?\d+)"
                   r"|SIGKILL: (9)|Signal (9) \(SIGKILL\)")
_LAUNCHERS = ("torch/distributed/elastic/", "torch/distributed/run.py", "deepspeed/launcher/")
_ROOT_RANK = re.compile(r"\brank\s*:\s*(\d+)\s*\(local_rank")
_GPU_IDX = re.compile(r"\(GPU (\d+);|GPU (\d+) has a total capacity|cuda:(\d+)")


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


# ----------------------------------------------------------------------------------- frame rules

@dataclass(frozen=True, slots=True)
class _Rule:
    path: str
    """Substring of the frame's path (``/`` separators)."""
    functions: frozenset[str]
    """Function names it covers; empty: any function in that file."""
    phase: str | None
    """None: the frame only tells the family (e.g. ``deepspeed.initialize``)."""
    family: str | None
    what: str
    code: tuple[tuple[str, str, str], ...] = ()
    """(substring of the frame's source line, phase, what): checked before ``phase``."""
    zero3_phase: str | None = None
    """The phase under ZeRO-3, where the replay's seams put it elsewhere."""


def _r(path, funcs, phase, what, *, family=None, code=(), zero3=None) -> _Rule:
    fam = family if family is not None else (phase.split(".")[0] if phase else None)
    return _Rule(path, frozenset(funcs.split()) if funcs else frozenset(), phase, fam, what, tuple(code), zero3)


_ENG = "deepspeed/runtime/engine.py"
_S3 = "deepspeed/runtime/zero/stage3.py"
_S12 = "deepspeed/runtime/zero/stage_1_and_2.py"
_PP = "deepspeed/runtime/zero/partition_parameters.py"
_PO = "deepspeed/runtime/zero/parameter_offload.py"
_MOVE_WHAT = "DeepSpeed moves the whole model to the GPU (every rank holds all of it until ZeRO-3 partitions it)"
_CAST_WHAT = "DeepSpeed casts the parameters to fp16/bf16 where they sit"

# Outermost first is how tracebacks print; the phase is the innermost frame that names one within
# the family of the outermost frame that names a family (so ZeRO-3 partitioning inside a forward is
# the forward, and zero.Init partitioning inside from_pretrained is the load).
RULES: tuple[_Rule, ...] = (
    # load
    _r("transformers/modeling_utils.py", "from_pretrained _load_pretrained_model _load_state_dict_into_model "
       "load_state_dict _load_state_dict_into_meta_model load_shard_file _load_checkpoint", "load",
       "transformers from_pretrained builds the model and loads its weights (fp32 unless torch_dtype is given)"),
    _r("transformers/models/auto/auto_factory.py", "from_pretrained", "load",
       "transformers from_pretrained builds the model and loads its weights"),
    _r("transformers/integrations/deepspeed.py", "_load_state_dict_into_zero3_model", "load",
       "transformers loads weights into a model built under zero.Init"),
    _r("peft/mapping", "get_peft_model", "load", "PEFT wraps the model and creates the adapter weights"),
    _r("peft/peft_model.py", "__init__ from_pretrained", "load", "PEFT wraps the model and creates the adapter weights"),
    _r("safetensors/torch.py", "load_file load", "load", "safetensors reads a weights file into memory"),
    _r("torch/serialization.py", "load", "load", "torch.load reads a checkpoint into memory"),
    _r("torch/nn/modules/module.py", "to cuda", "load",
       "the script moves the whole model to the GPU itself (model.to/.cuda), before or without DeepSpeed"),
    # initialize: family only
    _r("deepspeed/__init__.py", "initialize", None, "deepspeed.initialize", family="initialize"),
    _r(_ENG, "__init__", None, "DeepSpeedEngine.__init__", family="initialize"),
    _r("transformers/integrations/deepspeed.py", "deepspeed_init", None, "the HF Trainer calls deepspeed.initialize",
       family="initialize"),
    _r("transformers/deepspeed.py", "deepspeed_init", None, "the HF Trainer calls deepspeed.initialize",
       family="initialize"),
    _r("accelerate/accelerator.py", "prepare _prepare_deepspeed", None, "accelerate calls deepspeed.initialize",
       family="initialize"),
    # initialize.cast / initialize.move
    _r(_ENG, "_configure_distributed_model", None, "DeepSpeedEngine._configure_distributed_model", family="initialize",
       code=((".half()", "initialize.cast", _CAST_WHAT + " (module.half(), DeepSpeed <= 0.6)"),
             (".bfloat16()", "initialize.cast", _CAST_WHAT + " (module.bfloat16())"),
             ("_cast_module_mixed_precision", "initialize.cast", _CAST_WHAT + " (one parameter at a time)"),
             (".to(self.device)", "initialize.move", _MOVE_WHAT),
             ("_broadcast_model", "initialize.move", "DeepSpeed broadcasts rank 0's weights to every rank (in place)"))),
    _r(_ENG, "_cast_module_mixed_precision", "initialize.cast", _CAST_WHAT + " (one parameter at a time)"),
    _r(_ENG, "_broadcast_model", "initialize.move", "DeepSpeed broadcasts rank 0's weights to every rank (in place)"),
    # initialize.partition (ZeRO-3 conversion) and the basic optimizer before it
    _r(_ENG, "_configure_optimizer _configure_basic_optimizer", "initialize.optimizer",
       "DeepSpeed creates the optimizer", zero3="initialize.partition"),
    _r("deepspeed/ops/adam/cpu_adam.py", "__init__", "initialize.optimizer",
       "DeepSpeedCPUAdam is created (it loads, or JIT-builds, the cpu_adam op)", zero3="initialize.partition"),
    _r(_ENG, "_configure_zero_optimizer _configure_fp16_optimizer _configure_bf16_optimizer", "initialize.optimizer",
       "DeepSpeed wraps the optimizer in its ZeRO/fp16 optimizer"),
    _r(_S3, "_convert_to_zero_parameters initialize_ds_offload", "initialize.partition",
       "ZeRO-3 converts and partitions every parameter"),
    _r(_S3, "__init__", "initialize.optimizer", "the ZeRO-3 optimizer allocates its buffers",
       code=(("_convert_to_zero_parameters", "initialize.partition", "ZeRO-3 converts and partitions every parameter"),
             ("initialize_ds_offload", "initialize.partition", "ZeRO-3 converts and partitions every parameter"))),
    _r(_PO, "__init__ _convert_to_zero_parameters mark_persistent_parameters", "initialize.partition",
       "ZeRO-3 converts and partitions every parameter (DeepSpeedZeRoOffload)"),
    _r(_PP, "_partition_param _partition partition _convert_to_zero_parameters _zero_init_param "
       "_convert_to_deepspeed_param _post_init_method __init__", "initialize.partition",
       "ZeRO-3 partitions each parameter: torch.empty(ceil(p/W)) on the offload device, pinned under "
       "offload_param.pin_memory"),
    _r(_S3, "_create_fp16_partitions_with_defragmentation "
       "_create_param_groups_fp16_flat_cpu_memory _move_to_flat_buffer _create_fp32_partitions "
       "initialize_optimizer_states _setup_for_real_optimizer create_reduce_and_remove_grad_hooks "
       "_create_fp16_sub_groups _configure_tensor_swapping", "initialize.optimizer",
       "the ZeRO-3 optimizer allocates its buffers (flat 16-bit partitions, fp32 master, gradients)"),
    _r(_S12, "__init__ initialize_optimizer_states flatten_dense_tensors_aligned", "initialize.optimizer",
       "the ZeRO-1/2 optimizer allocates its flat buffers and fp32 master"),
    _r("deepspeed/runtime/fp16/fused_optimizer.py", "__init__ initialize_optimizer_states", "initialize.optimizer",
       "the fp16 optimizer wrapper allocates its flat buffers and fp32 master"),
    _r("deepspeed/runtime/bf16_optimizer.py", "__init__", "initialize.optimizer",
       "the bf16 optimizer wrapper allocates its fp32 master"),
    _r("deepspeed/runtime/zero/utils.py", "defragment", "initialize.optimizer",
       "ZeRO-3 defragments the 16-bit partitions into one flat buffer"),
    # forward
    _r(_ENG, "forward", "forward", "the forward pass (DeepSpeedEngine.forward)"),
    _r(_PO, "_pre_forward_module_hook pre_sub_module_forward_function _post_forward_module_hook "
       "post_sub_module_forward_function", "forward", "ZeRO-3 gathers a submodule's parameters for its forward"),
    _r(_S3, "_pre_forward_module_hook pre_sub_module_forward_function _post_forward_module_hook "
       "post_sub_module_forward_function", "forward", "ZeRO-3 gathers a submodule's parameters for its forward"),
    _r("transformers/models/", "forward", "forward", "the model's forward pass (activations)"),
    _r("peft/", "forward", "forward", "the PEFT model's forward pass"),
    _r("transformers/trainer.py", "compute_loss", "forward", "the HF Trainer's forward pass (compute_loss)"),
    _r("transformers/trainer.py", "training_step", None, "", family=None,
       code=(("compute_loss", "forward", "the HF Trainer's forward pass (compute_loss)"),
             ("backward", "backward", "the HF Trainer's backward pass"))),
    # backward
    _r(_ENG, "backward _backward_epilogue", "backward", "the backward pass (DeepSpeedEngine.backward)"),
    _r(_S3, "backward backward_prologue backward_epilogue reduce_ready_partitions_and_remove_grads "
       "reduce_independent_p_g_buckets_and_remove_grads "
       "__reduce_and_partition_ipg_grads partition_grads independent_gradient_partition_epilogue "
       "_pre_backward_module_hook pre_sub_module_backward_function reduce_partition_and_remove_grads",
       "backward", "ZeRO-3 reduces and partitions gradients during backward"),
    _r(_PO, "_pre_backward_module_hook pre_sub_module_backward_function", "backward",
       "ZeRO-3 gathers a submodule's parameters for its backward"),
    _r(_S12, "backward reduce_ready_partitions_and_remove_grads reduce_independent_p_g_buckets_and_remove_grads "
       "average_tensor allreduce_bucket", "backward", "ZeRO-1/2 reduces gradients during backward"),
    _r("deepspeed/runtime/fp16/loss_scaler.py", "backward", "backward", "the backward pass (scaled loss)"),
    _r("torch/_tensor.py", "backward", "backward", "autograd runs the backward pass (loss.backward())"),
    _r("torch/autograd/", "backward _engine_run_backward", "backward", "autograd runs the backward pass"),
    _r("torch/utils/checkpoint.py", "backward", "backward",
       "gradient checkpointing recomputes a layer's forward during backward"),
    _r("accelerate/accelerator.py", "backward", "backward", "the backward pass (accelerator.backward)"),
    # optimizer step
    _r(_ENG, "step _take_model_step", "optimizer_step", "the optimizer step (DeepSpeedEngine.step)"),
    _r(_S3, "step _optimizer_step _prepare_fp32_grad_for_sub_group unscale_and_clip_grads _post_step "
       "_reassign_or_swap_out_partitioned_parameters", "optimizer_step", "the ZeRO-3 optimizer step"),
    _r(_S12, "step", "optimizer_step", "the ZeRO-1/2 optimizer step"),
    _r("deepspeed/ops/adam/", "step", "optimizer_step", "the Adam step (optimizer states are created at the first)"),
    _r("torch/optim/", "step _init_group", "optimizer_step", "the optimizer step (states are created at the first)"),
    _r("deepspeed/runtime/fp16/fused_optimizer.py", "step", "optimizer_step", "the fp16 optimizer step"),
    _r("transformers/trainer.py", "_inner_training_loop", None, "", family=None,
       code=(("deepspeed_init", "", "the HF Trainer calls deepspeed.initialize"),
             ("optimizer.step", "optimizer_step", "the HF Trainer's optimizer step"),
             ("_save_checkpoint", "save", "the HF Trainer saves a checkpoint"))),
    # save
    _r(_ENG, "save_16bit_model save_fp16_model _zero3_consolidated_16bit_state_dict "
       "_zero3_consolidated_fp16_state_dict save_checkpoint _save_checkpoint _save_zero_checkpoint", "save",
       "DeepSpeed saves the model (ZeRO-3 gathers the 16-bit weights module by module, rank 0 copies them to CPU)"),
    _r("transformers/trainer.py", "_save_checkpoint save_model _save", "save", "the HF Trainer saves the model"),
    _r("transformers/modeling_utils.py", "save_pretrained", "save", "save_pretrained writes the weights"),
    _r("torch/serialization.py", "save", "save", "torch.save writes a checkpoint"),
)


@dataclass(frozen=True, slots=True)
class _Match:
    index: int
    frame: Frame
    phase: str | None
    family: str | None
    what: str


def _match_frame(i: int, f: Frame, zero3: bool) -> _Match | None:
    path = f.path.replace("\\", "/")
    for rule in RULES:
        if rule.path not in path or (rule.functions and f.function not in rule.functions):
            continue
        for sub, phase, what in rule.code:
            if sub in f.code:
                return _Match(i, f, phase or None, phase.split(".")[0] if phase else "initialize", what)
        if rule.family is None:
            return None
        phase = rule.zero3_phase if (zero3 and rule.zero3_phase) else rule.phase
        return _Match(i, f, phase, rule.family, rule.what)
    return None


def _call(f: Frame) -> str:
    code = f.code if len(f.code) <= 90 else f.code[:87] + "..."
    return f"{f.function} -> {code}" if code else f.function


def locate_phase(frames: tuple[Frame, ...], *, zero3: bool = False) -> tuple[str | None, str, Frame | None]:
    """(phase, reason, frame) from a traceback's frames (outermost first), or (None, reason, None).

    The outermost frame that names a family (load, initialize, forward, backward, optimizer_step,
    save) sets the context; the phase is the innermost frame of that family that names a phase.
    ``zero3`` moves the basic optimizer's construction into ``initialize.partition``, as the replay's
    seams do for ZeRO-3 (memfit/replay/seams.py)."""
    matches = [m for i, f in enumerate(frames) if (m := _match_frame(i, f, zero3)) is not None]
    if not matches:
        return None, "no frame of the traceback belongs to a phase memfit knows", None
    family = matches[0].family
    same = [m for m in matches if m.family == family and m.phase]
    if not same:
        m = matches[-1]
        where = f"{m.frame.short_path}, line {m.frame.line}"
        return None, f"inside {m.what} ({where}); no frame narrows it to one phase", None
    best = same[-1]
    reason = f"{_call(best.frame)}: {best.what} ({best.frame.short_path}, line {best.frame.line})"
    inner = matches[-1]  # named when it adds something: DeepSpeed/transformers code, not torch's plumbing
    if inner is not best and inner.what != best.what and "/torch/" not in "/" + inner.frame.short_path:
        reason += f"; innermost: {_call(inner.frame)} ({inner.what})"
    return best.phase, reason, best.frame


# Progress lines: the phase that runs after each (DeepSpeed 0.5.10 and 0.19.8 print all of them).
PROGRESS: tuple[tuple[re.Pattern[str], str, str], ...] = (
    (re.compile(r"Loading checkpoint shards|loading weights file"), "load",
     "transformers is loading the weights"),
    (re.compile(r"DeepSpeed info: version="), "initialize.cast",
     "deepspeed.initialize has started (deepspeed/__init__.py: next the engine casts and moves the model)"),
    (re.compile(r"DeepSpeed Flops Profiler Enabled"), "initialize.partition",
     "the engine has cast and moved the model (engine.py, after _configure_distributed_model); next the optimizer "
     "and ZeRO partitioning"),
    (re.compile(r"Reduce bucket size \d+"), "initialize.partition",
     "the ZeRO optimizer has started (stage3.py/stage_1_and_2.py __init__)"),
    (re.compile(r"optimizer state initialized"), "initialize.optimizer",
     "the ZeRO optimizer has initialised its states (initialize_optimizer_states)"),
    (re.compile(r"DeepSpeed Final Optimizer = "), "forward", "deepspeed.initialize has finished"),
    (re.compile(r"\bstep=\d+, skipped=\d+"), "forward", "training steps are running"),
    (re.compile(r"Saving model (?:weights|checkpoint)"), "save", "the model is being saved"),
)


def _progress_phase(lines: list[LogLine], before: int) -> tuple[str, str, int] | None:
    last = None
    for ln in lines:
        if ln.no >= before:
            break
        for pat, phase, what in PROGRESS:
            m = pat.search(ln.text)
            if m:
                last = (phase, what, ln.no, ln.text[m.start():].strip())
    if last is None:
        return None
    phase, what, no, text = last
    short = text if len(text) <= 80 else text[:77] + "..."
    return phase, f"last progress line before the failure (line {no}: {short!r}): {what}", no


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
    m = re.search(r"you tried to allocate (\d+) bytes", window)
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


_MEMORY = (EventKind.GPU_OOM, EventKind.CUDA_ERROR_OOM, EventKind.PINNED_HOST_OOM, EventKind.HOST_OOM)


def primary_event(events: tuple[LogEvent, ...]) -> LogEvent | None:
    """The root cause (see ``Diagnosis.primary``)."""
    for pick in (lambda e: e.kind == EventKind.OP_BUILD_ERROR,
                 lambda e: e.kind in _MEMORY or (e.kind == EventKind.NCCL_ERROR and e.out_of_memory),
                 lambda e: True):
        found = [e for e in events if pick(e)]
        if found:
            return found[0]
    return None


# ------------------------------------------------------------------------------------ explaining

def _both(n: int) -> str:
    return f"{fmt_bytes(n)} ({n:,} B)"


def _device_of(ev: LogEvent) -> str:
    return "cpu" if ev.kind in (EventKind.PINNED_HOST_OOM, EventKind.HOST_OOM) else "gpu"


def _explain(ev: LogEvent, phase: str | None) -> tuple[list[str], list[str]]:
    """What the event usually means and the usual fixes (without a plan)."""
    say: list[str] = []
    fix: list[str] = []
    n = ev.numbers
    if ev.kind == EventKind.GPU_OOM:
        gpu = f"GPU {ev.gpu_index}" if ev.gpu_index is not None else "the GPU"
        if n and n.tried_to_allocate_bytes is not None:
            s = f"PyTorch's caching allocator asked for {_both(n.tried_to_allocate_bytes)} more on {gpu}"
            if n.free_bytes is not None:
                s += f", which had {_both(n.free_bytes)} free"
            if n.total_capacity_bytes is not None:
                s += f" of {_both(n.total_capacity_bytes)}"
            say.append(s + ".")
        if n and n.allocated_bytes is not None and n.reserved_bytes is not None:
            say.append(f"This process's allocator held {_both(n.reserved_bytes)}: {_both(n.allocated_bytes)} in live "
                       f"tensors and {_both(n.reserved_bytes - n.allocated_bytes)} cached but unused.")
        out = n.outside_allocator_bytes if n else None
        if out is not None:
            s = (f"Used outside this process's allocator (total - free - reserved): {_both(out)}: the CUDA context "
                 f"(a few hundred MiB), NCCL and cuBLAS workspaces")
            if n and None not in (n.process_in_use_bytes, n.total_capacity_bytes, n.free_bytes):
                others = n.total_capacity_bytes - n.free_bytes - n.process_in_use_bytes
                s += (f"; this process's non-PyTorch memory is {_both(n.process_in_use_bytes - n.reserved_bytes)}, "
                      + (f"other processes hold {_both(others)}" if others > max(3 * n.precision_bytes, 100 * 2**20)
                         else "no other process holds any (a CUDA context alone is over 100 MiB)"))
            else:
                s += ", and any other process on the same GPU"
            say.append(s + ".")
            if out > 2 * GiB:
                fix.append("Something else holds GPU memory: another rank mapped to the same GPU (launch with "
                           "`deepspeed` or `torchrun`, not `python`; check LOCAL_RANK and CUDA_VISIBLE_DEVICES), a "
                           "leftover process or a notebook kernel (nvidia-smi lists them).")
        if n and n.tried_to_allocate_bytes and n.total_capacity_bytes and \
                n.tried_to_allocate_bytes > n.total_capacity_bytes:
            say.append("The single request is larger than the whole GPU: no freeing helps; the tensor must shrink "
                       "(smaller micro-batch or sequence, or it must live elsewhere).")
        if n and n.reserved_unallocated_bytes is not None and n.tried_to_allocate_bytes is not None and \
                n.reserved_unallocated_bytes > max(n.tried_to_allocate_bytes, GiB // 2):
            fix.append("The allocator caches more than the request but in pieces too small (fragmentation): set "
                       "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (torch >= 2.1; max_split_size_mb before).")
    elif ev.kind == EventKind.CUDA_ERROR_OOM:
        say.append("A CUDA call outside PyTorch's caching allocator ran out of memory (cuBLAS/cuDNN workspaces, NCCL "
                   "buffers, a custom kernel, or a page-locked host allocation), so there are no figures. CUDA errors "
                   "are reported asynchronously: rerun with CUDA_LAUNCH_BLOCKING=1 to see the call that failed.")
    elif ev.kind == EventKind.PINNED_HOST_OOM:
        say.append("cudaHostAlloc failed: page-locked (pinned) host memory could not be allocated. This is host RAM "
                   "running out, not GPU memory, although CUDA reports it as 'CUDA error: out of memory' (the "
                   "CUDA caching host allocator behind tensor.pin_memory()).")
        say.append("Every rank on a node pins its own buffers, and pinned pages cannot be swapped, so the node's RAM "
                   "must hold all ranks' pinned memory plus everything pageable at once.")
        fix.append("Set \"pin_memory\": false under offload_param and offload_optimizer (slower host-device copies; "
                   "DeepSpeed 0.19.8 still pins its flat 16-bit buffer), or run fewer ranks per node.")
        fix.append("Leave more RAM to pin: load in fp16/bf16 (torch_dtype) and build under zero.Init (create "
                   "HfDeepSpeedConfig(ds_config) before from_pretrained), so no full fp32 copy per rank competes.")
    elif ev.kind == EventKind.HOST_OOM:
        if ev.exit_code is not None:
            say.append("The kernel's OOM killer ended the process (SIGKILL: exit code -9, 137 in a shell) when host "
                       "RAM ran out; a killed process prints no traceback (dmesg shows 'Out of memory: Killed process').")
        else:
            say.append("A host allocation failed: host RAM (or the container's memory limit) ran out.")
        if n and n.tried_to_allocate_bytes is not None:
            say.append(f"The failing request was {_both(n.tried_to_allocate_bytes)}.")
        say.append("Each rank is its own process with its own copy of whatever it loads: from_pretrained builds the "
                   "full model in every rank (fp32 unless told otherwise) before DeepSpeed partitions it.")
        fix.append("Load in fp16/bf16 (torch_dtype=...) with low_cpu_mem_usage=True, and build under zero.Init "
                   "(HfDeepSpeedConfig before from_pretrained) so each rank holds only its partition.")
        fix.append("Less pinned and pageable offload memory per node: pin_memory false, offload to NVMe, fewer ranks "
                   "per node; or add swap / RAM.")
    elif ev.kind == EventKind.NCCL_ERROR:
        if ev.out_of_memory:
            say.append("NCCL could not allocate its buffers on the GPU (Cuda failure 'out of memory'): the GPU was "
                       "full when a collective started (NCCL allocates outside PyTorch's allocator).")
            fix.append("Leave GPU headroom for NCCL (smaller reduce/allgather buckets, micro-batch), or set "
                       "NCCL_BUFFSIZE lower.")
        else:
            say.append("A collective failed. When one rank dies (out of memory, exception), the others usually "
                       "report an NCCL error or a watchdog timeout: look for the first failure of any rank.")
            if "SystemError" in ev.detail or "shm" in ev.detail or "shared memory" in ev.detail:
                fix.append("ncclSystemError with shared memory: in Docker give /dev/shm room (--shm-size=8g or "
                           "--ipc=host).")
            fix.append("Rerun with NCCL_DEBUG=INFO; for P2P/InfiniBand trouble try NCCL_P2P_DISABLE=1 or "
                       "NCCL_IB_DISABLE=1.")
    elif ev.kind == EventKind.OP_BUILD_ERROR:
        m = re.match(r"(\w+)(?:: (.*))?$", ev.detail)
        op, cause = (m.group(1), m.group(2) or "") if m else ("an op", ev.detail)
        say.append(f"DeepSpeed JIT-compiles its C++/CUDA ops the first time they are used; building {op} failed"
                   + (f" ({cause})" if cause else "") + ". Nothing was allocated yet: this is not a memory failure.")
        if op == "cpu_adam":
            say.append("cpu_adam is DeepSpeedCPUAdam, the optimizer ZeRO-Offload uses for offload_optimizer: cpu.")
        fix.append("Install a CUDA toolkit matching torch.version.cuda, set CUDA_HOME to it, install ninja, and check "
                   "with `ds_report`; or pre-build: DS_BUILD_CPU_ADAM=1 pip install deepspeed --no-cache-dir.")
    if ev.kind in _MEMORY or ev.out_of_memory:
        fix.extend(_PHASE_FIXES.get((_device_of(ev) == "cpu", phase), ()))
    return say, fix


_PHASE_FIXES: dict[tuple[bool, str | None], tuple[str, ...]] = {
    (False, "initialize.move"): (
        "deepspeed.initialize moves the whole model to every GPU (engine.py _configure_distributed_model: "
        "self.module.to(self.device)) unless it was built under deepspeed.zero.Init. Build it under zero.Init "
        "(with transformers: create HfDeepSpeedConfig(ds_config) before from_pretrained, or use the Trainer with "
        "--deepspeed) so each rank only ever holds its partition.",),
    (False, "initialize.cast"): (
        "The cast ran on the GPU, so the model was already there: do not call model.cuda()/.to('cuda') before "
        "deepspeed.initialize.",),
    (False, "initialize.partition"): (
        "ZeRO-3 partitions parameters on a GPU that is already full (the moved model is still cached): build under "
        "zero.Init so nothing is moved whole.",),
    (False, "initialize.optimizer"): (
        "Optimizer buffers on the GPU: offload_optimizer to cpu, a higher ZeRO stage, or smaller "
        "reduce_bucket_size / sub_group_size.",),
    (False, "forward"): (
        "Activations and gathered parameters: smaller micro-batch or sequence length, gradient checkpointing, "
        "smaller stage3_max_live_parameters / stage3_prefetch_bucket_size.",),
    (False, "backward"): (
        "Gradients, activation gradients and reduce buckets: gradient checkpointing, smaller micro-batch, smaller "
        "reduce_bucket_size.",),
    (False, "optimizer_step"): (
        "Optimizer states are created at the first step: offload_optimizer to cpu, a higher ZeRO stage, smaller "
        "sub_group_size.",),
    (False, "save"): (
        "Saving gathers the 16-bit weights: set stage3_gather_16bit_weights_on_model_save false and convert the "
        "checkpoint offline with zero_to_fp32.py.",),
    (True, "load"): (
        "The load is the host peak here: every rank's from_pretrained holds the whole model (fp32 by default).",),
    (True, "save"): (
        "Rank 0 copies the whole gathered 16-bit model to CPU to save it: save a ZeRO checkpoint instead and "
        "convert it offline.",),
}


# -------------------------------------------------------------------------------- reconciliation

_CONTEXT_KEY = "runtime.cuda_context"


def _node_bytes(items: tuple[LedgerItem, ...], ranks: int) -> int:
    return sum(it.bytes * (1 if it.rank0_only else ranks) for it in items)


def _tolerance(n: OomNumbers | None, ref: int) -> int:
    """What two figures may differ by and still agree: the printed rounding, or 2% of the larger."""
    return max(3 * (n.precision_bytes if n else 0), ref // 50)


def reconcile(ev: LogEvent, phase: str | None, plan: Plan, scenario: Scenario | None, *,
              from_progress: bool = False) -> Reconciliation:
    """The log's figures against the plan at the failing phase (or the plan's peak when the log
    gives no phase). ``from_progress``: the phase comes from a progress line, which only says the
    run had got that far, so the plan's peak from that phase on is shown too."""
    device = "gpu" if _device_of(ev) == "gpu" else "cpu"
    failures = plan.verdict.failures
    first = failures[0] if failures else None
    if phase is not None:
        basis = "where the log's last progress line places it (or later)" if from_progress else \
            "where the log places the failure"
        ph = plan.phase(phase)
    else:
        here = [f for f in failures if f.device == device]
        if here:
            ph, basis = plan.phase(here[0].phase), "the log gives no phase: the plan's first failure on this device"
        else:
            key = (lambda p: p.gpu_peak_bytes) if device == "gpu" else (lambda p: p.node_cpu_peak_bytes)
            ph, basis = max(plan.phases, key=key), "the log gives no phase: the plan's peak on this device"
    hw = scenario.hardware if scenario is not None else None
    ranks = ph.ranks_per_node
    lines: list[str] = []
    rows: list[ReconRow] = []
    n = ev.numbers
    if device == "gpu":
        items = tuple(sorted((it for it in ph.items if it.device == Device.GPU), key=lambda i: -i.bytes))
        tensors = sum(it.bytes for it in items if it.key != _CONTEXT_KEY)
        context = sum(it.bytes for it in items if it.key == _CONTEXT_KEY)
        cap = hw.gpu.total_bytes if hw else None
        rows.append(ReconRow(label="GPU total capacity", log_bytes=n.total_capacity_bytes if n else None,
                             plan_bytes=cap, note=f"scenario: {hw.gpu.name}" if hw else ""))
        if n and n.total_capacity_bytes and cap and \
                abs(n.total_capacity_bytes - cap) > max(cap // 33, 3 * n.precision_bytes):
            lines.append(f"The log's GPU has {fmt_bytes(n.total_capacity_bytes)}, the scenario's {hw.gpu.name} "
                         f"{fmt_bytes(cap)}: the log is from another card; plan again with --gpus matching it.")
        needed = None
        if n and n.allocated_bytes is not None and n.tried_to_allocate_bytes is not None:
            needed = n.allocated_bytes + n.tried_to_allocate_bytes
        rows.append(ReconRow(label="tensors: allocated + requested at the failure (log) / at the phase peak (plan)",
                             log_bytes=needed, plan_bytes=tensors,
                             note="per rank; the plan's peak is the most this phase should need"))
        out = n.outside_allocator_bytes if n else None
        rows.append(ReconRow(label="outside PyTorch's allocator: CUDA context, NCCL, other processes",
                             log_bytes=out, plan_bytes=context, note="plan: CUDA context estimate"))
        if n and n.free_bytes is not None:
            rows.append(ReconRow(label="free", log_bytes=n.free_bytes,
                                 plan_bytes=(cap - ph.gpu_peak_bytes) if cap else None,
                                 note="plan: left at the phase peak"))
        if needed is not None:
            tol = _tolerance(n, max(needed, tensors))
            if needed > tensors + tol:
                s = (f"The log's tensors ({fmt_bytes(needed)}) exceed the plan's for {ph.name} ({fmt_bytes(tensors)}) "
                     f"by {fmt_bytes(needed - tensors)}: the run holds GPU memory the scenario does not describe "
                     f"(a bigger model, batch or sequence, another dtype, tensors the script keeps on the GPU).")
                moved = sum(it.bytes for it in items if it.key == "move.params")
                if moved and abs(needed - 2 * moved) <= max(moved // 10, tol):
                    s += (f" It is about twice the plan's 16-bit model ({fmt_bytes(moved)}): the model was moved "
                          f"in fp32 (fp16/bf16 not enabled in the DeepSpeed config, or the cast skipped).")
                lines.append(s)
            elif needed + tol < tensors:
                lines.append(f"The failure came before the plan's peak for {ph.name}: the log's tensors "
                             f"({fmt_bytes(needed)}) are below the plan's {fmt_bytes(tensors)}, so the GPU had less "
                             f"room than the plan assumes.")
            else:
                lines.append(f"The log's tensors ({fmt_bytes(needed)}) match the plan's {ph.name} peak "
                             f"({fmt_bytes(tensors)}) within the printed rounding.")
        if out is not None and out > context + GiB:
            extra = out - context
            s = (f"{fmt_bytes(out)} of the GPU is used outside this process's allocator, {fmt_bytes(extra)} more than "
                 f"the plan's CUDA context estimate")
            peaks = {p.name: sum(i.bytes for i in p.items if i.device == Device.GPU) for p in plan.phases}
            like = [name for name, b in peaks.items() if b and abs(out - b) <= max(b // 10, GiB // 2)]
            if like:
                s += (f": about what one rank holds in {like[0]} ({fmt_bytes(peaks[like[0]])}), so another rank (or "
                      f"another copy of this job) is most likely using the same GPU")
            lines.append(s + ".")
    else:
        items = tuple(sorted((it for it in ph.items if it.device in (Device.CPU_PINNED, Device.CPU_PAGEABLE)),
                             key=lambda i: (i.device != Device.CPU_PINNED, -i.bytes)))
        pinned = tuple(it for it in items if it.device == Device.CPU_PINNED)
        ram = hw.cpu_ram_bytes if hw else None
        rows.append(ReconRow(label="pinned per rank", log_bytes=None, plan_bytes=ph.cpu_pinned_bytes))
        rows.append(ReconRow(label=f"pinned per node ({ranks} ranks)", log_bytes=None,
                             plan_bytes=_node_bytes(pinned, ranks)))
        rows.append(ReconRow(label="host memory per node (pinned + pageable)", log_bytes=None,
                             plan_bytes=ph.node_cpu_peak_bytes))
        rows.append(ReconRow(label="host RAM per node", log_bytes=None, plan_bytes=ram, note="scenario"))
        if n and n.tried_to_allocate_bytes is not None:
            rows.append(ReconRow(label="the failing request", log_bytes=n.tried_to_allocate_bytes, plan_bytes=None))
        if ram:
            left = ram - ph.node_cpu_peak_bytes
            if left < 0:
                lines.append(f"The plan has {ph.name} needing {fmt_bytes(ph.node_cpu_peak_bytes)} per node of "
                             f"{fmt_bytes(ram)} RAM: {fmt_bytes(-left)} short, as the log shows.")
            else:
                lines.append(f"The plan leaves {fmt_bytes(left)} of {fmt_bytes(ram)} free per node at the {ph.name} "
                             f"peak; the run had less: memory the scenario does not count (a copy of the weights "
                             f"the script still references, DataLoader workers, other jobs, page cache counted "
                             f"against a container's memory limit) or a node smaller than cpu_ram says.")
        if from_progress:
            later = plan.phases[[q.name for q in plan.phases].index(ph.name):]
            top = max(later, key=lambda p: p.node_cpu_peak_bytes)
            if top is not ph:
                lines.append(f"From {ph.name} on, the plan's host peak is {top.name}: "
                             f"{fmt_bytes(top.node_cpu_peak_bytes)} per node.")
        if ev.kind == EventKind.PINNED_HOST_OOM and pinned:
            lines.append(f"Pinned at the {ph.name} peak: {fmt_bytes(ph.cpu_pinned_bytes)} per rank, "
                         f"{fmt_bytes(_node_bytes(pinned, ranks))} per node (" +
                         ", ".join(f"{it.name} {fmt_bytes(it.bytes)}" for it in pinned) + ").")
    here = [f for f in failures if f.phase == ph.name and f.device == device]
    if here:
        verdict = "predicted"
        lines.insert(0, f"The plan predicts this failure: {ph.name} needs {fmt_bytes(here[0].needed_bytes)} of "
                        f"{fmt_bytes(here[0].available_bytes)} "
                        f"({'GPU per rank' if device == 'gpu' else 'host RAM per node'}).")
    elif failures:
        verdict = "predicted_elsewhere"
        lines.insert(0, f"The plan predicts a failure too, but first in {first.phase} on "
                        f"{'the GPU' if first.device == 'gpu' else 'host RAM' if first.device == 'cpu' else 'NVMe'} "
                        f"({fmt_bytes(first.needed_bytes)} of {fmt_bytes(first.available_bytes)}), not here.")
    else:
        verdict = "not_predicted"
        lines.insert(0, f"The plan does not predict this failure: it has every phase fitting, {ph.name} at "
                        + (f"{fmt_bytes(ph.gpu_peak_bytes)} per GPU" if device == "gpu"
                           else f"{fmt_bytes(ph.node_cpu_peak_bytes)} of host memory per node") + ".")
    return Reconciliation(scenario_name=plan.scenario_name, phase=ph.name, phase_basis=basis, device=device,
                          rows=tuple(rows), items=items, plan_verdict=verdict, plan_failure=first, lines=tuple(lines))


# -------------------------------------------------------------------------------------- diagnose

def _headline(ev: LogEvent, phase: str | None) -> str:
    who = f"rank {ev.rank}" if ev.rank is not None else (f"host {ev.host}" if ev.host else "")
    where = f" on GPU {ev.gpu_index}" if ev.gpu_index is not None and ev.kind == EventKind.GPU_OOM else ""
    s = TITLES[ev.kind] + where + (f" ({who})" if who else "")
    if ev.kind == EventKind.NCCL_ERROR and ev.out_of_memory:
        s += ": CUDA out of memory inside NCCL"
    return s + (f" in {phase}" if phase else "")


def _findings(ev: LogEvent, phase: str | None, rec: Reconciliation | None, parsed: ParsedLog,
              scenario: Scenario | None) -> list[Finding]:
    out = [Finding(id=f"log-{ev.kind.value.replace('_', '-')}", severity="error",
                   message=_headline(ev, phase) + f" (log line {ev.line}).")]
    n = ev.numbers
    if n and n.outside_allocator_bytes is not None and n.outside_allocator_bytes > 2 * GiB:
        out.append(Finding(id="log-gpu-shared", severity="warning",
                           message=f"{fmt_bytes(n.outside_allocator_bytes)} of the GPU was in use outside this "
                                   f"process's PyTorch allocator: another process or rank shares the GPU."))
    if n and n.reserved_unallocated_bytes and n.tried_to_allocate_bytes is not None and \
            n.reserved_unallocated_bytes > max(n.tried_to_allocate_bytes, GiB // 2):
        out.append(Finding(id="log-fragmentation", severity="info",
                           message=f"{fmt_bytes(n.reserved_unallocated_bytes)} was reserved but unallocated, more "
                                   f"than the request: fragmentation (expandable_segments helps)."))
    if rec is not None:
        if rec.plan_verdict == "not_predicted":
            out.append(Finding(id="plan-missed-failure", severity="warning",
                               message=f"The plan for {rec.scenario_name} has {rec.phase} fitting; the log failed "
                                       f"there. See the reconciliation for where they disagree."))
        elif rec.plan_verdict == "predicted":
            out.append(Finding(id="plan-predicted-failure", severity="info",
                               message=f"The plan predicts this failure in {rec.phase}."))
    if scenario is not None and parsed.deepspeed_version:
        major_minor = ".".join(parsed.deepspeed_version.split(".")[:2])
        if major_minor != scenario.ds_version:
            out.append(Finding(id="log-deepspeed-version", severity="info",
                               message=f"The log is from DeepSpeed {parsed.deepspeed_version}; the scenario models "
                                       f"{scenario.ds_version}.x (set deepspeed_version to match)."))
    if len(parsed.events) > 1:
        others = [e for e in parsed.events if e is not ev]
        kinds = sorted({e.kind.value for e in others})
        out.append(Finding(id="log-more-events", severity="info",
                           message=f"{len(others)} more event(s) in the log ({', '.join(kinds)}), "
                                   f"first at line {others[0].line}."))
    return out


def diagnose_log(text: str, plan: Plan | None = None, scenario: Scenario | None = None) -> Diagnosis:
    """Everything memfit can say about a log: the events, the failing phase and why, what it usually
    means, the usual fixes, and (with a plan) how the log's figures compare with the plan's."""
    parsed = parse_log(text)
    ev = primary_event(parsed.events)
    if ev is None:
        headline = "the log is empty" if not text.strip() else "no recognisable error in the log"
        return Diagnosis(events=(), primary=None, headline=headline, phase=None, phase_reason="", phase_source="none",
                         phase_frame=None, explanation=(), fixes=(), reconciliation=None, findings=(),
                         deepspeed_version=parsed.deepspeed_version, torch_version=parsed.torch_version)
    zero3 = parsed.zero3 or (scenario is not None and scenario.deepspeed.zero.stage == 3)
    phase, reason, frame = locate_phase(ev.frames, zero3=zero3)
    source = "traceback" if phase else "none"
    if phase is None:
        prog = _progress_phase(list(parsed.lines), ev.line)
        if prog is not None:
            phase, p_reason, _ = prog
            reason = p_reason if not ev.frames else f"{p_reason} ({reason})"
            source = "progress"
        elif not ev.frames:
            reason = "the log has no traceback for it and no progress line before it"
    say, fix = _explain(ev, phase)
    rec = None
    if plan is not None and (ev.kind in _MEMORY or (ev.kind == EventKind.NCCL_ERROR and ev.out_of_memory)):
        rec = reconcile(ev, phase, plan, scenario, from_progress=source == "progress")
    if plan is not None and ev.kind == EventKind.OP_BUILD_ERROR and scenario is not None:
        if scenario.deepspeed.zero.offload_optimizer.device == "cpu":
            say.append("The scenario offloads the optimizer to cpu, which is what needs DeepSpeedCPUAdam (cpu_adam).")
    return Diagnosis(events=parsed.events, primary=ev, headline=_headline(ev, phase), phase=phase, phase_reason=reason,
                     phase_source=source, phase_frame=frame, explanation=tuple(say), fixes=tuple(dict.fromkeys(fix)),
                     reconciliation=rec, findings=tuple(_findings(ev, phase, rec, parsed, scenario)),
                     deepspeed_version=parsed.deepspeed_version, torch_version=parsed.torch_version)

