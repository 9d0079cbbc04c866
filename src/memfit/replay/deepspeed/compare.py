"""Prediction against measurement for the DeepSpeed replays (``memfit.replay.deepspeed.child``).

``deepspeed_scenario_of(measurement)`` rebuilds, with the pure core, the exact scenario a replay ran (its
model config with the ``layers`` override, PEFT spec, the DeepSpeed JSON it really used, world
size, accelerator). ``memfit.replay.compare.compare_replay(measurement)`` plans it twice:

- with the replay's own accelerator, for what is really allocated (on DeepSpeed's CPU accelerator
  the "device" is host memory, ``pin_memory()`` returns its input, ``.to(cpu)`` is a no-op);
- with the CUDA placement rules (``placement``), only to read where each ledger item lives on a
  GPU machine: which items DeepSpeed pins. On the CPU accelerator nothing is page-locked, but the
  replay records what DeepSpeed passes through ``pin_memory`` (the bytes it *would* pin), so the
  plan's pinned and pageable bytes are compared with the replay's, per item and per phase.

``compare_deepspeed(plan, measurement, placement_of=...)`` then lines up:

- every item the replay read off DeepSpeed's (and the model's) objects (``ITEM_RULES``: every key
  ``memfit.replay.deepspeed.attribution`` can report, at each time it reads them) against the ledger lines
  that mirror it, bytes and pinned bytes, with zero tolerance (deterministic code); a key the
  replay should have reported but did not (``missing``) and a key no rule knows (``unknown``)
  are failures, never skipped;
- per-phase host tensor peaks (what the replay's allocator tracker saw; for a step phase, step 1,
  as the plan models it) against the plan's, without the items the plan marks as estimates of
  non-tensor memory (the process itself, the CUDA context), and the pinned part of each at the
  peak and at the end of the phase.

No torch here: fixtures are compared in the core test suite without running anything heavy.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

from memfit.core.ledger_types import Device, Plan, TracedStep
from memfit.core.scenario.types import Scenario
from memfit.replay.comparison import HOST, Comparison, ItemComparison, PhaseComparison, tensor_host_peak
from memfit.replay.measurement import AttributedItem, Measurement

AT_PHASE = {"load": "load", "initialize": "initialize.optimizer", "step": "optimizer_step"}
"""When the replay reads its items -> the plan phase whose resident set (end of phase) holds them:
``load`` after the model is built, ``initialize`` when ``deepspeed.initialize`` returns, ``step``
after the first optimizer step."""


@dataclass(frozen=True, slots=True)
class ItemRule:
    """Which ledger lines mirror one attributed key."""

    ledger_keys: tuple[str, ...]
    at: tuple[str, ...] = ("initialize", "step")
    applies: str = "always"
    """When DeepSpeed has the attribute at all (``zero3``, ``zero12``, ``zero12_offload``,
    ``zero3_device_flat``, ``zero_init``, ``always``)."""
    per_state: bool = False
    """``optimizer.state.<name>``: one of the optimizer's ``states_per_param`` equal-sized states."""
    step_phase: str = "optimizer_step"
    """The plan phase holding the state after the first step: ``save`` for what the plan frees
    right after the step phase (its resident set keeps the ZeRO paper's "model states", gradients
    included); ZeRO-0/1/2 allocate nothing in ``save``."""
    host_only: bool | None = None
    """Count only ledger lines that live in host memory (True) or on the device (False) under the
    CUDA placement: ``param_groups_fp16_flat_cpu_memory`` exists only as a host buffer,
    ``lp_param_buffer`` only as a device one."""
    note: str = ""


