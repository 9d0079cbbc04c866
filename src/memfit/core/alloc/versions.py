"""The torch versions memfit knows, and the allocator rules that changed between them.

Provenance, per rule (what was read for this table):
- torch 2.13.0 (the installed CPU wheel, git cf30153c): ``ATen/core/CachingHostAllocator.h``,
  ``c10/core/AllocatorConfig.h``, ``c10/cuda/CUDAAllocatorConfig.h``; the option names and their
  error strings in ``torch/lib/libc10.so``.
- pytorch/pytorch ``c10/cuda/CUDACachingAllocator.cpp`` @001074d2 (mid 2024, before
  ``max_non_split_rounding_mb``), ``aten/src/ATen/cuda/CachingHostAllocator.cpp`` @03258ab2 (late
  2025, has ``pinned_reserve_segment_size_mb``), ``aten/src/THC/THCCachingHostAllocator.cpp``
  @03c8b739 (the torch <= 1.10 host allocator), ``aten/src/ATen/cuda/CublasHandlePool.cpp``.
- Where a boundary comes from a pull request's date or an issue's measurement rather than from the
  release's own source, ``since_source`` says so; such boundaries are the best reading available
  here, not checked against the release tags (the pytorch repository could not be fetched whole).
"""

from __future__ import annotations


from memfit.core.lean_dataclass import dataclass
from memfit.errors import MemfitError


def version_key(name: str) -> tuple[int, int]:
    major, minor = name.split(".")
    return int(major), int(minor)


@dataclass(frozen=True, slots=True, kw_only=True)
class TorchVersion:
    """One torch release line (``2.13`` stands for 2.13.x)."""

    name: str
    default_cuda: str
    """CUDA of the wheel most users of that release ran on an Ampere-or-newer GPU (torch <= 1.12's PyPI
    default was cu102, which cannot run on sm_86; the cu113 wheel is what RTX 30xx users installed)."""
    pinned_power_of_two: bool
    """Pinned requests rounded up to ``PowerOf2Ceil`` (since 1.11: pytorch#95823 measures 1.10.1 exact and
    1.13.1 rounded; the reporter dates the change to 1.11)."""
    cublas_workspace_in_allocator: bool
    """cuBLAS's workspace comes from the caching allocator (``CublasHandlePool.cpp:getNewWorkspace``, the
    fix of pytorch#83461, Aug 2022 -> 1.13); before, cuBLAS cudaMalloc'ed its own (outside PyTorch)."""
    lazy_module_loading: bool
    """torch sets ``CUDA_MODULE_LOADING=LAZY`` when unset (pytorch#86509, 1.13): kernels are loaded into
    the CUDA context when first used (needs CUDA >= 11.7)."""
    rules_read: bool = True
    """False for releases after the one whose source was read: 2.13's rules are used, said out loud."""

    @property
    def key(self) -> tuple[int, int]:
        return version_key(self.name)

    def at_least(self, name: str) -> bool:
        return self.key >= version_key(name)


def _v(name: str, cuda: str, *, read: bool = True) -> TorchVersion:
    k = version_key(name)
    return TorchVersion(name=name, default_cuda=cuda, pinned_power_of_two=k >= (1, 11),
                        cublas_workspace_in_allocator=k >= (1, 13), lazy_module_loading=k >= (1, 13),
                        rules_read=read)


TORCH_VERSIONS: dict[str, TorchVersion] = {v.name: v for v in (
    _v("1.10", "11.3"), _v("1.11", "11.3"), _v("1.12", "11.6"), _v("1.13", "11.7"),
    _v("2.0", "11.8"), _v("2.1", "12.1"), _v("2.2", "12.1"), _v("2.3", "12.1"), _v("2.4", "12.1"),
    _v("2.5", "12.4"), _v("2.6", "12.4"), _v("2.7", "12.6"), _v("2.8", "12.8"), _v("2.9", "12.8"),
    _v("2.10", "12.8"), _v("2.11", "12.8"), _v("2.12", "12.8"), _v("2.13", "12.8"),
    _v("2.14", "12.8", read=False), _v("2.15", "12.8", read=False),
)}
DEFAULT_TORCH = "2.13"
"""The release whose headers and binaries were read (installed here), memfit's default."""


def resolve_torch_version(text: str | None) -> TorchVersion:
    """``'2.13'``, ``'2.13.0'``, ``'2.13.0+cu128'`` or ``'1.10.1'`` -> the release line; anything else
    is a one-line MemfitError listing what memfit knows."""
    if text is None:
        return TORCH_VERSIONS[DEFAULT_TORCH]
    raw = str(text).strip()
    base = raw.split("+", 1)[0]
    parts = base.split(".")
    if len(parts) >= 2 and all(p.isdigit() for p in parts[:3]):
        name = f"{int(parts[0])}.{int(parts[1])}"
        if name in TORCH_VERSIONS:
            return TORCH_VERSIONS[name]
    known = ", ".join(TORCH_VERSIONS)
    raise MemfitError(f"--torch-version: unknown torch version {raw!r}; memfit knows {known}")


