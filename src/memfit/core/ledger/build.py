"""Runs the recipes in the order of the real code and returns the phase ledgers."""

from __future__ import annotations

from memfit.core.ledger.context import RecipeContext
from memfit.core.ledger.deepspeed.load import (HOST_ADAPTERS, record_cast, record_load, record_load_zero_init,
                                     record_move)
from memfit.core.alloc.non_pytorch import record_cublas_workspace, record_cuda_context
from memfit.core.ledger import host_process
from memfit.core.ledger.deepspeed.step import param_element_bytes, record_step
from memfit.core.ledger.timeline import Timeline
from memfit.core.ledger.deepspeed.zero012 import record_zero012
from memfit.core.ledger.deepspeed.zero3 import record_optimizer, record_partition
from memfit.core.ledger_types import PhaseLedger, TracedStep
from memfit.core.scenario.types import Scenario


def build_ledger(sc: Scenario, traced: TracedStep | None = None) -> tuple[PhaseLedger, ...]:
    return build_timeline(sc, traced).phases()


def build_timeline(sc: Scenario, traced: TracedStep | None = None) -> Timeline:
    """Every recipe run, in the order of the real code; the timeline keeps the event log."""
    if sc.framework != "deepspeed":  # torch / ddp / fsdp / fsdp2: their own recipes (ledger/pytorch/build.py)
        from memfit.core.ledger.pytorch.build import build_torch_timeline

        return build_torch_timeline(sc, tracker=memory_tracker(sc))
    ctx = RecipeContext.from_scenario(sc)
    t = Timeline(ranks_per_node=sc.hardware.gpus_per_node, accelerator=sc.accelerator, tracker=memory_tracker(sc))
    t.at_phase("forward", lambda: record_cublas_workspace(t, sc))
    stage3 = sc.deepspeed.zero.stage == 3
    if ctx.zero_init:
        t.phase("load", "from_pretrained under zero.Init: params partitioned as each module is built")
        record_process(t, sc)
        part_key = record_load_zero_init(t, ctx)
        where = {p.name: (HOST_ADAPTERS, "fp32") for p in ctx.params if p.adapter}
        t.phase("initialize.cast", "skipped: the model was built under zero.Init")
        record_cuda_context(t, sc)
        record_cuda_host(t)
        t.phase("initialize.move", "skipped: the model was built under zero.Init")
    else:
        t.phase("load", "from_pretrained and the PEFT wrap, in each rank's process")
        record_process(t, sc)
        where = record_load(t, ctx)
        t.phase("initialize.cast", "DeepSpeed casts every parameter to the training dtype where it sits")
        record_cuda_context(t, sc)
        record_cuda_host(t)
        record_cast(t, ctx, where)
        record_move(t, ctx, where)
        part_key = {}
    if stage3:
        part_key.update(record_partition(t, ctx, where))
        groups = record_optimizer(t, ctx, part_key)
        opt_numel = sum(groups)
        dtypes = part_key
    else:
        opt_numel = record_zero012(t, ctx, where)
        dtypes = where
        groups = [opt_numel]
    record_step(t, ctx, opt_numel=opt_numel, traced=traced, elem_bytes=param_element_bytes(ctx, dtypes), groups=groups)
    return t


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


def record_process(t: Timeline, sc: Scenario) -> None:
    """The process itself before the model: imports, tokenizer, dataset (``host_process``)."""
    host_process.record(t, host_process.load_parts(sc.model.arch.vocab_size, sc.train.dataset_tokens))


def record_cuda_host(t: Timeline) -> None:
    """The CUDA libraries' host memory once the devices are queried and the context created."""
    if t.accelerator == "cuda":
        host_process.record(t, [host_process.cuda_part()])