Z3, Z12 = "zero3", "zero12"
ITEM_RULES: dict[str, ItemRule] = {
    # the model, right after it is built (transformers + peft), before DeepSpeed
    "model.params": ItemRule(("load.weights", "load.adapter_weights", "zero3.param_partitions"), ("load",),
                             note="under zero.Init: the params' full (logical) size, see logical_param_bytes"),
    "model.params.trainable": ItemRule((), ("load",), note="PEFT accounting x load dtype (logical_param_bytes)"),
    "model.params.frozen": ItemRule((), ("load",), note="PEFT accounting x load dtype (logical_param_bytes)"),
    "model.buffers": ItemRule(("load.buffers",), ("load",)),
    "load.ds_tensor": ItemRule(("zero3.param_partitions",), ("load",), applies="zero_init"),
    # ZeRO-3 (stage3.py, partition_parameters.py)
    "zero3.ds_tensor.frozen": ItemRule(("zero3.param_partitions",), applies=Z3),
    "zero3.ds_tensor.trainable": ItemRule(("zero3.flat_16bit_partitions",), applies=Z3,
                                          note="views into the flat 16-bit partitions"),
    "zero3.persistent_params": ItemRule(("zero3.persistent_params_full",), applies=Z3),
    "zero3.fp16_partitioned_groups_flat": ItemRule(("zero3.flat_16bit_partitions",), applies=Z3),
    "zero3.param_groups_fp16_flat_cpu_memory": ItemRule(("zero3.flat_16bit_partitions",), applies=Z3, host_only=True),
    "zero3.lp_param_buffer": ItemRule(("zero3.flat_16bit_partitions",), applies="zero3_device_flat", host_only=False),
    "zero3.fp32_partitioned_groups_flat": ItemRule(("optimizer.fp32_master",), applies=Z3),
    "zero3.fp32_partitioned_groups_flat.grad": ItemRule(("optimizer.fp32_grads",), applies=Z3),
    "zero3.grad_partitions_flat_buffer": ItemRule(("zero3.grad_partitions_flat",), applies=Z3),
    "zero3.ipg_bucket.buffer": ItemRule(("zero3.ipg_bucket",), applies=Z3),
    # ZeRO-1/2 (stage_1_and_2.py)
    "zero12.bit16_groups_flat": ItemRule(("zero12.flat_16bit_params",), applies=Z12),
    "zero12.single_partition_of_fp32_groups": ItemRule(("optimizer.fp32_master",), applies=Z12),
    "zero12.single_partition_of_fp32_groups.grad": ItemRule(("optimizer.fp32_grads",), applies=Z12),
    "zero12.param_buffer_of_bit16_for_cpu_offload_groups": ItemRule(("zero12.offload_16bit_partition",),
                                                                    applies="zero12_offload"),
    "zero12.temp_grad_buffer_for_cpu_offload": ItemRule(("zero12.temp_grad_buffer_for_cpu_offload",),
                                                        applies="zero12_offload"),
    "zero12.temp_grad_buffer_for_gpu_offload": ItemRule(("zero12.temp_grad_buffer_for_gpu_offload",),
                                                        applies="zero12_offload"),
    "zero12.accumulated_grads_in_cpu": ItemRule((), applies="zero12_offload",
                                                note="filled only when accumulating gradients under offload; "
                                                     "the ledger books none"),
    "zero12.grads_in_partition": ItemRule(("zero12.grads_in_partition",), applies=Z12, step_phase="save"),
    "zero12.averaged_gradients": ItemRule(("zero12.grads_in_partition",), applies=Z12, step_phase="save",
                                          note="views of grads_in_partition between backward and the step"),
    "zero12.ipg_bucket.buffer": ItemRule(("zero12.reduce_buckets",), applies=Z12),
    # the optimizer's state
    "optimizer.state.total": ItemRule(("optimizer.states",)),
    "optimizer.state.exp_avg": ItemRule(("optimizer.states",), ("step",), per_state=True),
    "optimizer.state.exp_avg_sq": ItemRule(("optimizer.states",), ("step",), per_state=True),
}
"""Every key ``memfit.replay.deepspeed.attribution`` reports, with the ledger lines that mirror it."""

def deepspeed_scenario_of(m: Measurement) -> Scenario:
    """The scenario a DeepSpeed replay ran, rebuilt with the pure core (no torch)."""
    from memfit.core.catalog import ModelConfigSource
    from memfit.core.dsconfig import parse_deepspeed_config
    from memfit.core.hardware import GpuSpec, Hardware
    from memfit.core.peft.params import apply_peft
    from memfit.core.scenario.types import LoadSettings, TrainSettings
    from memfit.core.shapes import build_model_shape
    from memfit.replay.spec import override_layers

    spec = m.spec
    cfg = override_layers(spec.model_config, spec.layers) if spec.layers else dict(spec.model_config)
    source = ModelConfigSource(name=spec.name, config=cfg, path=None, origin="local")
    model = apply_peft(build_model_shape(source), spec.peft)
    ds = parse_deepspeed_config(m.deepspeed_config_used)
    host = m.device.host_ram_bytes if m.device and m.device.host_ram_bytes else 2**40
    gpu_total = (m.device.capacity_bytes or m.device.total_bytes) if m.device and spec.accelerator == "cuda" else host
    hw = Hardware(gpu=GpuSpec(name=m.device.name if m.device else spec.accelerator, total_bytes=gpu_total),
                  gpus_per_node=spec.world_size, cpu_ram_bytes=host * spec.world_size)
    load_dtype = spec.load_dtype
    if any(s.startswith("load dtype fp16->bf16") for s in m.substitutions):
        load_dtype = "bf16"
    return Scenario(
        name=spec.name, model_ref=spec.name, model=model, peft=spec.peft, deepspeed=ds,
        deepspeed_json=dict(m.deepspeed_config_used), hardware=hw,
        load=LoadSettings(dtype=load_dtype, zero_init=spec.zero_init, from_checkpoint=False),
        train=TrainSettings(seq_len=spec.seq_len, micro_batch=spec.micro_batch,
                            gradient_checkpointing=spec.gradient_checkpointing,
                            model_parameters=spec.model_parameters, attention=spec.attention),
        ds_version="0.19", accelerator=spec.accelerator,
    )


