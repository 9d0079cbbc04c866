"""The ZeRO paper's model-states figures, produced by the same ledger code as every plan.

Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models"
(SC'20), Figure 1 / section 5: a 7.5B-parameter model trained with mixed-precision Adam
(K = 12 bytes of optimizer state per parameter) on N_d = 64 GPUs holds, per device,
120 GB (no partitioning: (2 + 2 + K) x Psi), 31.4 GB (P_os, stage 1: 2Psi + 2Psi + K Psi/N_d),
16.6 GB (P_os+g, stage 2: 2Psi + (2 + K) Psi/N_d) and 1.88 GB (P_os+g+p, stage 3:
(2 + 2 + K) Psi/N_d). GB = 10**9 bytes, as in the paper.

"Model states" are what the ledger has resident on the GPU when a steady-state backward ends
(``step2.backward``: parameters, this step's gradients and the optimizer states together), in the
categories params, grads and optimizer (no activations, buffers or CUDA context).
"""

from __future__ import annotations


from memfit.core.lean_dataclass import dataclass
from memfit.core.frameworks.deepspeed import DeepSpeedSettings, OptimizerSettings, ZeroSettings
from memfit.core.hardware import GpuSpec, Hardware
from memfit.core.ledger.build import build_ledger
from memfit.core.ledger_types import Device
from memfit.core.model import ArchSpec, ModelShape, ParamSpec
from memfit.core.peft.spec import PeftSpec
from memfit.core.scenario.types import LoadSettings, Scenario, TrainSettings

PAPER_PARAMS = 7_500_000_000
PAPER_GPUS = 64
PAPER_FIGURES_GB = {0: 120.0, 1: 31.4, 2: 16.6, 3: 1.88}
"""As printed in the paper (rounded there to these digits)."""
MODEL_STATE_CATEGORIES = ("params", "grads", "optimizer")


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelStates:
    stage: int
    bytes_per_gpu: int
    paper_gb: float


def paper_model(params: int = PAPER_PARAMS, pieces: int = 1) -> ModelShape:
    """A model that is nothing but Psi trainable parameters (the paper's abstraction), as ``pieces``
    equal tensors (the last one takes the remainder). The paper partitions the gradients perfectly;
    DeepSpeed's ZeRO-2 keeps each param of a rank's partition whole (stage_1_and_2.py
    ``copy_grads_in_partition``), so one Psi-sized tensor would leave every rank the whole gradient:
    one tensor per rank, whose boundaries are the partitions', is the paper's case."""
    arch = ArchSpec(model_type="abstract", num_layers=1, hidden_size=1, num_heads=1, num_kv_heads=1,
                    head_dim=1, intermediate_size=1, vocab_size=1)
    size = params // pieces
    shapes = [size] * (pieces - 1) + [params - size * (pieces - 1)]
    return ModelShape(name=f"Psi = {params:,}", architecture="(abstract)", arch=arch,
                      params=tuple(ParamSpec(name=f"weights.{k}", shape=(n,)) for k, n in enumerate(shapes)))


def model_states_per_gpu(stage: int, *, params: int = PAPER_PARAMS, gpus: int = PAPER_GPUS) -> int:
    """Model-state bytes per GPU from the ledger: fp16 mixed precision, Adam, no offload."""
    sc = Scenario(
        name=f"ZeRO paper, stage {stage}", model_ref="zero-paper", model=paper_model(params, gpus),
        peft=PeftSpec(method="full"),
        deepspeed=DeepSpeedSettings(precision="fp16", zero=ZeroSettings(stage=stage),
                                    optimizer=OptimizerSettings(type="adam", states_per_param=2)),
        hardware=Hardware(gpu=GpuSpec(name="v100-32gb", total_bytes=32 * 2**30), gpus_per_node=gpus),
        load=LoadSettings(dtype="fp16"),
        train=TrainSettings(seq_len=1),
    )
    step = next(p for p in build_ledger(sc) if p.name == "step2.backward")
    return sum(i.bytes for i in step.resident
               if i.device is Device.GPU and i.category in MODEL_STATE_CATEGORIES)


def zero_paper_table() -> tuple[ModelStates, ...]:
    return tuple(ModelStates(stage=s, bytes_per_gpu=model_states_per_gpu(s), paper_gb=PAPER_FIGURES_GB[s])
                 for s in (0, 1, 2, 3))
