"""GPU memory outside PyTorch's caching allocator, per software stack: the CUDA context and the kernel
images loaded into it, the cuBLAS/cuBLASLt and cuDNN workspaces, NCCL's buffers.

None of it was measured here (no GPU). Each figure is a published measurement on a named stack, or a
library's documented default, or, where neither exists for the stack asked about, an estimate that
says which reading it stands on and by how much it may be off (``NonPytorchGpu.off_by_bytes`` and the
``*_source`` strings). The stack is the scenario's: GPU architecture (``ARCH``), torch release and CUDA
version (``sc.runtime``), world size, nodes; ``CUDA_MODULE_LOADING`` when the run sets it.

CUDA context and kernel images (nvidia-smi or ``cudaMemGetInfo`` right after a tiny tensor, minus the
one segment the caching allocator reserved for it):

- Eager module loading (every kernel of torch's fat binary for this GPU loaded at context creation):
  torch <= 1.12, or CUDA < 11.7, or ``CUDA_MODULE_LOADING=EAGER``/``DEFAULT``. The kernel images grow
  with torch's kernel count, so the readings are per CUDA major of the wheel (torch 1.x: cu10x, cu11x):
  ``CONTEXT_EAGER``. A GPU without a reading of its own takes the nearest reading of the same wheel
  generation (the kernels are compiled per architecture from the same sources, so their images are of
  similar size), off by the spread of the readings of that generation.
- Lazy loading (``CUDA_MODULE_LOADING=LAZY``, which torch sets when unset since 1.13, pytorch#86509; needs
  CUDA >= 11.7): ``CONTEXT_LAZY``. Kernels loaded lazily later in training add more; no published figure
  isolates that growth, so it is not added (stated as a gap, not as a number).

BLAS and cuDNN workspaces:

- cuBLAS: ``CUBLAS_WORKSPACE_CONFIG`` default ":4096:2:16:8" = 2 x 4096 KiB + 8 x 16 KiB = 8,519,680 B,
  32 MiB on sm_90 (``aten/src/ATen/cuda/CublasHandlePool.cpp:parseChosenWorkspaceSize``), one per handle and
  stream. Since torch 1.13 it is allocated through the caching allocator at the first cuBLAS call
  (``getNewWorkspace``, the fix of pytorch#83461), so it shows in allocated and reserved; before,
  cuBLAS cudaMalloc'ed it itself, outside PyTorch.
- cuBLASLt (torch's ``addmm``/``Linear`` with bias, ``gemm_and_bias``): its own workspace of
  ``CUBLASLT_WORKSPACE_SIZE`` = 1024 KiB by default ("default size in KiB according to #73328",
  ``CUDABlas.cpp:_parseChosenWorkspaceSize``) through the caching allocator, until torch unified it with
  the cuBLAS workspace (``CublasHandlePool.cpp:getCUDABlasLtWorkspaceSize``: ``TORCH_CUBLASLT_UNIFIED_WORKSPACE``
  unset means unified; read at the stored 2025-26 source). The release that first unified it is taken as
  2.7 (``CUBLASLT_UNIFIED_SINCE``: estimated from when that code appears, not read off the release tag).
- cuDNN: used by convolutions and by the cuDNN backend of ``scaled_dot_product_attention`` when selected;
  the language models memfit plans have no convolution and memfit's attention is flash / memory-efficient
  / math. Nothing is booked; a run that forces the cuDNN attention backend is not modelled.

NCCL (world size > 1; one communicator per rank, the default process group DeepSpeed, DDP and FSDP use):

- One node of A100s over NVLink: 544 MB for a communicator of 2 ranks, 688 MB for more than 2, after
  a 4 MB all-reduce (NVIDIA/nccl#964, 4x A100 NVLink, PyTorch; ``NCCL_MEASURED``). NCCL's memory grows
  linearly with its channel count (NVIDIA/nccl#986, a NCCL maintainer: "The memory usage is linearly tied
  to the number of channels"), so other GPUs take the A100 reading per channel times their own channel
  count (``NCCL_CHANNELS``: as ``NCCL_DEBUG=INFO`` typically prints them; an estimate, off by half).
- H100/H200 over NVSwitch: NVLink SHARP (NVLS, NCCL >= 2.17, CUDA >= 12.1, on by default) binds 1 GiB
  more per GPU (NVIDIA/nccl-tests#216: "NVLS Bind mem ... size 1073741824" on 8x H100; NeMo and JAX
  toolbox set ``NCCL_NVLS_ENABLE=0`` to save it).
- Several nodes: the network transport's buffers on top. Reading: 2.05 GiB outside PyTorch per GPU on a
  48-GPU H800 ZeRO-3 run (hiyouga/LLaMA-Factory#7532; H800 has no NVLS, NVIDIA/nccl#892), less that
  stack's context and intra-node NCCL as modelled here, is the network part (``NCCL_NET_BYTES``); "beyond 2
  nodes it should no longer increase" (NVIDIA/nccl#986). Off by half.
"""