def placement(sc: Scenario, traced: TracedStep | None = None) -> dict[str, Device]:
    """Each ledger item's device under the CUDA placement rules (which items DeepSpeed pins)."""
    from memfit.core.plan import make_plan

    cuda = make_plan(dataclasses.replace(sc, accelerator="cuda"), traced)
    out: dict[str, Device] = {}
    for ph in cuda.phases:
        for it in (*ph.items, *ph.resident):
            out.setdefault(it.key, it.device)
    return out


def logical_param_bytes(sc: Scenario, which: str) -> int:
    """Bytes of the built model's params (``all``/``trainable``/``frozen``) as the replay reads them
    before DeepSpeed: the PEFT accounting's counts x the dtype each is built in (the ledger's load
    recipe: base params in the load dtype, or under zero.Init in the training dtype; PEFT-created
    params in fp32)."""
    from memfit.core.ledger.context import RecipeContext

    ctx = RecipeContext.from_scenario(sc)
    base = ctx.model_bytes if ctx.zero_init else ctx.load_bytes
    return sum(p.numel * (4 if p.adapter else base) for p in ctx.params
               if which == "all" or (which == "trainable") == p.trainable)


def _applies(rule: ItemRule, sc: Scenario, dev: Mapping[str, Device]) -> bool:
    z = sc.deepspeed.zero
    if rule.applies == "always":
        return True
    if rule.applies == "zero_init":
        return sc.load.zero_init and z.stage == 3
    if rule.applies == Z3:
        return z.stage == 3
    if rule.applies == "zero3_device_flat":
        return z.stage == 3 and z.offload_param.device == "none"
    if rule.applies == Z12:
        return z.stage in (1, 2)
    if rule.applies == "zero12_offload":
        return z.stage in (1, 2) and z.offload_optimizer.device == "cpu"
    raise AssertionError(rule.applies)


def _predict(rule: ItemRule, key: str, at: str, plan: Plan, sc: Scenario,
             dev: Mapping[str, Device]) -> tuple[int, int]:
    """(bytes, pinned bytes) the plan predicts for ``key`` read at ``at``."""
    if key.startswith("model.params") and (key != "model.params" or sc.load.zero_init):
        which = {"model.params": "all", "model.params.trainable": "trainable", "model.params.frozen": "frozen"}[key]
        return logical_param_bytes(sc, which), 0
    phase = rule.step_phase if at == "step" else AT_PHASE[at]
    resident = {i.key: i.bytes for i in plan.phase(phase).resident}
    total = pinned = 0
    for k in rule.ledger_keys:
        where = dev.get(k, Device.CPU_PAGEABLE)
        if rule.host_only is not None and (where in HOST) != rule.host_only:
            continue
        total += resident.get(k, 0)
        pinned += resident.get(k, 0) if where is Device.CPU_PINNED else 0
    if rule.per_state:
        n = sc.deepspeed.optimizer.states_per_param or 1
        total, pinned = total // n, pinned // n
    return total, pinned


STEP_PHASES = {
    "forward": "forward", "backward": "backward", "optimizer_step": "optimizer_step",
    "accum.forward": "forward", "accum.backward": "backward",
    "step2.forward": "forward", "step2.backward": "backward", "step2.optimizer_step": "optimizer_step",
}
"""Plan phase -> the replay's phase name (the replay names every micro-step's phases plainly and
records their step and micro-step)."""


