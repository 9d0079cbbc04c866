"""Which framework's recipes build a scenario's ledger, and the allocator simulators they write through.

DeepSpeed runs ``ledger/deepspeed/build.py``; a plain PyTorch loop or the Trainer, DDP, FSDP and
FSDP2 run ``ledger/pytorch/build.py``. A new framework is a folder beside those two, dispatched here.
"""

from __future__ import annotations

from memfit.core.ledger.timeline import Timeline
from memfit.core.ledger_types import PhaseLedger, TracedStep
from memfit.core.scenario.types import Scenario


def build_ledger(sc: Scenario, traced: TracedStep | None = None) -> tuple[PhaseLedger, ...]:
    return build_timeline(sc, traced).phases()


def build_timeline(sc: Scenario, traced: TracedStep | None = None, *, model_cache: dict | None = None) -> Timeline:
    """Every recipe run, in the order of the real code; the timeline keeps the event log.
    ``model_cache``: the torch frameworks' model-state view is left in it (``make_plan`` reads its
    notes there instead of building it a second time)."""
    if sc.framework != "deepspeed":  # torch / ddp / fsdp / fsdp2: their own recipes (ledger/pytorch/build.py)
        from memfit.core.ledger.pytorch.build import build_torch_timeline

        return build_torch_timeline(sc, tracker=memory_tracker(sc), traced=traced, model_cache=model_cache)
    from memfit.core.ledger.deepspeed.build import build_deepspeed_timeline

    return build_deepspeed_timeline(sc, traced, tracker=memory_tracker(sc))


def build_events_timeline(sc: Scenario, model_cache: dict | None = None) -> Timeline:
    """The same recipes without the allocator simulators: only the event log and the requested
    peaks (the epoch simulation's step template, ``core/epoch/template.py``); ``model_cache`` shares
    the torch frameworks' model-state view between builds of one model."""
    if sc.framework != "deepspeed":
        from memfit.core.ledger.pytorch.build import build_torch_timeline

        return build_torch_timeline(sc, model_cache=model_cache)
    from memfit.core.ledger.deepspeed.build import build_deepspeed_timeline

    return build_deepspeed_timeline(sc)


def memory_tracker(sc: Scenario):  # -> MemoryTracker | None
    """The allocator simulators for this scenario's torch version, PYTORCH_CUDA_ALLOC_CONF, card and
    DeepSpeed pinning backend (None on DeepSpeed's CPU accelerator: nothing to simulate)."""
    if sc.accelerator != "cuda":
        return None
    from memfit.core.alloc.conf import parse_alloc_conf
    from memfit.core.alloc.tracker import MemoryTracker
    from memfit.core.alloc.versions import resolve_torch_version

    version = resolve_torch_version(sc.runtime.torch_version)
    return MemoryTracker(version=version, conf=parse_alloc_conf(sc.runtime.alloc_conf, version),
                         gpu_total_bytes=sc.hardware.gpu.total_bytes,
                         pin_native=sc.runtime.pin_memory_backend == "native")
