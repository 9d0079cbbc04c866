"""What every recipe reads: the scenario reduced to the numbers the allocation code uses."""

from __future__ import annotations


from memfit.core.lean_dataclass import dataclass
from memfit.core.peft.adapter_params import ADAPTER_MARKERS, is_adapter_param  # noqa: F401 (re-exported)
from memfit.core.scenario.types import Scenario

DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}


def optimizer_offload(stage: int, device: str) -> str:
    """Where DeepSpeed really puts the optimizer: ``offload_optimizer`` counts only from ZeRO-1 on,
    and below ZeRO-3 only to ``cpu`` (engine.py ``zero_cpu_offload``: NVMe needs stage 3)."""
    if stage == 0 or (stage < 3 and device != "cpu"):
        return "none"
    return device


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True, slots=True)
class ParamView:
    """One parameter as the allocation code sees it."""

    name: str
    numel: int
    trainable: bool
    """requires_grad and handed to the optimizer (see ``RecipeContext.optimized``)."""
    adapter: bool
    """Created by the PEFT method in fp32 (peft's default), not loaded by from_pretrained."""




@dataclass(frozen=True, slots=True)
class RecipeContext:
    """The scenario in the units of the code: element counts, element sizes, world size."""

    scenario: Scenario
    params: tuple[ParamView, ...]
    world: int
    model_bytes: int
    """Element size of the training dtype (fp16/bf16: 2, fp32: 4)."""
    load_bytes: int
    """Element size of from_pretrained's torch_dtype."""
    grad_accum_bytes: int
    comm_bytes: int
    quantized: tuple[tuple[str, tuple[int, ...]], ...] = ()
    """bitsandbytes 4-bit weights (QLoRA): name and the (out, in) shape quantized. Their ``ParamView.numel``
    is the packed storage's (``Params4bit`` in ``bnb_4bit_quant_storage``), in elements of the training
    dtype: what ZeRO-3 partitions and gathers; the quantization state (absmax, code ...) is a plain
    attribute of each weight, held whole by every rank."""

    @classmethod
    def from_scenario(cls, sc: Scenario) -> "RecipeContext":
        from memfit.core.quant import quantized_tensors, quantized_weights

        ds = sc.deepspeed
        model_bytes = DTYPE_BYTES[ds.precision]
        accum = DTYPE_BYTES[ds.grad_accum_dtype] if ds.grad_accum_dtype else model_bytes
        quant = quantized_weights(sc.model.params, sc.quant, sc.model.arch.model_type)

        def numel(p) -> int:  # noqa: ANN001
            if p.name not in quant:
                return p.numel
            return ceil_div(quantized_tensors(sc.quant, quant[p.name])[0].nbytes, model_bytes)

        params = tuple(ParamView(p.name, numel(p), p.trainable, is_adapter_param(p.name)) for p in sc.model.params)
        return cls(scenario=sc, params=params, world=sc.world_size, model_bytes=model_bytes,
                   load_bytes=DTYPE_BYTES[sc.load.dtype], grad_accum_bytes=accum, comm_bytes=model_bytes,
                   quantized=tuple(quant.items()))

    @property
    def zero_init(self) -> bool:
        """Built under zero.Init: only meaningful (and only enabled by DeepSpeed) for ZeRO-3."""
        return self.scenario.load.zero_init and self.scenario.deepspeed.zero.stage == 3

    @property
    def trainable(self) -> tuple[ParamView, ...]:
        return tuple(p for p in self.params if p.trainable)

    @property
    def n_total(self) -> int:
        return sum(p.numel for p in self.params)

    @property
    def n_trainable(self) -> int:
        return sum(p.numel for p in self.params if p.trainable)

    def partition_numel(self, p: ParamView) -> int:
        """ZeRO-3 partition of one param: ``ceil(p / W)`` (partition_parameters.py `_partition_param`:
        ``tensor_size = ds_numel + _padding_size``; ``partition_size = tensor_size // world``)."""
        return ceil_div(p.numel, self.world)
