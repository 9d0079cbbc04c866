"""Prediction against measurement: the plan of a replayed scenario, item by item and phase by phase.

``scenario_of(measurement)`` rebuilds, with the pure core, the exact scenario a replay ran (its
model config with the ``layers`` override, PEFT spec, the DeepSpeed JSON it really used, world
size, accelerator); ``compare(plan, measurement)`` lines up:

- items DeepSpeed's objects report (``memfit.replay.attribution``) against the ledger lines that
  mirror them: these are deterministic, so the tolerance is zero bytes;
- per-phase host tensor peaks (what the replay's allocator tracker saw) against the plan's, without
  the items the plan marks as estimates of non-tensor memory (the process itself, the CUDA context).

No torch here: fixtures are compared in the core test suite without running anything heavy.
"""

from __future__ import annotations

from dataclasses import dataclass

from memfit.core.ledger_types import Device, Plan
from memfit.core.scenario import Scenario
from memfit.replay.measurement import Measurement

# replay attribution key -> (ledger item key, phase whose resident set holds it, replay `at`)
ITEM_MAP: dict[str, tuple[tuple[str, ...], str, str]] = {
    "zero3.ds_tensor.frozen": (("zero3.param_partitions",), "initialize.optimizer", "initialize"),
    "zero3.fp16_partitioned_groups_flat": (("zero3.flat_16bit_partitions",), "initialize.optimizer", "initialize"),
    "zero3.fp32_partitioned_groups_flat": (("optimizer.fp32_master",), "initialize.optimizer", "initialize"),
    "zero3.fp32_partitioned_groups_flat.grad": (("optimizer.fp32_grads",), "initialize.optimizer", "initialize"),
    "zero3.grad_partitions_flat_buffer": (("zero3.grad_partitions_flat",), "initialize.optimizer", "initialize"),
    "zero3.ipg_bucket.buffer": (("zero3.ipg_bucket",), "initialize.optimizer", "initialize"),
    "zero12.bit16_groups_flat": (("zero12.flat_16bit_params",), "initialize.optimizer", "initialize"),
    "zero12.single_partition_of_fp32_groups": (("optimizer.fp32_master",), "initialize.optimizer", "initialize"),
    "zero12.single_partition_of_fp32_groups.grad": (("optimizer.fp32_grads",), "initialize.optimizer", "initialize"),
    "zero12.param_buffer_of_bit16_for_cpu_offload_groups": (("zero12.offload_16bit_partition",), "initialize.optimizer", "initialize"),
    "zero12.temp_grad_buffer_for_cpu_offload": (("zero12.temp_grad_buffer_for_cpu_offload",), "initialize.optimizer", "initialize"),
    "zero12.temp_grad_buffer_for_gpu_offload": (("zero12.temp_grad_buffer_for_gpu_offload",), "initialize.optimizer", "initialize"),
    "optimizer.state.total": (("optimizer.states",), "optimizer_step", "step"),
    "model.params": (("load.weights", "load.adapter_weights"), "load", "load"),
}
"""Deterministic allocations both sides name; compared byte for byte."""

ESTIMATE_KEYS = ("runtime.process", "runtime.cuda_context")
"""Plan items that are not tensors (the replay's tracker cannot see them), with every ``host.*``
item (``memfit.core.ledger.host_process``: the process's imports, tokenizer, workers, heap)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ItemComparison:
    key: str
    """The replay's attribution key."""
    ledger_keys: tuple[str, ...]
    predicted_bytes: int
    measured_bytes: int

    @property
    def diff_bytes(self) -> int:
        return self.predicted_bytes - self.measured_bytes

    @property
    def matches(self) -> bool:
        return self.diff_bytes == 0


@dataclass(frozen=True, slots=True, kw_only=True)
class PhaseComparison:
    phase: str
    predicted_host_bytes: int
    """The plan's host peak of the phase, tensors only (estimates of non-tensor memory removed)."""
    measured_host_bytes: int
    """The highest host tensor peak the replay saw in the occurrences of this phase
    (``occurrences``: step 1's first micro-step for ``forward``, every later step for ``step2.*``)."""
    predicted_gpu_bytes: int | None = None
    measured_gpu_bytes: int | None = None

    @property
    def diff_bytes(self) -> int:
        return self.predicted_host_bytes - self.measured_host_bytes

    @property
    def rel_diff(self) -> float:
        return self.diff_bytes / self.measured_host_bytes if self.measured_host_bytes else 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Comparison:
    case: str
    items: tuple[ItemComparison, ...]
    phases: tuple[PhaseComparison, ...]
    notes: tuple[str, ...] = ()

    @property
    def exact_items_match(self) -> bool:
        return all(i.matches for i in self.items)


def scenario_of(m: Measurement) -> Scenario:
    """The scenario a replay ran, rebuilt with the pure core (no torch)."""
    from memfit.core.catalog import ModelConfigSource
    from memfit.core.dsconfig import parse_deepspeed_config
    from memfit.core.hardware import GpuSpec, Hardware
    from memfit.core.peft import apply_peft
    from memfit.core.scenario import LoadSettings, TrainSettings
    from memfit.core.shapes import build_model_shape
    from memfit.replay.spec import override_layers

    spec = m.spec
    if spec.framework != "deepspeed":
        from memfit.replay.torch_compare import torch_scenario_of

        return torch_scenario_of(m)
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
    if base is None or getattr(m.spec, "framework", "deepspeed") != "deepspeed":
        return m.phase_occurrences(phase)  # the non-DeepSpeed replays name every phase as the plan does
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


def _tensor_host_peak(plan: Plan, phase: str) -> int:
    ph = plan.phase(phase)
    est = sum(i.bytes for i in ph.items if (i.key in ESTIMATE_KEYS or i.key.startswith("host."))
              and i.device in (Device.CPU_PAGEABLE, Device.CPU_PINNED))
    return ph.cpu_peak_bytes - est


def compare(plan: Plan, m: Measurement) -> Comparison:
    items = []
    item_map = ITEM_MAP
    if m.spec.framework != "deepspeed":
        from memfit.replay.torch_compare import TORCH_ITEM_MAP as item_map
    for rkey, (lkeys, phase, at) in item_map.items():
        measured = m.items(at).get(rkey)
        if measured is None or (rkey == "model.params" and m.spec.zero_init):
            continue  # under zero.Init the replay reports the params' logical size, not storage
        res = {i.key: i.bytes for i in plan.phase(phase).resident}
        items.append(ItemComparison(key=rkey, ledger_keys=lkeys, measured_bytes=measured,
                                    predicted_bytes=sum(res.get(k, 0) for k in lkeys)))
    phases = []
    for ph in plan.phases:
        peak = measured_peak(m, ph.name, "host_peak_bytes")
        if peak is None:
            continue
        gpu = measured_peak(m, ph.name, "device_peak_allocated_bytes")
        phases.append(PhaseComparison(phase=ph.name, predicted_host_bytes=_tensor_host_peak(plan, ph.name),
                                      measured_host_bytes=peak,
                                      predicted_gpu_bytes=ph.gpu_peak_bytes if gpu is not None else None,
                                      measured_gpu_bytes=gpu))
    return Comparison(case=m.spec.name, items=tuple(items), phases=tuple(phases), notes=tuple(m.substitutions))
