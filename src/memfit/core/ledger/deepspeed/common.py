"""Pieces several recipes share: pinned host allocations (``pin_memory``) and the ZeRO-3 partition key.

``load.record_load_zero_init`` (params partitioned as ``zero.Init`` builds them) and
``zero3.record_partition`` (the engine's partitioning) write the same partitions; both import them
from here, so neither recipe imports the other at run time.
"""

from __future__ import annotations

from memfit.core.ledger.timeline import Timeline
from memfit.core.ledger_types import Device

PARTS = "zero3.param_partitions"
STAGING = "pin_staging"


def pin(t: Timeline, key: str, nbytes: int, pinned: bool) -> None:
    """``pin_memory(torch.empty(n))``: an unpinned tensor, then its pinned copy (CUDA only)."""
    if pinned and t.pinning_copies:
        t.alloc(STAGING, nbytes)
        t.alloc(key, nbytes)
        t.free(STAGING, nbytes)
    else:
        t.alloc(key, nbytes)


def host(pinned: bool) -> Device:
    return Device.CPU_PINNED if pinned else Device.CPU_PAGEABLE


def declare_staging(t: Timeline) -> None:
    t.declare(STAGING, name="unpinned staging tensor that pin_memory() copies from", device=Device.CPU_PAGEABLE,
              category="buffers", formula="the tensor being pinned, freed right after",
              source="deepspeed/accelerator/cuda_accelerator.py:pin_memory (tensor.pin_memory())")