@dataclass(frozen=True, slots=True, kw_only=True)
class ConfKey:
    """One ``PYTORCH_CUDA_ALLOC_CONF`` option."""

    name: str
    since: str
    since_source: str
    kind: str
    """``mb`` (whole MiB), ``fraction`` (0..1), ``bool`` (True/False), ``int``, ``divisions`` (a number or
    a ``[size:div,...,>:div]`` list), ``backend``."""
    affects_bytes: bool
    """False: it changes speed or error reporting, not the bytes held (memfit accepts it and says so)."""


CONF_KEYS: dict[str, ConfKey] = {k.name: k for k in (
    ConfKey(name="max_split_size_mb", since="1.10", kind="mb", affects_bytes=True,
            since_source="PYTORCH_CUDA_ALLOC_CONF's first option (torch 1.10 notes/cuda.rst); pytorch#44742"),
    ConfKey(name="garbage_collection_threshold", since="1.12", kind="fraction", affects_bytes=True,
            since_source="torch 1.12 notes/cuda.rst (added Mar 2022)"),
    ConfKey(name="roundup_power2_divisions", since="1.12", kind="divisions", affects_bytes=True,
            since_source="pytorch#74213 (Mar 2022); the per-interval list form pytorch#87290 (2.0)"),
    ConfKey(name="backend", since="2.0", kind="backend", affects_bytes=True,
            since_source="cudaMallocAsync backend (torch 2.0 notes/cuda.rst)"),
    ConfKey(name="expandable_segments", since="2.1", kind="bool", affects_bytes=True,
            since_source="pytorch#96995 (Apr 2023) -> 2.1; Note [Expandable Segments]"),
    ConfKey(name="release_lock_on_cudamalloc", since="2.2", kind="bool", affects_bytes=False,
            since_source="CUDAAllocatorConfig.h (read at 2.13); first release estimated from its PR date"),
    ConfKey(name="pinned_use_cuda_host_register", since="2.2", kind="bool", affects_bytes=False,
            since_source="pytorch#108488 (Sep 2023); locks the same rounded size (CachingHostAllocator.cpp)"),
    ConfKey(name="pinned_num_register_threads", since="2.2", kind="int", affects_bytes=False,
            since_source="pytorch#108488 (Sep 2023)"),
    ConfKey(name="pinned_use_background_threads", since="2.5", kind="bool", affects_bytes=False,
            since_source="AllocatorConfig.h (read at 2.13); first release estimated"),
    ConfKey(name="max_non_split_rounding_mb", since="2.6", kind="mb", affects_bytes=True,
            since_source="pytorch#136174 (Sep 2024, after the 2.5 branch cut)"),
    ConfKey(name="pinned_reserve_segment_size_mb", since="2.10", kind="mb", affects_bytes=True,
            since_source="pytorch#163780/#164501 (Sep-Oct 2025)"),
    ConfKey(name="per_process_memory_fraction", since="2.10", kind="fraction", affects_bytes=True,
            since_source="CUDAAllocatorConfig.h (read at 2.13); first release estimated"),
    ConfKey(name="graph_capture_record_stream_reuse", since="2.10", kind="bool", affects_bytes=False,
            since_source="CUDAAllocatorConfig.h (read at 2.13); first release estimated"),
    ConfKey(name="large_segment_size_mb", since="2.12", kind="mb", affects_bytes=True,
            since_source="AllocatorConfig.h (read at 2.13); first release estimated"),
    ConfKey(name="pinned_max_round_threshold_mb", since="2.12", kind="mb", affects_bytes=True,
            since_source="AllocatorConfig.h (read at 2.13); follows pytorch#171662 (Jan 2026)"),
    ConfKey(name="pinned_max_cached_size_mb", since="2.12", kind="mb", affects_bytes=True,
            since_source="AllocatorConfig.h (read at 2.13); follows pytorch#171662 (Jan 2026)"),
    ConfKey(name="pinned_free_catch_all", since="2.12", kind="bool", affects_bytes=False,
            since_source="CUDAAllocatorConfig.h (read at 2.13); first release estimated"),
    ConfKey(name="throw_on_cudamalloc_oom", since="2.12", kind="bool", affects_bytes=False,
            since_source="CUDAAllocatorConfig.h and torch/cuda/memory.py num_oom_rejections (read at 2.13)"),
)}

ALLOC_CONF_ENV = "PYTORCH_CUDA_ALLOC_CONF"
"""Read by every version; 2.9+ also reads ``PYTORCH_ALLOC_CONF`` (CUDAAllocatorConfig.h:133-150 reads
PYTORCH_CUDA_ALLOC_CONF first, then PYTORCH_ALLOC_CONF; pytorch#183387 shows 2.9.1 warning that the
former is deprecated)."""


def keys_for(version: TorchVersion) -> tuple[str, ...]:
    return tuple(k for k, c in CONF_KEYS.items() if version.at_least(c.since))
