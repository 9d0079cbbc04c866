"""GPU memory outside PyTorch's caching allocator: the CUDA context, NCCL's buffers, cuBLAS's workspace.

None of it is a function of the training config alone, and none of it was measured here (no GPU):
each figure is an estimate (``exact=False``) from a published measurement or a library default, per
GPU architecture, torch/CUDA version and world size, with its source.

- CUDA context. Since torch 1.13 with CUDA >= 11.7, torch sets ``CUDA_MODULE_LOADING=LAZY``
  (pytorch#86509) and kernels are loaded when first used; before, every kernel of every library was
  loaded at context creation. Measurements (nvidia-smi / mem_get_info, minus the allocator's segments):
  lazy: sm_86 (RTX 3090) 256 MiB (invoke-ai/InvokeAI#9413, torch 2.7.1+cu128, bare context);
  sm_89 (RTX 6000 Ada) 426 MiB (unslothai/unsloth-zoo#1053, torch 2.10.0+cu130); other architectures
  "around 400 MB" (pytorch#109888, a PyTorch maintainer). Eager: sm_86 999 MiB (pytorch#54564: RTX
  3090, CUDA 11.1, 1,001 MiB in nvidia-smi with one 2 MiB segment); other architectures 645,660,672 B
  (pytorch#86509: 666,632,192 B used with one 20 MiB segment, CUDA_MODULE_LOADING=DEFAULT).
  Kernels loaded lazily during training add more (not modelled: no published figure).
- NCCL (world size > 1): one communicator; per channel, the ring's receive buffers from its two
  neighbours of ``NCCL_BUFFSIZE`` = 4 MiB each (NCCL env docs, NCCL_BUFFSIZE default 4194304).
  Channels follow the topology; the counts used are those NCCL_DEBUG=INFO typically prints
  ("Channel 00/N"): 2 on PCIe cards, 12 on V100 NVLink, 24 on A100 NVSwitch, 32 on H100/H200.
  An estimate: LL/LL128 buffers, tree channels and DeepSpeed's extra process groups add more
  (LlamaFactory#7532 measured 2.05 GiB outside PyTorch on a 48-GPU H800 ZeRO-3 run).
- cuBLAS workspace: ``CUBLAS_WORKSPACE_CONFIG`` default ":4096:2:16:8" = 2 x 4096 KiB + 8 x 16 KiB =
  8,519,680 B, 32 MiB on sm_90 (``aten/src/ATen/cuda/CublasHandlePool.cpp:parseChosenWorkspaceSize``).
  Since torch 1.13 it is allocated through the caching allocator at the first cuBLAS call
  (``getNewWorkspace``; the fix of pytorch#83461), so it shows in allocated and reserved; before, cuBLAS
  cudaMalloc'ed it itself, outside PyTorch.
"""

from __future__ import annotations

from dataclasses import dataclass

from memfit.core.alloc.versions import TorchVersion

MiB = 2**20

ARCH = {"rtx3090": "sm_86", "a10g": "sm_86", "rtx4090": "sm_89", "l40s": "sm_89", "t4": "sm_75",
        "v100-16gb": "sm_70", "v100-32gb": "sm_70", "a100-40gb": "sm_80", "a100-80gb": "sm_80",
        "h100-80gb": "sm_90", "h200": "sm_90"}
"""GPU presets (``core/hardware.py``) -> compute capability."""

CONTEXT_LAZY = {"sm_86": (256 * MiB, "invoke-ai/InvokeAI#9413 (2x RTX 3090, torch 2.7.1+cu128): 256 MiB bare context"),
                "sm_89": (426 * MiB, "unslothai/unsloth-zoo#1053 (RTX 6000 Ada, torch 2.10.0+cu130): 426 MiB")}
CONTEXT_LAZY_OTHER = (400 * 10**6, "pytorch#109888: 'around 400MB if CUDA >= 11.7 ... lazy module loading'")
CONTEXT_EAGER = {"sm_86": (999 * MiB, "pytorch#54564 (RTX 3090, CUDA 11.1): 1,001 MiB in nvidia-smi, minus one 2 MiB segment")}
CONTEXT_EAGER_OTHER = (645_660_672, "pytorch#86509: 666,632,192 B with CUDA_MODULE_LOADING=DEFAULT, minus one 20 MiB segment")
NCCL_BUFFSIZE = 4 * MiB
NCCL_CHANNELS = {"sm_70": 12, "sm_80": 24, "sm_90": 32}
NCCL_CHANNELS_PCIE = 2
CUBLAS_WORKSPACE = 4096 * 1024 * 2 + 16 * 1024 * 8
CUBLAS_WORKSPACE_SM90 = 4096 * 8 * 1024


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
    cublas_in_allocator: bool

    @property
    def outside_bytes(self) -> int:
        return self.context_bytes + self.nccl_bytes + (0 if self.cublas_in_allocator else self.cublas_workspace_bytes)


