"""The ledger of a run outside DeepSpeed: one process per GPU, a plain PyTorch loop or the Hugging
Face Trainer (``framework: torch``), wrapped in DDP (``ddp``), FSDP (``fsdp``) or ``fully_shard``
(``fsdp2``). Phases: load, setup, the step phases of ``torch_step`` and save (contract 1)."""

from __future__ import annotations

from memfit.core.ledger.timeline import Timeline
from memfit.core.ledger.torch_params import build_torch_model
from memfit.core.ledger.torch_setup import record_load, record_setup
from memfit.core.ledger.torch_step import GradSink, build_step_context, record_save, record_steps
from memfit.core.ledger_types import PhaseLedger
from memfit.core.optimizers import resolve_optimizer
from memfit.core.scenario import Scenario


def build_torch_ledger(sc: Scenario) -> tuple[PhaseLedger, ...]:
    return build_torch_timeline(sc).phases()


def build_torch_timeline(sc: Scenario, *, tracker=None) -> Timeline:  # noqa: ANN001 (MemoryTracker | None)
    """Every recipe of the run, in the order of the real code (``tracker``: the allocator simulators
    of ``ledger.build.memory_tracker``)."""
    from memfit.core.alloc.non_pytorch import record_cublas_workspace

    t = Timeline(ranks_per_node=sc.hardware.gpus_per_node, accelerator=sc.accelerator, tracker=tracker)
    t.at_phase("forward", lambda: record_cublas_workspace(t, sc))  # the first matmul of the first forward
    m = build_torch_model(sc)
    opt = resolve_optimizer(sc.torch, sc.accelerator)
    fw = sc.framework
    if fw == "ddp":
        from memfit.core.ledger.ddp import DdpSink, record_ddp_wrap

        where = record_load(t, sc, m)
        record_setup(t, sc, m, where, opt, description="model.to(device), DDP wrap (gradient buckets), optimizer")
        sink = DdpSink(sc, m)
        record_ddp_wrap(t, sink)
    elif fw in ("fsdp", "fsdp2"):
        from memfit.core.ledger.fsdp import build_fsdp_ledger

        build_fsdp_ledger(t, sc, m, opt)
        return t
    else:
        where = record_load(t, sc, m)
        record_setup(t, sc, m, where, opt)
        sink = GradSink()
    c = build_step_context(sc, m, opt, sink)
    record_steps(t, c)
    record_save(t, c)
    return t
