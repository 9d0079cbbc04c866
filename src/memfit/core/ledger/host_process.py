"""The training process in host memory, apart from tensors: what it imports and initializes.

Replaces the flat "about 2 GiB per process". Each part is an estimate (``exact=False``), not a
function of the DeepSpeed config alone; the CPU parts were measured on this project's machine by
``python -m memfit.replay.host_baseline`` (the figures and how they were made are in
host_process_measured.json next to this file), the CUDA-only parts come from published
measurements, cited below.

- ``host.python_torch``: the interpreter and ``import torch`` (the CPU build, measured: its CUDA
  build maps more, see ``host.cuda_runtime``);
- ``host.libraries``: transformers (with a model's modeling module) and peft, measured;
- ``host.deepspeed``: ``import deepspeed``, measured; ``host.cpu_adam``: DeepSpeed's cpu_adam op
  (a JIT-built .so) loaded by DeepSpeedCPUAdam when the optimizer is offloaded, measured;
- ``host.tokenizer``: a fast (``tokenizers``) BPE tokenizer of the model's vocabulary, measured at
  32,000 and 128,000 entries, linear in between;
- ``host.dataset``: an in-memory tokenized dataset of ``dataset_tokens`` tokens (Python lists, as
  ``datasets.map`` returns rows without a format), measured per token; nothing when not given;
- ``host.dataloader_workers``: each DataLoader worker is a forked process; it shares the trainer's
  pages until it writes them (copy-on-write), and iterating Python objects writes their reference
  counts: measured private bytes per worker, a constant plus a share per dataset token;
- ``host.cuda_runtime`` (CUDA only): the CUDA driver, runtime and libraries' host memory once the
  process queries the devices and creates its context: pytorch/pytorch#113326 (torch 2.2, CUDA
  11.8 with lazy module loading, RTX 3090) measured max RSS 2,056,600 kB with
  ``torch._C._cuda_getDeviceCount()`` (which ``torch.cuda.is_available()`` calls) and a CUDA
  tensor, against 322,040 kB after ``import torch``: 1,734,560 kB. Before lazy loading (CUDA <
  11.7, torch < 1.13; pytorch/pytorch#12873, torch 1.0) the context alone added 1,122 MiB and the
  first cuDNN convolution 594 MiB: the same order. One figure for both, an estimate;
- ``host.heap_kept`` (after a checkpoint read shard by shard into memory: ``low_cpu_mem_usage=False``
  or zero.Init): glibc maps large allocations and unmaps them on free, but its mmap threshold rises
  to each freed mapped block's size (at most 32 MiB), so a later shard's tensors below that come
  from the heap, which it returns only from the top. Measured (4 MiB to 64 MiB tensors, 4-8
  shards): 64 MiB tensors leave ~1 MB behind; of tensors <= 32 MiB the process kept 19-47% of all
  it freed. The ledger keeps the highest measured share of the freed tensors <= 32 MiB. (Current
  transformers reads safetensors through mmap with low_cpu_mem_usage: no state dict is freed.)

NCCL's host buffers (only with the shared-memory transport between ranks without P2P) and
``/dev/shm`` segments are not modelled.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

from memfit.core.ledger.timeline import Timeline
from memfit.core.ledger_types import Device

MEASURED_FILE = "host_process_measured.json"
CUDA_HOST_BYTES = (2_056_600 - 322_040) * 1024
"""pytorch/pytorch#113326: max RSS with the devices queried and a CUDA tensor, less after ``import
torch`` (torch 2.2, CUDA 11.8, lazy module loading)."""
CUDA_HOST_SOURCE = ("pytorch/pytorch#113326 (torch 2.2 + CUDA 11.8, lazy loading: max RSS 2,056,600 kB "
                    "after torch._C._cuda_getDeviceCount() and a CUDA tensor vs 322,040 kB after import); "
                    "#12873 (torch 1.0, eager loading: +1,122 MiB context, +594 MiB cuDNN)")
SCRIPT = "memfit/replay/host_baseline.py"


@lru_cache(maxsize=1)
def measured() -> dict:
    """The figures measured on this project's machine (see ``memfit.replay.host_baseline``)."""
    return json.loads(resources.files("memfit.core.ledger").joinpath(MEASURED_FILE).read_text(encoding="utf-8"))


@dataclass(frozen=True, slots=True)
class HostPart:
    key: str
    name: str
    bytes: int
    formula: str
    source: str


def _where() -> str:
    m = measured()
    v = m["versions"]
    return (f"measured by {SCRIPT} (torch {v['torch']}, transformers {v['transformers']}, deepspeed "
            f"{v['deepspeed']}, glibc {m['machine']['libc']})")


def _line(x0: float, y0: float, x1: float, y1: float, x: float) -> int:
    return round(y0 + (y1 - y0) * (x - x0) / (x1 - x0))