from __future__ import annotations


from memfit.core.lean_dataclass import dataclass
from memfit.core.alloc.versions import TorchVersion, version_key

MiB = 2**20
GiB = 2**30

ARCH = {"rtx3090": "sm_86", "a10g": "sm_86", "rtx4090": "sm_89", "l40s": "sm_89", "t4": "sm_75",
        "v100-16gb": "sm_70", "v100-32gb": "sm_70", "a100-40gb": "sm_80", "a100-80gb": "sm_80",
        "h100-80gb": "sm_90", "h200": "sm_90"}
"""GPU presets (``core/hardware.py``) -> compute capability."""
NVLINK = {"v100-16gb", "v100-32gb", "a100-40gb", "a100-80gb", "h100-80gb", "h200"}
"""Presets taken as SXM boards with NVLink between the GPUs of a node (the PCIe variants exist; a
node of those behaves like the PCIe cards, NCCL's channel count says which)."""
NVSWITCH_NVLS = {"h100-80gb", "h200"}
"""Presets taken as HGX boards with NVSwitch, where NCCL uses NVLS."""


@dataclass(frozen=True, slots=True)
class Reading:
    """A measured size and where it was read."""

    bytes: int
    source: str


def _r(mib: float, source: str) -> Reading:
    return Reading(round(mib * MiB), source)


CONTEXT_EAGER: dict[tuple[str, int], tuple[Reading, ...]] = {
    ("sm_61", 10): (_r(719, "pytorch#55277: GTX 1080, torch 1.8.2+cu101, torch.Tensor(1).cuda(): 721 MiB in "
                            "nvidia-smi, less one 2 MiB segment"),),
    ("sm_70", 10): (Reading(round(1008.1875 * MiB) - 2 * MiB, "pytorch#28394: Titan V, torch 1.3 (CUDA 10.1): "
                            "1,008.19 MiB used with 2 MiB cached"),),
    ("sm_75", 10): (_r(877, "pytorch#49877: RTX 2080 Ti, torch 1.6.0+cu101: 1,035 MiB with a 163,840,000-B tensor "
                            "(a 158 MiB segment)"),),
    ("sm_86", 11): (_r(999, "pytorch#54564: RTX 3090, CUDA 11.1: 1,001 MiB with one 2 MiB segment"),
                    _r(1486, "pytorch#49877: RTX 3090, torch 1.7.1+cu110: 1,644 MiB with a 158 MiB segment"),
                    _r(1685, "pytorch#55277: RTX 3090, torch 1.8.2+cu111: 1,687 MiB with one 2 MiB segment")),
    ("any", 11.7): (Reading(645_660_672, "pytorch#86509: torch 1.13, CUDA_MODULE_LOADING=DEFAULT: 666,632,192 B "
                                         "(cudaMemGetInfo) with one 20 MiB segment"),),
}
"""Eager contexts: (architecture, CUDA major of the wheel; 11.7: CUDA >= 11.7 with loading forced eager) ->
readings."""
CONTEXT_LAZY: dict[str, Reading] = {
    "sm_86": _r(256, "invoke-ai/InvokeAI#9413: 2x RTX 3090, torch 2.7.1+cu128: 256 MiB bare context"),
    "sm_89": _r(426, "unslothai/unsloth-zoo#1053: RTX 6000 Ada, torch 2.10.0+cu130: 426 MiB after mem_get_info"),
}
CONTEXT_LAZY_OTHER = Reading(400 * 10**6, "pytorch#109888 (a PyTorch maintainer): 'around 400MB if CUDA >= 11.7 "
                                          "... lazy module loading'")
LAZY_SPREAD = (266_076_160, 426 * MiB)
"""The lazy readings' range: pytorch#86509's 287,047,680 B less a 20 MiB segment (torch 1.13) to the
RTX 6000 Ada's 426 MiB (torch 2.10): an architecture without a reading is off by up to that much."""

