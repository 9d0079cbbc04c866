"""The activations a CPU replay really has: a CPU-kernel trace of exactly the replayed step.

``memfit plan`` computes activations for CUDA kernels (analytic, or traced with
``TraceOptions.kernels="cuda"``); a replay on DeepSpeed's CPU accelerator runs the CPU kernels. To
compare the replay's forward/backward with something equally real, ``trace_replay_step`` traces the
replay's own model and batch on fake tensors with the CPU kernels (``kernels="cpu"``, whose saved
tensors equal real CPU tensors byte for byte: tests/trace/test_tracker_vs_real.py):

- the model from the replay's config (``ReplaySpec.effective_model_config``: the ``layers``
  override applied) with its PEFT method, in the dtype DeepSpeed trains in (the replay's JSON
  after substitutions: bf16 where the CPU has no fp16);
- the replay's batch: ``input_ids`` of ``micro_batch x seq_len`` with ``labels`` the same tensor
  (``child.ChildRun._run``: ``engine(input_ids=ids, labels=ids)``);
- the replay's loop: only ``.loss`` is kept, the model output is dropped before ``backward``
  (``keep_outputs=False``);
- byte granularity (the host tracker counts requested sizes, not allocator blocks).

``cpu_traced_step`` turns it into the ``TracedStep`` a plan takes, so the plan's forward/backward
hold these activations (``memfit.trace.ledger_step``). Imports torch, transformers and peft.
"""

from __future__ import annotations

import dataclasses

from memfit.core.ledger_types import TracedStep
from memfit.core.scenario import Scenario
from memfit.replay.spec import ReplaySpec
from memfit.trace.results import TraceOptions, TraceResult


def replay_trace_options(sc: Scenario, spec: ReplaySpec) -> TraceOptions:
    from memfit.trace.ledger_step import trace_options_for

    return dataclasses.replace(trace_options_for(sc), kernels="cpu", keep_outputs=False, granularity_bytes=1,
                               seq_len=spec.seq_len, micro_batch=spec.micro_batch)


def trace_replay_step(sc: Scenario, spec: ReplaySpec) -> TraceResult:
    """Forward + loss + backward of the replay's model and batch, CPU kernels, on fake tensors."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from memfit.trace.model_build import TORCH_DTYPES, apply_peft, build_meta_model, materialize_fake
    from memfit.trace.step import quiet_libraries, trace_model

    options = replay_trace_options(sc, spec)
    with quiet_libraries():
        model = build_meta_model(spec.effective_model_config(), attention=options.attention)
        model = apply_peft(model, spec.peft)
        if options.gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.train()
        fake_mode = FakeTensorMode()
        materialize_fake(model, fake_mode, TORCH_DTYPES[options.dtype])
        with fake_mode:
            ids = torch.zeros(options.micro_batch, options.seq_len, dtype=torch.long)
        return trace_model(model, {"input_ids": ids, "labels": ids}, options, fake_mode=fake_mode,
                           method=spec.peft.method)


def cpu_traced_step(sc: Scenario, trace: TraceResult) -> TracedStep:
    """The traced activations as the plan's forward/backward items (``ledger_step``'s ZeRO-0/1/2
    form: the activation-side bytes at each peak). ZeRO-3's traced form replays parameter gathers
    for a GPU (``zero3_step_memory``) and does not apply to the CPU accelerator, so under ZeRO-3 the
    items are the activations alone and the plan holds no gathered parameters."""
    from memfit.trace.ledger_step import _activations_item

    note = (f"activations traced with CPU kernels ({trace.architecture}, micro-batch {trace.options.micro_batch} x "
            f"seq {trace.options.seq_len}, {trace.options.dtype})")
    return TracedStep(forward_items=(_activations_item(trace.forward, "forward"),),
                      backward_items=(_activations_item(trace.backward, "backward"),), note=note)
