"""The training process in host memory, apart from tensors: what it imports and initializes.

Replaces the flat "about 2 GiB per process". Each part is an estimate (``exact=False``), not a
function of the DeepSpeed config alone; the CPU parts were measured on this project's machine by
``python -m memfit.replay.host_baseline`` (the figures and how they were made are in
host_process_measured.json next to this file), the CUDA-only parts come from published
measurements, cited below.

- ``host.python_torch``: the interpreter and ``import torch`` (the CPU build, measured: its CUDA
  build maps more, see ``host.cuda_runtime``);
- ``host.libraries``: transformers (with a model's modeling module) and peft, measured, with what
  the modeling module imports on the measuring install (transformers' loss module imports scipy
  where it is installed, about 36 MiB: the figure includes it; a fresh virtualenv of memfit's
  dependencies has no scipy);
- ``host.deepspeed``: ``import deepspeed``, measured; ``host.cpu_adam``: DeepSpeed's cpu_adam op
  (a JIT-built .so) loaded by DeepSpeedCPUAdam when the optimizer is offloaded, measured;
- ``host.tokenizer``: a fast (``tokenizers``) BPE tokenizer of the model's vocabulary as
  ``from_pretrained`` loads it: tokenizer.json read by ``Tokenizer.from_file`` (transformers 4.x
  ``PreTrainedTokenizerFast.__init__``; 5.x for Unigram models and tokenizer classes without their
  own ``__init__``), measured at 32,000, 128,000 and 250,880 (BLOOM's) entries, linear between
  them. The JSON parse leaves 2.2-2.9 times what the same tokenizer built in memory holds
  (``tokenizer_rss_delta``: 9.9, 34.6 and 65.4 MB, where the line through the first two gives
  66.3 MB at 250,880: the vocabulary is linear, the loading path is the difference). Not measured:
  Unigram (T5/mT5's SentencePiece) models, and transformers 5.x's classes with their own
  ``__init__`` (the JSON read by Python, the model rebuilt from its vocabulary and merges);
- ``host.dataset``: a ``datasets`` dataset of ``dataset_tokens`` tokens (``datasets`` 5.2: Arrow, what
  ``map`` writes and ``load_from_disk`` memory-maps), read row by row as a DataLoader does: its file
  pages are resident once touched, measured at two sizes (linear fit), plus ``import datasets``
  (pyarrow); nothing when not given;
- ``host.dataloader_workers``: each DataLoader worker is a forked process; it shares the trainer's
  pages until it writes them (copy-on-write): measured private bytes per worker iterating the Arrow
  dataset (its mapped file is shared, not copied: a constant and almost nothing per token);
- ``host.from_pretrained``: what ``from_pretrained`` leaves in the process once the weights have left
  host memory (``model.to(device)``): the loading code it imports, the module tree, what the
  allocator keeps (the model's code is imported before the first reading: ``host.libraries``
  holds it). Measured on a Llama-3-8B-shaped bf16 checkpoint (2 layers) loaded the ways the
  releases load it: safetensors into a meta-device model (transformers 5.24), and ``torch.load`` of
  one .bin or of 1 GB shards next to a random model (<= 4.50's ``low_cpu_mem_usage=False``): the
  highest of the three. (A same-dtype safetensors load leaves the weights memory-mapped: file pages
  the kernel can drop, resident only as they are read.)
- ``host.cuda_runtime`` (CUDA only): torch's CUDA build and the CUDA driver, runtime and libraries'
  host memory once the process queries the devices and creates its context: pytorch/pytorch#113326
  (torch 2.2, CUDA 11.8 with lazy module loading, RTX 3090) measured max RSS 2,056,600 kB for the
  whole process with ``torch._C._cuda_getDeviceCount()`` (which ``torch.cuda.is_available()`` calls)
  and a CUDA tensor (322,040 kB after the CUDA build's ``import torch`` alone, where this machine's
  CPU build takes ``imports_rss["torch"]``); the part is that total less the CPU-build import memfit
  books as ``host.python_torch``. Before lazy loading (CUDA < 11.7, torch < 1.13;
  pytorch/pytorch#12873, torch 1.0) the context alone added 1,122 MiB and the first cuDNN convolution
  594 MiB; pytorch#106511 saw +1,203.5 MiB at the first CUDA use: the same order. One figure for
  eager and lazy loading, an estimate. Where lazy loading starts: CUDA 11.7 introduced it, off by
  default, 12.2 made it the default on Linux (NVIDIA CUDA Programming Guide, "Lazy Loading", change
  history); torch 1.13 turns it on itself (pytorch/pytorch#86509, "[1.13] Sets CUDA_MODULE_LOADING
  to LAZY when not set by the user": ``aten/src/ATen/cuda/detail/CUDAHooks.cpp`` ``initCUDA`` calls
  ``maybe_set_cuda_module_loading("LAZY")``; its device-memory figures 287,047,680 B lazy vs
  666,632,192 B eager for one CUDA tensor), effective with a CUDA >= 11.7 build (1.13's default
  cu117 wheel). So torch >= 1.13 runs are lazy like #113326; torch < 1.13 (or a cu116 build) loads
  every module eagerly, for which no published host figure of those releases' libraries was found
  (#12873's is torch 1.0's, smaller libraries; pytorch#87539, torch 1.12+cu102, says only "~2GB" at
  the first ``.to("cuda")``): not a separate figure. Not in the figure either, for want of a
  published host measurement: what a training step loads beyond one tensor (cuBLAS/cuBLASLt
  handles and the GEMM kernels, the caching allocator's host side, autocast);
- ``host.heap_kept`` (after a checkpoint read shard by shard into memory: ``low_cpu_mem_usage=False``
  or zero.Init): glibc maps large allocations and unmaps them on free, but its mmap threshold rises
  to each freed mapped block's size (at most 32 MiB), so a later shard's tensors below that come
  from the heap, which it returns only from the top. Synthetic patterns (4 MiB to 64 MiB tensors,
  4-8 shards, ``heap_after_free``) kept 19-47% of the tensors <= 32 MiB they freed; the loading
  paths themselves (``from_pretrained_kept``: ``torch.load`` of 1 GB shards, 8 MiB k/v projections
  freed after the threshold rose) kept nothing beyond what the safetensors path, which frees no
  state dict, keeps. The ledger takes the loading paths' share (today 0: no item) and books their
  common residue as ``host.from_pretrained``.

NCCL's host buffers (only with the shared-memory transport between ranks without P2P) and
``/dev/shm`` segments are not modelled.
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources

from memfit.core.lean_dataclass import dataclass
from memfit.core.ledger.timeline import Timeline
from memfit.core.ledger_types import Device

MEASURED_FILE = "host_process_measured.json"
CUDA_PROCESS_RSS = 2_056_600 * 1024
"""pytorch/pytorch#113326: max RSS of ``import torch`` (the CUDA build), the device query and one CUDA
tensor (torch 2.2, CUDA 11.8, lazy module loading, RTX 3090): the whole process."""
CUDA_BUILD_IMPORT_RSS = 322_040 * 1024
"""The same issue: max RSS after ``import torch`` alone, the CUDA build (this machine's CPU build
imports in ``imports_rss["torch"]``: the CUDA build maps and touches more of its libraries)."""
CUDA_HOST_SOURCE = ("pytorch/pytorch#113326 (torch 2.2 + CUDA 11.8, lazy loading: max RSS 2,056,600 kB after "
                    "import, torch._C._cuda_getDeviceCount() and a CUDA tensor; 322,040 kB after the CUDA build's "
                    "import alone), less this machine's CPU-build import (booked as host.python_torch); "
                    "pytorch#106511 (+1,203.5 MiB at the first CUDA use, through an NCCL barrier) and #12873 "
                    "(torch 1.0, eager loading: +1,122 MiB at the context, +594 MiB at the first cuDNN call) "
                    "are of the same order")
SCRIPT = "memfit/replay/host_baseline.py"


@lru_cache(maxsize=1)
def measured() -> dict:
    """The figures measured on this project's machine (see ``memfit.replay.host_baseline``)."""
    return json.loads(resources.files("memfit.core.ledger").joinpath(MEASURED_FILE).read_text(encoding="utf-8"))


