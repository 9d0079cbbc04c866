"""The ledger of a run outside DeepSpeed: one process per GPU, a plain PyTorch loop or the Hugging
Face Trainer (``framework: torch``), wrapped in DDP (``ddp``), FSDP (``fsdp``) or ``fully_shard``
(``fsdp2``). Phases: load, setup, the step phases of ``step`` and save (contract 1)."""

from __future__ import annotations

from memfit.core.ledger.timeline import Timeline
from memfit.core.ledger.pytorch.params import build_torch_model
from memfit.core.ledger.pytorch.setup import record_load, record_setup
from memfit.core.ledger.pytorch.step import record_save, record_steps
from memfit.core.ledger.pytorch.step_context import GradSink, build_step_context
from memfit.core.ledger_types import PhaseLedger, TracedStep
from memfit.core.optimizers import resolve_optimizer
from memfit.core.scenario.types import Scenario


def build_torch_ledger(sc: Scenario, timeline: Timeline | None = None,
                       model_cache: dict | None = None, step_cache: dict | None = None) -> tuple[PhaseLedger, ...]:
    """The phase ledgers; with ``timeline`` (a ``LeanTimeline``) the recipes write into it instead and
    its ``peaks()`` are the result (``memfit.core.recommend``'s fast path, which also shares the
    model-state view between candidates through ``model_cache``, and the step context's activation
    figures through ``step_cache``: ``step_context.build_step_context``'s ``cache``)."""
    t = build_torch_timeline(sc, timeline=timeline, model_cache=model_cache, step_cache=step_cache)
    return t.phases() if timeline is None else ()


def build_torch_timeline(sc: Scenario, *, tracker=None, timeline: Timeline | None = None,  # noqa: ANN001
                         model_cache: dict | None = None, traced: TracedStep | None = None,
                         step_cache: dict | None = None) -> Timeline:
    """Every recipe of the run, in the order of the real code (``tracker``: the allocator simulators
    of ``ledger.build.memory_tracker``; ``timeline``: write into this one instead; ``traced``: the
    step's activations from ``memfit plan --exact``'s trace, ``ledger/pytorch/traced.py``)."""
    from memfit.core.alloc.non_pytorch import record_cublas_workspace

    t = timeline or Timeline(ranks_per_node=sc.hardware.gpus_per_node, accelerator=sc.accelerator, tracker=tracker)
    t.at_phase("forward", lambda: record_cublas_workspace(t, sc))  # the first matmul of the first forward
    key = (sc.quant, sc.torch.precision, sc.load.dtype, sc.model.name, len(sc.model.params))
    m = model_cache.get(key) if model_cache is not None else None
    if m is None:
        m = build_torch_model(sc)
        if model_cache is not None:
            model_cache[key] = m
    opt = resolve_optimizer(sc.torch, sc.accelerator, sc.runtime.torch_version)
    fw = sc.framework
    if fw == "ddp":
        from memfit.core.ledger.pytorch.ddp import DdpSink, record_ddp_wrap

        where = record_load(t, sc, m)
        record_setup(t, sc, m, where, opt, description="model.to(device), DDP wrap (gradient buckets), optimizer")
        sink = DdpSink(sc, m)
        record_ddp_wrap(t, sink)
    elif fw in ("fsdp", "fsdp2"):
        from memfit.core.ledger.pytorch.fsdp import build_fsdp_ledger

        build_fsdp_ledger(t, sc, m, opt, traced, cache=step_cache)
        return t
    else:
        where = record_load(t, sc, m)
        record_setup(t, sc, m, where, opt)
        sink = GradSink()
    c = build_step_context(sc, m, opt, sink, traced, cache=step_cache)
    record_steps(t, c)
    from memfit.core.ledger.evaluation import record_evaluation

    record_evaluation(t, sc, dtype_bytes=c.stream_bytes, logits_bytes=c.logits_bytes)
    record_save(t, c)
    return t
