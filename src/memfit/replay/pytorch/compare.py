"""Prediction against measurement for the non-DeepSpeed replays (``memfit.replay.pytorch.child``).

``torch_scenario_of(measurement)`` rebuilds, with the pure core, the scenario a torch/DDP/FSDP replay
ran (model config with the ``layers`` override, PEFT spec, training, quantization, DDP and FSDP
settings, world size, the CPU accelerator, a random-init build); ``TORCH_ITEM_MAP`` lines up the
sizes the replay read off its objects with the ledger items that mirror them, and ``compare_torch``
compares them and the host peak per phase. No torch here.
"""

from __future__ import annotations

from memfit.core.ledger_types import Plan
from memfit.core.scenario.types import Scenario
from memfit.replay.comparison import Comparison, ItemComparison, PhaseComparison, tensor_host_peak
from memfit.replay.measurement import Measurement

TORCH_ITEM_MAP: dict[str, tuple[tuple[str, ...], str, str]] = {
    "model.params": (("load.weights", "load.adapter_weights", "move.params"), "load", "load"),
    "quant.weights": (("quant.weights",), "load", "load"),
    "torch.grads": (("step.gradients",), "backward", "backward"),
    "optimizer.state.total": (("optimizer.states", "optimizer.step_counters", "optimizer.paged_states"),
                              "optimizer_step", "step"),
    "ddp.buckets": (("ddp.buckets",), "setup", "setup"),
    "fsdp.sharded_params": (("fsdp.sharded_params",), "setup", "setup"),
    "fsdp.sharded_grads": (("fsdp.sharded_grads", "fsdp.offloaded_grads"), "backward", "backward"),
}
"""replay key -> (ledger keys, phase whose resident set holds them, replay ``at``); compared byte for byte."""


def torch_scenario_of(m: Measurement) -> Scenario:
    from memfit.core.catalog import ModelConfigSource
    from memfit.core.frameworks.deepspeed import DeepSpeedSettings
    from memfit.core.frameworks.pytorch import DdpSettings, FsdpSettings, QuantSettings, TorchSettings
    from memfit.core.hardware import GpuSpec, Hardware
    from memfit.core.peft.params import apply_peft
    from memfit.core.scenario.types import EvalSettings, LoadSettings, TrainSettings
    from memfit.core.shapes import build_model_shape
    from memfit.replay.spec import override_layers

    spec = m.spec
    cfg = override_layers(spec.model_config, spec.layers) if spec.layers else dict(spec.model_config)
    source = ModelConfigSource(name=spec.name, config=cfg, path=None, origin="local")
    model = apply_peft(build_model_shape(source), spec.peft)
    host = m.device.host_ram_bytes if m.device and m.device.host_ram_bytes else 2**40
    hw = Hardware(gpu=GpuSpec(name=m.device.name if m.device else spec.accelerator, total_bytes=host),
                  gpus_per_node=spec.world_size, cpu_ram_bytes=host * spec.world_size)

    def tup(d: dict) -> dict:
        return {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}

    return Scenario(
        name=spec.name, model_ref=spec.name, model=model, peft=spec.peft, deepspeed=DeepSpeedSettings(),
        hardware=hw, load=LoadSettings(dtype=spec.load_dtype, from_checkpoint=False),
        train=TrainSettings(seq_len=spec.seq_len, micro_batch=spec.micro_batch,
                            gradient_checkpointing=spec.gradient_checkpointing, attention=spec.attention),
        accelerator=spec.accelerator, framework=spec.framework, torch=TorchSettings(**tup(spec.training)),
        quant=QuantSettings(**tup(spec.quantization)) if spec.quantization else QuantSettings(),
        ddp=DdpSettings(**tup(spec.ddp)), fsdp=FsdpSettings(**tup(spec.fsdp)),
        eval=EvalSettings(**spec.evaluation) if getattr(spec, "evaluation", None) else EvalSettings(),
    )


def compare_torch(plan: Plan, m: Measurement) -> Comparison:
    """A torch/DDP/FSDP replay (``memfit.replay.pytorch.child``): the sizes it read off its objects
    (``TORCH_ITEM_MAP``) against the ledger items mirroring them, and the host peak per phase under
    the names the plan uses. No pinned attribution: the CPU replays of these frameworks pin nothing."""
    items = []
    for rkey, (lkeys, phase, at) in TORCH_ITEM_MAP.items():
        measured = m.items(at).get(rkey)
        if measured is None:
            continue
        res = {i.key: i.bytes for i in plan.phase(phase).resident}
        items.append(ItemComparison(key=rkey, at=at, ledger_keys=lkeys, measured_bytes=measured,
                                    predicted_bytes=sum(res.get(k, 0) for k in lkeys), pinned_compared=False))
    phases = []
    for ph in plan.phases:
        peak = m.peak(ph.name, "host_peak_bytes")
        if peak is None:
            continue
        gpu = m.peak(ph.name, "device_peak_allocated_bytes")
        phases.append(PhaseComparison(phase=ph.name, predicted_host_bytes=tensor_host_peak(plan, ph.name),
                                      measured_host_bytes=peak,
                                      predicted_gpu_bytes=ph.gpu_peak_bytes if gpu is not None else None,
                                      measured_gpu_bytes=gpu))
    return Comparison(case=m.spec.name, items=tuple(items), phases=tuple(phases), notes=tuple(m.substitutions))
