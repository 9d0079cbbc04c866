"""PyTorch's CUDA caching allocator, simulated: the public names (BRIEF contract 4).

The simulator itself (``DeviceCachingAllocator``, ``c10/cuda/CUDACachingAllocator.cpp``) is
``memfit.core.alloc.device_caching``; ``check_against_recording`` (a recorded
``torch.cuda.memory._snapshot()`` trace replayed through it) is ``memfit.core.alloc.recording``. This
module only gathers them, so that neither of the two imports the other through it.
"""

from __future__ import annotations

from memfit.core.alloc.blocks import TraceEvent, allocation_size, round_size, roundup_power2_next_division
from memfit.core.alloc.device_caching import ADDRESS_BASE, CudaCachingAllocator, OutOfMemory
from memfit.core.alloc.recording import Divergence, RecordingCheck, RecordingConfig, check_against_recording

__all__ = ["ADDRESS_BASE", "CudaCachingAllocator", "Divergence", "OutOfMemory", "RecordingCheck", "RecordingConfig",
           "TraceEvent", "allocation_size", "check_against_recording", "round_size", "roundup_power2_next_division"]