@dataclass(frozen=True, slots=True)
class HostPart:
    """One part of a process's host memory (a ledger line: key, name, bytes)."""

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


def _segment(points: dict[str, int], x: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """The two measured points (size, bytes) whose line gives ``x``: the pair around it, else the
    nearest end pair (a straight extrapolation)."""
    pts = sorted((int(k), v) for k, v in points.items())
    i = next((i for i in range(1, len(pts) - 1) if x <= pts[i][0]), len(pts) - 1)
    return pts[i - 1], pts[i]


def load_parts(vocab_size: int, dataset_tokens: int = 0) -> list[HostPart]:
    """What the process holds before it builds the model: imports, tokenizer, dataset."""
    m = measured()
    rss = m["imports_rss"]
    (v0, b0), (v1, b1) = _segment(m["tokenizer_file_rss_delta"], vocab_size)
    where = _where()
    parts = [
        HostPart("host.python_torch", "the Python interpreter and torch (CPU build)", rss["torch"],
                 f"RSS after import torch: {rss['torch']:,} B (python alone {rss['python']:,} B)", where),
        HostPart("host.libraries", "transformers (a model's modeling module) and peft",
                 rss["libraries"] - rss["torch"], f"RSS {rss['libraries']:,} - {rss['torch']:,} B", where),
        HostPart("host.deepspeed", "import deepspeed", rss["deepspeed"] - rss["libraries"],
                 f"RSS {rss['deepspeed']:,} - {rss['libraries']:,} B", where),
        HostPart("host.tokenizer", f"fast BPE tokenizer of {vocab_size:,} tokens (tokenizer.json read)",
                 max(_line(v0, b0, v1, b1, vocab_size), 0),
                 f"RSS after Tokenizer.from_file, linear in the vocabulary between {v0:,} tokens ({b0:,} B) and "
                 f"{v1:,} ({b1:,} B) (an estimate)", where + "; transformers tokenization_utils_fast.py "
                 "(TokenizerFast.from_file)"),
    ]
    if dataset_tokens:
        base, per, imp = _dataset_fit()
        parts.append(HostPart("host.dataset", f"datasets dataset of {dataset_tokens:,} tokens (Arrow, memory-mapped, "
                              "read)", round(imp + base + per * dataset_tokens),
                              f"import datasets {imp:,} B + {base:,.0f} B + {per:.2f} B x {dataset_tokens:,} tokens "
                              "(mapped pages touched)", where + "; datasets 5.2 load_from_disk"))
    return parts


def _dataset_fit() -> tuple[float, float, int]:
    """(constant, bytes per token, import) of an Arrow dataset read row by row, from two sizes."""
    d = measured()["datasets"]
    rows = sorted(d["mapped"].values(), key=lambda r: r["tokens"])
    a, b = rows[0], rows[-1]
    per = (b["touched"] - a["touched"]) / (b["tokens"] - a["tokens"])
    return a["touched"] - per * a["tokens"], per, d["import_delta"]


def _workers_fit() -> tuple[float, float]:
    """Private bytes of one DataLoader worker iterating an Arrow dataset: (constant, per dataset
    token), from two dataset sizes."""
    rows = sorted(measured()["datasets"]["mapped"].values(), key=lambda r: r["tokens"])
    a, b = rows[0], rows[-1]
    pa, pb = max(a["workers"]["private"]), max(b["workers"]["private"])
    slope = max((pb - pa) / (b["tokens"] - a["tokens"]), 0.0)
    return pa - slope * a["tokens"], slope


def worker_part(workers: int, dataset_tokens: int = 0) -> HostPart | None:
    """The DataLoader's forked workers, counted with the rank that forks them."""
    if workers <= 0:
        return None
    base, per = _workers_fit()
    each = round(base + per * dataset_tokens)
    return HostPart("host.dataloader_workers", f"{workers} DataLoader worker process(es), forked",
                    workers * each,
                    f"{workers} x ({base:,.0f} B + {per:.3f} B x {dataset_tokens:,} dataset tokens) private per "
                    "worker (copy-on-write pages it wrote; the Arrow file is shared)",
                    _where() + "; torch/utils/data/dataloader.py (fork)")


def cpu_adam_part() -> HostPart:
    rss = measured()["imports_rss"]
    return HostPart("host.cpu_adam", "DeepSpeed's cpu_adam op (DeepSpeedCPUAdam, optimizer offloaded)",
                    rss["cpu_adam"] - rss["deepspeed"], f"RSS {rss['cpu_adam']:,} - {rss['deepspeed']:,} B",
                    _where() + "; deepspeed/ops/adam/cpu_adam.py (CPUAdamBuilder().load())")


def cuda_part() -> HostPart:
    """What a CUDA process holds beyond this machine's CPU-build ``import torch``: the CUDA build's
    larger import (libtorch_cuda, cuBLAS, cuDNN, NCCL mapped), the driver and runtime once the devices
    are queried and the context exists (``host.cuda_runtime``)."""
    cpu_import = measured()["imports_rss"]["torch"]
    n = CUDA_PROCESS_RSS - cpu_import
    return HostPart("host.cuda_runtime", "torch's CUDA build, the CUDA driver, runtime and libraries in host memory "
                    "(device query, context)", n,
                    f"{CUDA_PROCESS_RSS:,} B (published) - {cpu_import:,} B (CPU-build import, measured) = {n:,} B "
                    "(an estimate)", CUDA_HOST_SOURCE)


MMAP_THRESHOLD_MAX = 32 * 2**20
"""glibc malloc.c ``DEFAULT_MMAP_THRESHOLD_MAX`` (64-bit): allocations above it are always mapped
and unmapped on free; below it, once the threshold has risen, they come from the heap."""


def heap_kept_fraction() -> tuple[float, str]:
    """The share of the freed checkpoint tensors below the mmap threshold that the measured loading
    paths keep beyond what the safetensors path (which frees no state dict) keeps."""
    from memfit.core.checkpoint import split_shards

    rows = measured()["from_pretrained_kept"]
    base = rows["safetensors"]["after_free"] - rows["safetensors"]["before"]
    best, which = 0.0, "from_pretrained_kept: the torch.load paths keep no more than safetensors"
    for name in ("torch_load", "torch_load_sharded"):
        r = rows[name]
        sizes = r["tensor_bytes"]
        shards = split_shards([(str(i), b) for i, b in enumerate(sizes)], 10**9) if r["files"] > 1 else [list(enumerate(sizes))]
        small = sum(b for sh in shards[1:] for _, b in sh if b < MMAP_THRESHOLD_MAX)
        extra = (r["after_free"] - r["before"]) - base
        if small and extra > 0 and extra / small > best:
            best, which = extra / small, f"from_pretrained_kept.{name}"
    return best, which


def from_pretrained_part() -> HostPart:
    """``host.from_pretrained``: what the process keeps of a checkpoint load (see the module docstring)."""
    rows = measured()["from_pretrained_kept"]
    name, r = max(rows.items(), key=lambda kv: kv[1]["after_free"] - kv[1]["before"])
    n = r["after_free"] - r["before"]
    return HostPart("host.from_pretrained", "what from_pretrained leaves in the process (its code, the module tree)",
                    n, f"RSS after the weights left host memory - before loading: {n:,} B (highest of safetensors, "
                    f"torch.load, torch.load sharded: {name}; {r['config']})",
                    _where() + "; transformers modeling_utils.py:from_pretrained")


def heap_kept_part(small_freed_bytes: int) -> HostPart | None:
    """What the process keeps of the checkpoint tensors (below 32 MiB each) it freed while loading
    shard by shard: the measured share of them (None when it is 0)."""
    f, which = heap_kept_fraction()
    if small_freed_bytes <= 0 or f <= 0:
        return None
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


def _pinned_batch_shape(sc) -> tuple[int, int]:  # noqa: ANN001
    """(bytes of one batch tensor, batches pinned at once)."""
    tr = sc.train
    return tr.micro_batch * tr.seq_len * 8, (2 if tr.dataloader_workers == 0 else 2 * tr.dataloader_workers + 1)


def pinned_batches_bytes(sc) -> int:  # noqa: ANN001
    """The bytes ``record_pinned_batches`` asks for (0 without pin_memory or off CUDA)."""
    if not sc.train.dataloader_pin_memory or sc.accelerator != "cuda":
        return 0
    n, batches = _pinned_batch_shape(sc)
    return n * batches * len(BATCH_TENSORS)


PINNED_BATCHES = "host.pinned_batches"
BATCH_TENSORS = ("input_ids", "attention_mask", "labels")
"""What transformers' collators hand the Trainer (``DataCollatorForLanguageModeling``,
``default_data_collator``): int64 tensors of micro-batch x sequence length."""


def record_pinned_batches(t: Timeline, sc) -> None:  # noqa: ANN001 (Scenario)
    """``DataLoader(pin_memory=True)``: each batch's tensors copied to page-locked memory
    (``torch/utils/data/_utils/pin_memory.py:pin_memory``, ``tensor.pin_memory()``: torch's pinned
    allocator, power-of-two blocks since 1.11). Batches pinned at once: without workers the main
    thread pins the next batch while the current one is still bound (2; ``dataloader.py:
    _SingleProcessDataLoaderIter._next_data``); with workers the pin-memory thread pins what they
    prefetch (``prefetch_factor`` 2 per worker) and the loop holds one more."""
    tr = sc.train
    if not tr.dataloader_pin_memory or t.accelerator != "cuda":
        return
    n, batches = _pinned_batch_shape(sc)
    t.declare(PINNED_BATCHES, name=f"DataLoader batches in page-locked memory ({batches} at once)",
              device=Device.CPU_PINNED, category="runtime", exact=False,
              formula=f"{batches} batches x {len(BATCH_TENSORS)} int64 tensors ({', '.join(BATCH_TENSORS)}) x "
                      f"{tr.micro_batch} x {tr.seq_len} x 8 B",
              source="torch/utils/data/_utils/pin_memory.py:pin_memory; dataloader.py (pin_memory_thread, "
                     "prefetch_factor 2)")
    for _ in range(batches * len(BATCH_TENSORS)):
        t.alloc(PINNED_BATCHES, n)