def non_pytorch_gpu(gpu_name: str, *, torch: TorchVersion, cuda: str, world_size: int) -> NonPytorchGpu:
    arch = ARCH.get(gpu_name, "unknown")
    lazy = torch.lazy_module_loading and cuda_at_least(cuda, 11, 7)
    if lazy:
        ctx, src = CONTEXT_LAZY.get(arch, CONTEXT_LAZY_OTHER)
    else:
        ctx, src = CONTEXT_EAGER.get(arch, CONTEXT_EAGER_OTHER)
    mode = "lazy" if lazy else "eager"
    src = f"{mode} module loading (torch {torch.name}, CUDA {cuda}); {src}"
    if world_size > 1:
        ch = NCCL_CHANNELS.get(arch, NCCL_CHANNELS_PCIE)
        nccl = ch * 2 * NCCL_BUFFSIZE
        formula = f"{ch} channels x 2 ring neighbours x NCCL_BUFFSIZE 4 MiB"
    else:
        nccl, formula = 0, "world size 1: no NCCL communicator"
    ws = CUBLAS_WORKSPACE_SM90 if arch == "sm_90" else CUBLAS_WORKSPACE
    return NonPytorchGpu(arch=arch, context_bytes=ctx, context_source=src, nccl_bytes=nccl, nccl_formula=formula,
                         cublas_workspace_bytes=ws, cublas_in_allocator=torch.cublas_workspace_in_allocator)


CONTEXT_KEY = "runtime.cuda_context"
CUBLAS_KEY = "runtime.cublas_workspace"


def record_cuda_context(t, sc) -> None:  # noqa: ANN001 (Timeline, Scenario: avoids an import cycle)
    """The context and NCCL's buffers, created by ``deepspeed.initialize`` (``init_distributed`` and
    the first collective), outside the caching allocator."""
    from memfit.core.ledger_types import Device

    if t.accelerator != "cuda":
        return
    np = non_pytorch_for(sc)
    t.declare(CONTEXT_KEY, name="CUDA context and NCCL buffers (outside PyTorch's allocator)", device=Device.GPU,
              category="runtime", exact=False, outside_allocator=True,
              formula=f"context {np.context_bytes:,} B + NCCL {np.nccl_bytes:,} B ({np.nccl_formula}); GPU {np.arch}",
              source=f"CUDA context: {np.context_source}; NCCL: NCCL_BUFFSIZE default (NCCL env docs)")
    t.alloc(CONTEXT_KEY, np.context_bytes + np.nccl_bytes)


def record_cublas_workspace(t, sc) -> None:  # noqa: ANN001
    """cuBLAS's workspace, at the first cuBLAS call (the first forward's first matmul)."""
    from memfit.core.ledger_types import Device

    if t.accelerator != "cuda":
        return
    np = non_pytorch_for(sc)
    where = ("through the caching allocator (CublasHandlePool.cpp:getNewWorkspace, torch >= 1.13)"
             if np.cublas_in_allocator else "cudaMalloc'ed by cuBLAS itself (torch < 1.13), outside PyTorch")
    t.declare(CUBLAS_KEY, name="cuBLAS workspace", device=Device.GPU, category="runtime", exact=False,
              outside_allocator=not np.cublas_in_allocator,
              formula=f"CUBLAS_WORKSPACE_CONFIG default = {np.cublas_workspace_bytes:,} B, one per handle and stream; {where}",
              source="aten/src/ATen/cuda/CublasHandlePool.cpp:parseChosenWorkspaceSize")
    t.alloc(CUBLAS_KEY, np.cublas_workspace_bytes)


def non_pytorch_for(sc) -> NonPytorchGpu:  # noqa: ANN001
    from memfit.core.alloc.versions import resolve_torch_version

    rt = sc.runtime
    tv = resolve_torch_version(rt.torch_version)
    return non_pytorch_gpu(sc.hardware.gpu.name, torch=tv, cuda=rt.cuda_version or tv.default_cuda,
                           world_size=sc.world_size)