def load_parts(vocab_size: int, dataset_tokens: int = 0) -> list[HostPart]:
    """What the process holds before it builds the model: imports, tokenizer, dataset."""
    m = measured()
    rss = m["imports_rss"]
    tok = m["tokenizer_rss_delta"]
    (v0, b0), (v1, b1) = sorted((int(k), v) for k, v in tok.items())
    where = _where()
    parts = [
        HostPart("host.python_torch", "the Python interpreter and torch (CPU build)", rss["torch"],
                 f"RSS after import torch: {rss['torch']:,} B (python alone {rss['python']:,} B)", where),
        HostPart("host.libraries", "transformers (a model's modeling module) and peft",
                 rss["libraries"] - rss["torch"], f"RSS {rss['libraries']:,} - {rss['torch']:,} B", where),
        HostPart("host.deepspeed", "import deepspeed", rss["deepspeed"] - rss["libraries"],
                 f"RSS {rss['deepspeed']:,} - {rss['libraries']:,} B", where),
        HostPart("host.tokenizer", f"fast BPE tokenizer of {vocab_size:,} tokens",
                 max(_line(v0, b0, v1, b1, vocab_size), 0),
                 f"linear in the vocabulary between {v0:,} tokens ({b0:,} B) and {v1:,} ({b1:,} B)", where),
    ]
    if dataset_tokens:
        per = _dataset_bytes_per_token()
        parts.append(HostPart("host.dataset", f"in-memory tokenized dataset, {dataset_tokens:,} tokens",
                              round(dataset_tokens * per),
                              f"{dataset_tokens:,} tokens x {per:.1f} B (Python lists of ints)", where))
    return parts


def _workers_fit() -> tuple[float, float]:
    """Private bytes of one DataLoader worker: (constant, per dataset token), from two dataset sizes."""
    w = sorted(measured()["dataloader_workers"].values(), key=lambda r: r["samples"])
    (a, b) = w[0], w[-1]
    ta, tb = a["samples"] * a["seq_len"], b["samples"] * b["seq_len"]
    pa, pb = max(a["worker_private"]), max(b["worker_private"])
    slope = (pb - pa) / (tb - ta)
    return pa - slope * ta, slope


def _dataset_bytes_per_token() -> float:
    w = max(measured()["dataloader_workers"].values(), key=lambda r: r["samples"])
    return (w["trainer_rss_with_data"] - w["trainer_rss_before_data"]) / (w["samples"] * w["seq_len"])


def worker_part(workers: int, dataset_tokens: int = 0) -> HostPart | None:
    """The DataLoader's forked workers, counted with the rank that forks them."""
    if workers <= 0:
        return None
    base, per = _workers_fit()
    each = round(base + per * dataset_tokens)
    return HostPart("host.dataloader_workers", f"{workers} DataLoader worker process(es), forked",
                    workers * each,
                    f"{workers} x ({base:,.0f} B + {per:.1f} B x {dataset_tokens:,} dataset tokens) private per "
                    "worker (copy-on-write pages it wrote)", _where() + "; torch/utils/data/dataloader.py (fork)")


def cpu_adam_part() -> HostPart:
    rss = measured()["imports_rss"]
    return HostPart("host.cpu_adam", "DeepSpeed's cpu_adam op (DeepSpeedCPUAdam, optimizer offloaded)",
                    rss["cpu_adam"] - rss["deepspeed"], f"RSS {rss['cpu_adam']:,} - {rss['deepspeed']:,} B",
                    _where() + "; deepspeed/ops/adam/cpu_adam.py (CPUAdamBuilder().load())")


def cuda_part() -> HostPart:
    return HostPart("host.cuda_runtime", "CUDA driver, runtime and libraries in host memory (device query, context)",
                    CUDA_HOST_BYTES, f"{CUDA_HOST_BYTES:,} B (estimate from a published measurement)", CUDA_HOST_SOURCE)


MMAP_THRESHOLD_MAX = 32 * 2**20
"""glibc malloc.c ``DEFAULT_MMAP_THRESHOLD_MAX`` (64-bit): allocations above it are always mapped
and unmapped on free; below it, once the threshold has risen, they come from the heap."""


def heap_kept_fraction() -> tuple[float, str]:
    """The highest share of the freed tensors below the mmap threshold the measured loads kept."""
    rows = measured().get("heap_after_free", {})
    best, which = 0.0, ""
    for name, r in rows.items():
        small = sum(b for b in r["tensor_bytes"] if b <= MMAP_THRESHOLD_MAX)
        if small:
            f = max(r["kept"], 0) / small
            if f > best:
                best, which = f, name
    return best, which


def heap_kept_part(small_freed_bytes: int) -> HostPart | None:
    """What the process keeps of the checkpoint tensors (at most 32 MiB each) it freed while
    loading shard by shard: a measured share of them."""
    if small_freed_bytes <= 0:
        return None
    f, which = heap_kept_fraction()
    return HostPart("host.heap_kept", "freed checkpoint tensors glibc keeps in the heap", round(f * small_freed_bytes),
                    f"{f:.1%} (highest measured, {which}) of {small_freed_bytes:,} B of freed tensors <= 32 MiB",
                    _where() + "; glibc malloc.c (mmap threshold rising to DEFAULT_MMAP_THRESHOLD_MAX 32 MiB)")


def needs_cpu_adam(stage: int, offload_optimizer: str, optimizer_type: str) -> bool:
    """engine.py ``_configure_basic_optimizer``: Adam/AdamW with the optimizer offloaded (ZeRO >= 1)
    is DeepSpeedCPUAdam, which loads the cpu_adam op."""
    return stage >= 1 and offload_optimizer in ("cpu", "nvme") and optimizer_type in ("adam", "adamw")


def record(t: Timeline, parts: list[HostPart]) -> None:
    for p in parts:
        t.declare(p.key, name=p.name, device=Device.CPU_PAGEABLE, category="runtime", exact=False,
                  formula=p.formula, source=p.source)
        t.alloc(p.key, p.bytes)


def total(parts: list[HostPart | None]) -> int:
    return sum(p.bytes for p in parts if p is not None)
