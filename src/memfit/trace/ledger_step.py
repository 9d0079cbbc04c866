"""A traced training step as ledger items: what ``memfit plan --exact`` puts in the forward and
backward phases instead of the analytic estimates.

Stage 3: ``zero3_step_memory`` replays ZeRO-3's fetch/release and gradient bucketing over the
traced module order; its items go into the phase where the step peaks, and the other phase gets
the traced activations plus the highest gathered-parameter bytes of the step. Stages 0-2: the
traced activation-side bytes (inputs, saved tensors, outputs, temporaries) at each peak; parameters
and gradients stay the ledger's own lines.
"""

from __future__ import annotations

from collections.abc import Callable

from memfit.core.catalog import resolve_model_config
from memfit.core.ledger_types import Device, LedgerItem, TracedModuleBytes, TracedStep
from memfit.core.scenario.types import Scenario
from memfit.trace.results import TraceOptions, TracePeak, TraceResult

SRC = "memfit.trace (the model's own forward/backward on fake tensors)"


def trace_options_for(sc: Scenario) -> TraceOptions:
    if sc.framework != "deepspeed":
        return torch_trace_options(sc)
    z = sc.deepspeed.zero
    return TraceOptions(seq_len=sc.train.seq_len, micro_batch=sc.train.micro_batch, dtype=sc.deepspeed.precision,
                        gradient_checkpointing=sc.train.gradient_checkpointing, attention=sc.train.attention,
                        zero3_linear=z.stage == 3 and z.memory_efficient_linear, task=sc.model.arch.task,
                        target_len=sc.train.target_len)


def torch_trace_options(sc: Scenario) -> TraceOptions:
    """The step a torch/DDP/FSDP/FSDP2 plan runs, as trace options: the base params in the dtype the
    training loop holds them (``ledger/pytorch/params.py``; FSDP's mixed precision computes with its
    16-bit unsharded copies), the adapters in fp32 beside a 16-bit base (peft's
    ``autocast_adapter_dtype``), autocast as the precision mode says. Refused in one line where the
    trace cannot build that model: a bitsandbytes-quantized base, base params in several dtypes."""
    from memfit.core.ledger.pytorch.params import build_torch_model
    from memfit.errors import MemfitError

    if sc.quant.enabled:
        raise MemfitError(f"--exact cannot trace a {sc.quant.method} bitsandbytes base yet (the fake-tensor trace "
                          "builds no quantized layers): drop --exact for the analytic activations")
    m = build_torch_model(sc)
    base = sorted({p.dtype for p in m.params if not p.adapter})
    if len(base) != 1:
        raise MemfitError(f"--exact traces the base params in one dtype; this {sc.framework} plan holds them in "
                          f"{' and '.join(base)}: drop --exact for the analytic activations")
    dtype = base[0]
    fsdp_mp = sc.framework in ("fsdp", "fsdp2") and sc.fsdp.mixed_precision != "none"
    if fsdp_mp:
        dtype = sc.fsdp.mixed_precision
    adapter = "fp32" if dtype != "fp32" and not fsdp_mp and any(p.adapter for p in m.params) else None
    return TraceOptions(seq_len=sc.train.seq_len, micro_batch=sc.train.micro_batch, dtype=dtype,
                        adapter_dtype=adapter, autocast=m.precision.autocast,
                        gradient_checkpointing=sc.train.gradient_checkpointing, attention=sc.train.attention,
                        task=sc.model.arch.task, target_len=sc.train.target_len)


def trace_scenario(sc: Scenario, *, progress: Callable[[str, int, int], None] | None = None) -> TraceResult:
    from memfit.trace.step import trace_training_step

    source = resolve_model_config(sc.model_ref, trust_remote_code=True)  # accepted when the scenario was built
    return trace_training_step(source.config_dict(), sc.peft, trace_options_for(sc), progress=progress)


def _activations_item(peak: TracePeak, phase: str) -> LedgerItem:
    b = peak.breakdown
    return LedgerItem(
        key="step.activations", name=f"activations at the {phase} peak (traced)", device=Device.GPU,
        bytes=b.activation_side_bytes, category="activations",
        formula=(f"saved {b.saved_bytes:,} + outputs {b.output_bytes:,} + inputs {b.input_bytes:,} + held "
                 f"{b.held_bytes:,} + temporaries {b.temporary_bytes:,} B at op {peak.op} in {peak.module or 'the model'}"),
        source=SRC)


def ledger_step(sc: Scenario, trace: TraceResult) -> TracedStep:
    fwd = (_activations_item(trace.forward, "forward"),)
    bwd = (_activations_item(trace.backward, "backward"),)
    opts = trace.options
    from memfit.trace.model_build import TRACED_AS

    kernel = " (traced through sdpa's flash kernel: the same saved tensors)" if opts.attention in TRACED_AS else ""
    target = f", target {opts.target_len}" if opts.target_len else ""
    note = (f"Forward/backward traced from the model's code ({trace.architecture}, micro-batch {opts.micro_batch} x "
            f"seq {opts.seq_len}{target}, {opts.dtype}, {opts.attention}{kernel}"
            + (f", autocast {opts.autocast}" if opts.autocast else "")
            + (f", adapters {opts.adapter_dtype}" if opts.adapter_dtype else "")
            + (", gradient checkpointing" if opts.gradient_checkpointing else "") + ")")
    if trace.layer_reuse and not trace.layer_reuse.startswith("full trace"):
        note += f"; {trace.layer_reuse}"
    if sc.framework != "deepspeed":
        note += ("; each module's traced activations are booked in its layer and freed layer by layer in backward"
                 + ("; the recompute of each checkpointed block in backward stays the analytic estimate"
                    if opts.gradient_checkpointing else ""))
    elif sc.deepspeed.zero.stage == 3:
        from memfit.trace.deepspeed.zero3_step import zero3_step_memory

        z3 = zero3_step_memory(trace, sc.deepspeed, sc.world_size)
        gathered = LedgerItem(
            key="zero3.gathered_params", name="params gathered by ZeRO-3 (highest of the step)", device=Device.GPU,
            bytes=z3.max_gathered_bytes, category="params", exact=False,
            formula=f"replay of fetch/release over the traced module order; highest at {z3.max_gathered_module}",
            source="deepspeed/runtime/zero/partitioned_param_coordinator.py:fetch_sub_module (replayed)")
        other = lambda acts: acts + (gathered,)  # noqa: E731
        if z3.phase == "forward":
            fwd, bwd = z3.items, other(bwd)
        else:
            fwd, bwd = other(fwd), z3.items
        note += (f"; ZeRO-3 step peak in {z3.phase} at {z3.module or 'the model'} ({z3.moment}), "
                 f"{z3.peak_bytes:,} B on top of the model states")
    return TracedStep(forward_items=fwd, backward_items=bwd, note=note, by_module=_by_module(trace.forward))


_KEPT = ("input", "saved", "output", "held")


def _by_module(peak: TracePeak) -> tuple[TracedModuleBytes, ...]:
    """The peak's activation-side bytes per module (``ModuleBytes`` rows are per module and category)."""
    kept: dict[str, int] = {}
    temp: dict[str, int] = {}
    for row in peak.by_module:
        if row.category in _KEPT:
            kept[row.module] = kept.get(row.module, 0) + row.bytes
        elif row.category == "temporary":
            temp[row.module] = temp.get(row.module, 0) + row.bytes
    names = list(dict.fromkeys([*kept, *temp]))
    return tuple(TracedModuleBytes(module=n, kept_bytes=kept.get(n, 0), temporary_bytes=temp.get(n, 0)) for n in names)
