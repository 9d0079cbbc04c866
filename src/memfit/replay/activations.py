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
hold these activations (``memfit.trace.ledger_step``). ``trace_torch_replay_step`` does the same for
a torch/DDP replay (``memfit.replay.pytorch.child``): its params in their dtypes, under ``torch.autocast``
for the AMP modes. Imports torch, transformers and peft.
"""

from __future__ import annotations

import dataclasses

from memfit.core.ledger_types import TracedStep
from memfit.core.scenario.types import Scenario
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


def trace_torch_replay_step(spec: ReplaySpec) -> TraceResult:
    """Forward + loss + backward of a torch replay's model and batch (``pytorch.child.TorchChildRun._run``),
    CPU kernels, on fake tensors.

    The params have the replay's dtypes: the model is built in ``load_dtype`` but for peft's adapters,
    which peft keeps fp32 (``autocast_adapter_dtype``); the pure 16-bit modes then cast every other
    floating param (``ChildRun._cast_and_move``). The AMP modes run the model and its loss under
    ``torch.autocast("cpu", dtype)``, as the child does. Quantized bases and FSDP's sharding are not
    traced (bitsandbytes' layers and FSDP's all-gathers are not modules the trace builds)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from memfit.core.frameworks.pytorch import TorchSettings
    from memfit.core.ledger.context import is_adapter_param
    from memfit.errors import MemfitError
    from memfit.trace.model_build import TORCH_DTYPES, apply_peft, build_meta_model, materialize_fake
    from memfit.trace.step import quiet_libraries, trace_model

    if spec.quantization or spec.framework not in ("torch", "ddp"):
        raise MemfitError(f"cannot trace a {spec.framework} replay{' of a quantized base' if spec.quantization else ''}")
    ts = TorchSettings(**spec.training)
    autocast = {"amp_fp16": torch.float16, "amp_bf16": torch.bfloat16}.get(ts.precision)
    options = TraceOptions(seq_len=spec.seq_len, micro_batch=spec.micro_batch, dtype=spec.load_dtype, kernels="cpu",
                           keep_outputs=False, granularity_bytes=1, gradient_checkpointing=spec.gradient_checkpointing,
                           attention=spec.attention)
    with quiet_libraries():
        model = apply_peft(build_meta_model(spec.effective_model_config(), attention=options.attention), spec.peft)
        for target in (TORCH_DTYPES[spec.load_dtype], TORCH_DTYPES.get(ts.precision)):  # load, then pure 16-bit
            for name, p in model.named_parameters():
                if target is not None and p.is_floating_point() and p.dtype != target and not is_adapter_param(name):
                    p.data = p.data.to(target)
        if options.gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.train()
        fake_mode = FakeTensorMode()
        materialize_fake(model, fake_mode, None)
        with fake_mode:
            ids = torch.zeros(options.micro_batch, options.seq_len, dtype=torch.long)
        run = model
        if autocast is not None:
            class Autocast(torch.nn.Module):
                """The child's ``with torch.autocast(...): loss = model(...).loss`` as one module."""

                def __init__(self) -> None:
                    super().__init__()
                    self.inner = model

                def forward(self, **inputs):
                    with torch.autocast("cpu", dtype=autocast):
                        return self.inner(**inputs)

            run = Autocast()
        return trace_model(run, {"input_ids": ids, "labels": ids}, options, fake_mode=fake_mode,
                           method=spec.peft.method)

