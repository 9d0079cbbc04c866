"""DeepSpeed configuration as typed settings: what the ledger needs, with DeepSpeed's defaults.

Parsed from the user's DeepSpeed JSON by ``memfit.core.dsconfig.parse_deepspeed_config``; every
default here is DeepSpeed 0.19.8's (checked against its own config classes in the tests).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class OffloadSettings:
    """``offload_optimizer`` or ``offload_param``."""

    device: str = "none"
    """``none``, ``cpu`` or ``nvme``."""
    pin_memory: bool = False
    nvme_path: str | None = None
    buffer_count: int = 5
    """offload_param: number of NVMe swap buffers (``buffer_count``); optimizer: 4."""
    buffer_size: int = 100_000_000
    """offload_param NVMe buffer size in elements."""
    ratio: float = 1.0
    """offload_optimizer: fraction of the optimizer offloaded (ZeRO-3 partial offload)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ZeroSettings:
    """``zero_optimization``."""

    stage: int = 0
    offload_optimizer: OffloadSettings = OffloadSettings()
    offload_param: OffloadSettings = OffloadSettings()
    overlap_comm: bool | None = None
    """None: DeepSpeed decides (True for stage 3, False otherwise)."""
    contiguous_gradients: bool = True
    reduce_scatter: bool = True
    reduce_bucket_size: int = 500_000_000
    allgather_bucket_size: int = 500_000_000
    sub_group_size: int = 1_000_000_000
    prefetch_bucket_size: int = 50_000_000
    max_live_parameters: int = 1_000_000_000
    max_reuse_distance: int = 1_000_000_000
    param_persistence_threshold: int = 100_000
    model_persistence_threshold: int = 2**63 - 1
    gather_16bit_weights_on_model_save: bool = False
    round_robin_gradients: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class OptimizerSettings:
    """``optimizer`` (absent: the client passes its own optimizer; memfit assumes Adam)."""

    type: str = "adamw"
    """Lower-cased DeepSpeed optimizer name: ``adam``, ``adamw``, ``sgd``, ``adagrad``, ``lamb``..."""
    states_per_param: int = 2
    """fp32 state tensors per trainable element (Adam/AdamW: exp_avg and exp_avg_sq = 2; SGD with
    momentum 1, without 0; Adagrad 1)."""
    params: tuple[tuple[str, object], ...] = ()
    """The optimizer's ``params`` as given (lr, betas, ...), for reports."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DeepSpeedSettings:
    """The whole DeepSpeed config, resolved (no ``"auto"`` left)."""

    precision: str = "fp32"
    """``fp16``, ``bf16`` or ``fp32``: dtype of the model's params and activations."""
    grad_accum_dtype: str | None = None
    """``data_types.grad_accum_dtype``; None means DeepSpeed's default for the precision."""
    zero: ZeroSettings = ZeroSettings()
    optimizer: OptimizerSettings = OptimizerSettings()
    has_scheduler: bool = False
    train_micro_batch_size_per_gpu: int = 1
    gradient_accumulation_steps: int = 1
    train_batch_size: int = 1
    gradient_clipping: float = 0.0
    activation_checkpointing: bool = False
    """DeepSpeed's own activation checkpointing section present and used (informational)."""