NCCL_MEASURED = {2: 544 * MiB, 3: 688 * MiB}
"""NVIDIA/nccl#964 (4x A100 NVLink): a communicator of 2 ranks 544 MB, of more than 2 ranks 688 MB
(nvidia-smi's MB, i.e. MiB), keyed 2 and 3+."""
NCCL_MEASURED_CHANNELS = 24
"""The channels NCCL typically opens on A100 NVLink/NVSwitch (``Channel 00/24``): the reading per channel."""
NCCL_CHANNELS = {"sm_70": 12, "sm_80": 24, "sm_90": 32}
NCCL_CHANNELS_PCIE = 2
NVLS_BYTES = GiB
NCCL_NET_BYTES = 2.05 * GiB
"""Outside PyTorch per GPU on 48 H800s (LLaMA-Factory#7532); the network part is this less the context
and the intra-node NCCL memfit books for that stack (``non_pytorch_gpu``, sm_90, lazy, no NVLS)."""
NCCL_NET_PART = round(NCCL_NET_BYTES) - CONTEXT_LAZY_OTHER.bytes - round(NCCL_MEASURED[3] / NCCL_MEASURED_CHANNELS * 32)
"""LLaMA-Factory#7532's 2.05 GiB less the sm_90 lazy context (400 MB) and 8 H800s' intra-node NCCL
(32 channels x the A100 reading per channel): 839,321,736 B."""
NCCL_BUFFSIZE = 4 * MiB
"""``NCCL_BUFFSIZE`` default (NCCL env docs): the Simple protocol's buffer per channel and peer."""
CUBLAS_WORKSPACE = 4096 * 1024 * 2 + 16 * 1024 * 8
CUBLAS_WORKSPACE_SM90 = 4096 * 8 * 1024
CUBLASLT_WORKSPACE = 1024 * 1024
CUBLASLT_UNIFIED_SINCE = "2.7"


def cuda_at_least(cuda: str, major: int, minor: int) -> bool:
    parts = cuda.split(".")
    return (int(parts[0]), int(parts[1]) if len(parts) > 1 else 0) >= (major, minor)


@dataclass(frozen=True, slots=True, kw_only=True)
class NonPytorchGpu:
    """Per rank. ``outside_bytes`` never passes through the caching allocator."""

    arch: str
    context_bytes: int
    context_source: str
    nccl_bytes: int
    nccl_formula: str
    cublas_workspace_bytes: int
    """Every BLAS workspace the first matmul creates: cuBLAS's and, where separate, cuBLASLt's."""
    cublas_in_allocator: bool
    cublaslt_workspace_bytes: int = 0
    """Part of ``cublas_workspace_bytes``: cuBLASLt's own (0 where torch shares cuBLAS's)."""
    cudnn_bytes: int = 0
    context_off_by_bytes: int = 0
    """How far the context figure may be from this stack's (0: a reading of this very stack)."""
    nccl_off_by_bytes: int = 0
    notes: tuple[str, ...] = ()

    @property
    def outside_bytes(self) -> int:
        return self.context_bytes + self.nccl_bytes + (0 if self.cublas_in_allocator else self.cublas_workspace_bytes)

    @property
    def off_by_bytes(self) -> int:
        return self.context_off_by_bytes + self.nccl_off_by_bytes