def occurrences(m: Measurement, phase: str) -> tuple:
    """The replay's phase occurrences a plan phase stands for: ``forward``/``backward`` are step 1's
    first micro-step, ``accum.*`` its later ones, ``optimizer_step`` the end of step 1 (the last
    micro-step's, where the optimizer runs), ``step2.*`` every later step (the worst is compared)."""
    base = STEP_PHASES.get(phase)
    if base is None:
        return m.phase_occurrences(phase)
    ga = m.deepspeed_config_used.get("gradient_accumulation_steps", 1)
    ga = ga if isinstance(ga, int) and ga > 0 else 1
    rows = m.phase_occurrences(base)
    if phase.startswith("step2."):
        rows = tuple(r for r in rows if (r.step or 0) >= 1)
    else:
        rows = tuple(r for r in rows if (r.step or 0) == 0)
    if base == "optimizer_step":
        return tuple(r for r in rows if (r.micro_step or 0) == ga - 1)
    if phase.startswith("accum."):
        return tuple(r for r in rows if (r.micro_step or 0) >= 1)
    if phase.startswith("step2."):
        return tuple(r for r in rows if ga == 1 or (r.micro_step or 0) >= 1)
    return tuple(r for r in rows if (r.micro_step or 0) == 0)


def measured_peak(m: Measurement, phase: str, field: str) -> int | None:
    """Highest ``field`` over the replay's occurrences of plan phase ``phase``."""
    values = [getattr(r, field) for r in occurrences(m, phase) if getattr(r, field) is not None]
    return max(values) if values else None


def _pinned(items, dev: Mapping[str, Device]) -> int:
    return sum(i.bytes for i in items if i.device in HOST and dev.get(i.key) is Device.CPU_PINNED)


def compare_deepspeed(plan: Plan, m: Measurement, *, sc: Scenario | None = None,
                      placement_of: Mapping[str, Device] | None = None) -> Comparison:
    """``plan`` (of ``sc``, default ``deepspeed_scenario_of(m)``) against the DeepSpeed replay ``m``;
    ``placement_of``: the CUDA placement of each ledger item (default: ``placement(sc)``)."""
    sc = sc or deepspeed_scenario_of(m)
    dev = placement_of if placement_of is not None else placement(sc)
    measured: dict[tuple[str, str], AttributedItem] = {(i.key, i.at): i for i in m.attributed}
    items, missing = [], []
    for key, rule in ITEM_RULES.items():
        if not _applies(rule, sc, dev):
            continue
        for at in rule.at:
            got = measured.get((key, at))
            if got is None:
                missing.append(f"{key}@{at}")
                continue
            nbytes, pinned = _predict(rule, key, at, plan, sc, dev)
            items.append(ItemComparison(key=key, at=at, ledger_keys=rule.ledger_keys, predicted_bytes=nbytes,
                                        measured_bytes=got.bytes, predicted_pinned_bytes=pinned,
                                        measured_pinned_bytes=got.pinned_bytes, deepspeed_pins=got.deepspeed_pins))
    compared = {(i.key, i.at) for i in items}
    unknown = sorted(f"{k}@{a}" for (k, a) in measured if (k, a) not in compared)
    phases = []
    baseline = (m.phases[0].host_live_start_bytes or 0) if m.phases else 0
    for ph in plan.phases:
        occ = [r for r in occurrences(m, ph.name) if r.host_peak_bytes is not None]
        if not occ:
            continue
        worst = max(occ, key=lambda r: r.host_peak_bytes)  # step2.*: the worst later step
        gpu = measured_peak(m, ph.name, "device_peak_allocated_bytes")
        phases.append(PhaseComparison(
            phase=ph.name, predicted_host_bytes=tensor_host_peak(plan, ph.name),
            measured_host_bytes=worst.host_peak_bytes - baseline, baseline_bytes=baseline,
            predicted_pinned_bytes=_pinned(ph.items, dev), measured_pinned_bytes=worst.host_peak_pinned_bytes,
            predicted_pinned_end_bytes=_pinned(ph.resident, dev), measured_pinned_end_bytes=worst.host_pinned_end_bytes,
            predicted_gpu_bytes=ph.gpu_peak_bytes if gpu is not None else None, measured_gpu_bytes=gpu))
    return Comparison(case=m.spec.name, items=tuple(items), phases=tuple(phases), missing=tuple(missing),
                      unknown=tuple(unknown), notes=tuple(m.substitutions))
