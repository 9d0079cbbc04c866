"""Memory that no tensor accounts for: the process itself (host).

Not a function of the config and not byte-exact; listed (``exact=False``) so that a verdict is not
optimistic. The GPU side (CUDA context, NCCL, cuBLAS) moved to ``core/alloc/non_pytorch.py``.
"""

from __future__ import annotations

from memfit.core.ledger.timeline import Timeline
from memfit.core.ledger_types import Device

PROCESS_BASELINE_BYTES = 2 * 2**30
"""Python, torch, CUDA libraries, transformers and DeepSpeed resident in host memory per process."""


def record_process_baseline(t: Timeline) -> None:
    t.declare("runtime.process", name="the Python process itself (interpreter, torch, CUDA and DeepSpeed libraries)",
              device=Device.CPU_PAGEABLE, category="runtime", exact=False,
              formula="about 2 GiB per process (estimate, not a function of the config)",
              source="process RSS before any tensor (measured by replays)")
    t.alloc("runtime.process", PROCESS_BASELINE_BYTES)