def _eager_context(arch: str, cuda: str, forced: bool) -> tuple[int, str, int]:
    """(bytes, source, off by) of an eager context (see the module docstring)."""
    major = int(cuda.split(".")[0])
    if forced and cuda_at_least(cuda, 11, 7):
        (r,) = CONTEXT_EAGER[("any", 11.7)]
        return r.bytes, r.source, abs(1486 * MiB - r.bytes)  # the cu11x readings are that much higher
    gen = 10 if major < 11 else 11
    own = CONTEXT_EAGER.get((arch, gen))
    pool = [r for (a, g), rs in CONTEXT_EAGER.items() if g == gen and a != "any" for r in rs]
    if own:
        vals = sorted(r.bytes for r in own)
        mid = own[[r.bytes for r in own].index(vals[len(vals) // 2])]
        spread = max(abs(v - mid.bytes) for v in vals)
        extra = f" (median of {len(own)} readings: {', '.join(r.source for r in own)})" if len(own) > 1 else ""
        return mid.bytes, (mid.source if len(own) == 1 else f"{mid.bytes // MiB:,} MiB{extra}"), spread
    vals = sorted(r.bytes for r in pool)
    mid = vals[len(vals) // 2]
    near = next(r for r in pool if r.bytes == mid)
    spread = max(abs(v - mid) for v in vals)
    return mid, (f"an estimate: no reading for {arch} with CUDA {major}.x wheels; the median reading of that "
                 f"generation, {near.source}, off by up to {spread // MiB:,} MiB (its readings' spread)"), spread


def non_pytorch_gpu(gpu_name: str, *, torch: TorchVersion, cuda: str, world_size: int, nodes: int = 1,
                    module_loading: str | None = None) -> NonPytorchGpu:
    """The memory outside PyTorch of one rank on ``gpu_name`` (a preset) for this stack.
    ``module_loading``: ``CUDA_MODULE_LOADING`` as the run sets it (None: torch's default)."""
    arch = ARCH.get(gpu_name, "unknown")
    forced_eager = module_loading is not None and module_loading.upper() in ("EAGER", "DEFAULT")
    lazy = (not forced_eager and cuda_at_least(cuda, 11, 7)
            and (torch.lazy_module_loading or (module_loading or "").upper() == "LAZY"))
    notes: list[str] = []
    if lazy:
        r = CONTEXT_LAZY.get(arch)
        if r is not None:
            ctx, src, ctx_off = r.bytes, r.source, 0
        else:
            r = CONTEXT_LAZY_OTHER
            ctx, src = r.bytes, f"an estimate for {arch}: {r.source}"
            ctx_off = max(abs(v - r.bytes) for v in LAZY_SPREAD)
        notes.append("lazy loading: kernels first used during training load into the context later; no published "
                     "figure isolates that growth, so it is not added")
    else:
        ctx, src, ctx_off = _eager_context(arch, cuda, forced_eager)
    mode = "lazy" if lazy else "eager"
    src = f"{mode} module loading (torch {torch.name}, CUDA {cuda}); {src}"
    nccl, formula, nccl_off = _nccl(gpu_name, arch, torch, cuda, world_size, nodes)
    cublas = CUBLAS_WORKSPACE_SM90 if arch == "sm_90" else CUBLAS_WORKSPACE
    lt = 0 if version_key(torch.name) >= version_key(CUBLASLT_UNIFIED_SINCE) or not torch.at_least("1.13") \
        else CUBLASLT_WORKSPACE
    return NonPytorchGpu(arch=arch, context_bytes=ctx, context_source=src, nccl_bytes=nccl, nccl_formula=formula,
                         cublas_workspace_bytes=cublas + lt, cublas_in_allocator=torch.cublas_workspace_in_allocator,
                         cublaslt_workspace_bytes=lt, context_off_by_bytes=ctx_off, nccl_off_by_bytes=nccl_off,
                         notes=tuple(notes))


def _nccl(gpu_name: str, arch: str, torch: TorchVersion, cuda: str, world_size: int,
          nodes: int) -> tuple[int, str, int]:
    """(bytes, formula, off by) of NCCL's buffers per rank (see the module docstring)."""
    if world_size <= 1:
        return 0, "world size 1: no NCCL communicator", 0
    local = max(world_size // max(nodes, 1), 1)
    per_channel = NCCL_MEASURED[2 if local <= 2 else 3] / NCCL_MEASURED_CHANNELS
    nvlink = gpu_name in NVLINK
    ch = NCCL_CHANNELS.get(arch, NCCL_CHANNELS_PCIE) if nvlink else NCCL_CHANNELS_PCIE
    intra = round(per_channel * ch) if local > 1 or nodes == 1 else 0
    what = f"{2 if local <= 2 else '3+'} ranks on a node"
    if arch == "sm_80" and nvlink:
        formula = f"{intra // MiB:,} MiB: NVIDIA/nccl#964's reading for {what} on A100 NVLink"
        off = 0
    else:
        formula = (f"{ch} channels x {per_channel / MiB:.1f} MiB per channel (NVIDIA/nccl#964's A100 reading for {what} "
                   f"/ {NCCL_MEASURED_CHANNELS} channels; memory linear in channels, NVIDIA/nccl#986): an estimate, "
                   "off by half")
        off = intra // 2
    total = intra
    if gpu_name in NVSWITCH_NVLS and local > 1 and torch.at_least("2.1") and cuda_at_least(cuda, 12, 1):
        total += NVLS_BYTES
        formula += " + NVLS 1 GiB bound per GPU (NVIDIA/nccl-tests#216; 0 with NCCL_NVLS_ENABLE=0)"
    if nodes > 1:
        net = NCCL_NET_PART
        total += net
        off += net // 2
        formula += (f" + network transport {net // MiB:,} MiB (LLaMA-Factory#7532: 2.05 GiB outside PyTorch per GPU on "
                    "48 H800s, less that stack's context and intra-node NCCL; an estimate, off by half)")
    return total, formula, off


CONTEXT_KEY = "runtime.cuda_context"
CUBLAS_KEY = "runtime.cublas_workspace"


def _off(np: NonPytorchGpu) -> str:
    return f"; may be off by {np.off_by_bytes / GiB:.2f} GiB" if np.off_by_bytes else ""


def record_cuda_context(t, sc) -> None:  # noqa: ANN001 (Timeline, Scenario: avoids an import cycle)
    """The context and NCCL's buffers, created by ``deepspeed.initialize`` (``init_distributed`` and
    the first collective), outside the caching allocator."""
    from memfit.core.ledger_types import Device

    if t.accelerator != "cuda":
        return
    np = non_pytorch_for(sc)
    t.declare(CONTEXT_KEY, name="CUDA context and NCCL buffers (outside PyTorch's allocator)", device=Device.GPU,
              category="runtime", exact=False, outside_allocator=True,
              formula=f"context {np.context_bytes:,} B + NCCL {np.nccl_bytes:,} B ({np.nccl_formula}); GPU {np.arch}"
                      + _off(np) + "".join(f"; {n}" for n in np.notes),
              source=f"CUDA context: {np.context_source}; NCCL: {np.nccl_formula}")
    t.alloc(CONTEXT_KEY, np.context_bytes + np.nccl_bytes)


def record_cublas_workspace(t, sc) -> None:  # noqa: ANN001
    """cuBLAS's workspace (and cuBLASLt's, where separate), at the first cuBLAS call (the first forward's
    first matmul)."""
    from memfit.core.ledger_types import Device

    if t.accelerator != "cuda":
        return
    np = non_pytorch_for(sc)
    where = ("through the caching allocator (CublasHandlePool.cpp:getNewWorkspace, torch >= 1.13)"
             if np.cublas_in_allocator else "cudaMalloc'ed by cuBLAS itself (torch < 1.13), outside PyTorch")
    lt = (f" + cuBLASLt's {np.cublaslt_workspace_bytes:,} B (CUBLASLT_WORKSPACE_SIZE default 1024 KiB, "
          f"separate before torch {CUBLASLT_UNIFIED_SINCE}, an estimated boundary)" if np.cublaslt_workspace_bytes
          else "; cuBLASLt shares it (TORCH_CUBLASLT_UNIFIED_WORKSPACE)" if np.cublas_in_allocator else "")
    t.declare(CUBLAS_KEY, name="cuBLAS workspace", device=Device.GPU, category="runtime", exact=False,
              outside_allocator=not np.cublas_in_allocator,
              formula=f"CUBLAS_WORKSPACE_CONFIG default = {np.cublas_workspace_bytes - np.cublaslt_workspace_bytes:,} B, "
                      f"one per handle and stream{lt}; {where}; cuDNN: none (no convolution, no cuDNN attention)",
              source="aten/src/ATen/cuda/CublasHandlePool.cpp:parseChosenWorkspaceSize, getCUDABlasLtWorkspaceSize")
    t.alloc(CUBLAS_KEY, np.cublas_workspace_bytes - np.cublaslt_workspace_bytes)
    if np.cublaslt_workspace_bytes:
        t.alloc(CUBLAS_KEY, np.cublaslt_workspace_bytes)


def non_pytorch_for(sc) -> NonPytorchGpu:  # noqa: ANN001
    from memfit.core.alloc.versions import resolve_torch_version

    rt = sc.runtime
    tv = resolve_torch_version(rt.torch_version)
    return non_pytorch_gpu(sc.hardware.gpu.name, torch=tv, cuda=rt.cuda_version or tv.default_cuda,
                           world_size=sc.world_size, nodes=sc.hardware.nodes,
                           module_loading=getattr(rt, "cuda_module_loading", None))
