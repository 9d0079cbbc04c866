"""The DeepSpeed run's recipes, in the order of the real code: the user's ``from_pretrained`` (or a
build under ``zero.Init``), then inside ``deepspeed.initialize`` the cast, the whole-model move,
ZeRO's partitioning (stage 3) or its flat buffers (stages 0-2) and the optimizer's, then the steps."""

from __future__ import annotations

from memfit.core.alloc.non_pytorch import record_cublas_workspace, record_cuda_context
from memfit.core.ledger import host_process
from memfit.core.ledger.context import RecipeContext
from memfit.core.ledger.deepspeed.load import (HOST_ADAPTERS, record_cast, record_load, record_load_zero_init,
                                               record_move)
from memfit.core.ledger.deepspeed.quant import record_quant_state
from memfit.core.ledger.deepspeed.step import param_element_bytes, record_step
from memfit.core.ledger.deepspeed.zero012 import record_zero012
from memfit.core.ledger.deepspeed.zero3 import record_optimizer, record_partition
from memfit.core.ledger.timeline import Timeline
from memfit.core.ledger_types import TracedStep
from memfit.core.scenario.types import Scenario


def build_deepspeed_timeline(sc: Scenario, traced: TracedStep | None = None, *, tracker=None) -> Timeline:  # noqa: ANN001
    """Every DeepSpeed recipe run, in the order of the real code (``tracker``: the allocator
    simulators of ``ledger.build.memory_tracker``); the timeline keeps the event log."""
    ctx = RecipeContext.from_scenario(sc)
    t = Timeline(ranks_per_node=sc.hardware.gpus_per_node, accelerator=sc.accelerator, tracker=tracker)
    t.at_phase("forward", lambda: record_cublas_workspace(t, sc))
    stage3 = sc.deepspeed.zero.stage == 3
    if ctx.zero_init:
        t.phase("load", "from_pretrained under zero.Init: params partitioned as each module is built")
        record_process(t, sc)
        part_key = record_load_zero_init(t, ctx)
        record_quant_state(t, ctx)  # a 4-bit base is quantized on the GPU as it loads
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
        record_quant_state(t, ctx)
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


def record_process(t: Timeline, sc: Scenario) -> None:
    """The process itself before the model: imports, tokenizer, dataset (``host_process``)."""
    host_process.record(t, host_process.load_parts(sc.model.arch.vocab_size, sc.train.dataset_tokens))


def record_cuda_host(t: Timeline) -> None:
    """The CUDA libraries' host memory once the devices are queried and the context created."""
    if t.accelerator == "cuda":
        host_process.record(t, [host_process.cuda_part()])
