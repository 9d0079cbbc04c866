"""Memory that no tensor accounts for: the CUDA context and the process itself.

These are not functions of the config and are not byte-exact; they are listed (``exact=False``)
so that a verdict against a real card is not optimistic. Figures are typical for PyTorch 2.x on
Ampere/Hopper with lazy CUDA module loading; replays on a real GPU measure them
(``torch.cuda.mem_get_info`` minus the allocator's reserved bytes).
"""

from __future__ import annotations

from memfit.core.ledger.timeline import Timeline
from memfit.core.ledger_types import Device

CUDA_CONTEXT_BYTES = 512 * 2**20
"""CUDA context, cuBLAS workspace and NCCL buffers per process (typical: 300-700 MiB)."""
PROCESS_BASELINE_BYTES = 2 * 2**30
"""Python, torch, CUDA libraries, transformers and DeepSpeed resident in host memory per process."""


def record_process_baseline(t: Timeline) -> None:
    t.declare("runtime.process", name="the Python process itself (interpreter, torch, CUDA and DeepSpeed libraries)",
              device=Device.CPU_PAGEABLE, category="runtime", exact=False,
              formula="about 2 GiB per process (estimate, not a function of the config)",
              source="process RSS before any tensor (measured by replays)")
    t.alloc("runtime.process", PROCESS_BASELINE_BYTES)


def record_cuda_context(t: Timeline) -> None:
    if t.accelerator != "cuda":
        return
    t.declare("runtime.cuda_context", name="CUDA context, cuBLAS workspace, NCCL buffers",
              device=Device.GPU, category="runtime", exact=False,
              formula="about 512 MiB per process (estimate; outside torch's allocator)",
              source="torch.cuda init / deepspeed.comm.init_distributed (NCCL)")
    t.alloc("runtime.cuda_context", CUDA_CONTEXT_BYTES)
