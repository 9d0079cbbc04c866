"""How a run is trained when it is not (only) DeepSpeed: the framework, the precision mode, the
optimizer, bitsandbytes quantization of the base model, DDP and FSDP settings, as typed settings.

Parsed once at the edge (scenario YAML, flags, a TrainingArguments/SFTConfig file, a
BitsAndBytesConfig JSON, an accelerate config YAML); the recipes in ``memfit.core.ledger`` read these.

Glossary:
- *framework*: ``deepspeed`` (``deepspeed.initialize``), ``torch`` (one process, one GPU: a plain
  PyTorch loop or the Hugging Face Trainer without DeepSpeed/FSDP), ``ddp``
  (``DistributedDataParallel``), ``fsdp`` (FSDP1, ``FullyShardedDataParallel``), ``fsdp2``
  (``fully_shard``).
- *precision mode*: ``fp32``; ``amp_fp16``/``amp_bf16`` (fp32 weights, ``torch.autocast`` casts to
  16 bits per op; fp16 adds a ``GradScaler``); ``fp16``/``bf16`` (pure: the model itself is 16-bit,
  so are its gradients and its optimizer states).
- *optim*: the Hugging Face Trainer's ``optim`` string (``transformers.training_args.OptimizerNames``).
"""

from __future__ import annotations


from memfit.core.lean_dataclass import dataclass
from memfit.errors import MemfitError

FRAMEWORKS = ("deepspeed", "torch", "ddp", "fsdp", "fsdp2")
PRECISION_MODES = ("fp32", "amp_fp16", "amp_bf16", "fp16", "bf16")
OPTIMIZERS = ("adamw_torch", "adamw_torch_fused", "adamw_torch_foreach", "adamw_torch_single", "adamw_hf", "sgd",
              "adafactor", "adamw_bnb_8bit", "adamw_8bit", "paged_adamw_8bit", "paged_adamw_32bit",
              "lion_32bit", "lion_8bit", "paged_lion_32bit", "paged_lion_8bit", "adagrad")
"""Trainer ``optim`` strings memfit models, plus ``adamw_torch_foreach``/``adamw_torch_single``
(``torch.optim.AdamW(foreach=True/False)``, what a plain loop may choose)."""
QUANT_METHODS = ("none", "4bit", "8bit")
QUANT_TYPES = ("nf4", "fp4")
STORAGE_DTYPES = ("uint8", "fp16", "bf16", "fp32")
FSDP_STRATEGIES = ("FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD", "NO_SHARD", "_HYBRID_SHARD_ZERO2")


@dataclass(frozen=True, slots=True, kw_only=True)
class TorchSettings:
    """The training loop outside DeepSpeed (the Trainer's ``TrainingArguments`` or a plain loop)."""

    precision: str = "fp32"
    """One of ``PRECISION_MODES`` (see the module docstring)."""
    optim: str = "adamw_torch"
    """One of ``OPTIMIZERS``."""
    momentum: float = 0.0
    """sgd: ``momentum`` (Trainer ``optim_args="momentum=0.9"``; torch's default 0: no state)."""
    beta1: float | None = None
    """adafactor: ``beta1`` (None, the Trainer's: no first moment)."""
    weight_decay: float = 0.0
    """Trainer ``weight_decay`` (0: AdamW's decay is a no-op but the two param groups remain)."""
    gradient_accumulation_steps: int = 1
    max_grad_norm: float = 1.0
    """Trainer ``max_grad_norm``: ``clip_grad_norm_`` after unscaling (0: no clipping)."""
    trainer_param_groups: bool = True
    """Params split as the Trainer's ``create_optimizer`` does (weight decay, then no decay);
    False: one group of all trained params (a plain loop)."""

    def __post_init__(self) -> None:
        if self.precision not in PRECISION_MODES:
            raise MemfitError(f"precision must be one of {', '.join(PRECISION_MODES)}, got {self.precision!r}")
        if self.optim not in OPTIMIZERS:
            raise MemfitError(f"optim must be one of {', '.join(OPTIMIZERS)}, got {self.optim!r}")
        if self.gradient_accumulation_steps < 1:
            raise MemfitError(f"gradient_accumulation_steps must be >= 1, got {self.gradient_accumulation_steps}")
        if self.momentum < 0 or self.weight_decay < 0 or self.max_grad_norm < 0:
            raise MemfitError("momentum, weight_decay and max_grad_norm must be >= 0")


@dataclass(frozen=True, slots=True, kw_only=True)
class QuantSettings:
    """bitsandbytes quantization of the base model (``BitsAndBytesConfig``)."""

    method: str = "none"
    """``none``, ``4bit`` (``load_in_4bit``) or ``8bit`` (``load_in_8bit``, LLM.int8())."""
    quant_type: str = "fp4"
    """4bit: ``bnb_4bit_quant_type`` (``fp4``, BitsAndBytesConfig's default, or ``nf4``)."""
    double_quant: bool = False
    """4bit: ``bnb_4bit_use_double_quant`` (absmax quantized to 8 bits per block of 256)."""
    compute_dtype: str = "fp32"
    """4bit: ``bnb_4bit_compute_dtype`` (BitsAndBytesConfig's default: float32)."""
    quant_storage: str = "uint8"
    """4bit: ``bnb_4bit_quant_storage``: the dtype the packed weights are stored as (FSDP and ZeRO-3
    shard by it; bf16 lets them be flattened with bf16 params)."""
    skip_modules: tuple[str, ...] | None = None
    """``llm_int8_skip_modules``: module names kept unquantized (``None``: transformers' default, the
    output embeddings, tied weights and the last module; an empty list: nothing is kept, the output
    head is quantized too: ``HfQuantizer.get_modules_to_not_convert`` adds the defaults only for None)."""
    prepare_kbit: bool = True
    """``peft.prepare_model_for_kbit_training`` is called (upcasts the non-quantized params to fp32;
    TRL's SFTTrainer calls it for a quantized model with a PEFT config)."""

    def __post_init__(self) -> None:
        if self.method not in QUANT_METHODS:
            raise MemfitError(f"quantization must be one of {', '.join(QUANT_METHODS)}, got {self.method!r}")
        if self.quant_type not in QUANT_TYPES:
            raise MemfitError(f"bnb_4bit_quant_type must be one of {', '.join(QUANT_TYPES)}, got {self.quant_type!r}")
        if self.compute_dtype not in ("fp32", "fp16", "bf16"):
            raise MemfitError(f"bnb_4bit_compute_dtype must be fp32, fp16 or bf16, got {self.compute_dtype!r}")
        if self.quant_storage not in STORAGE_DTYPES:
            raise MemfitError(f"bnb_4bit_quant_storage must be one of {', '.join(STORAGE_DTYPES)}, got {self.quant_storage!r}")

    @property
    def enabled(self) -> bool:
        return self.method != "none"


@dataclass(frozen=True, slots=True, kw_only=True)
class DdpSettings:
    """``torch.nn.parallel.DistributedDataParallel`` (Trainer: ``ddp_*`` arguments)."""

    bucket_cap_mb: float = 25.0
    """``bucket_cap_mb`` (MiB, torch's default 25; the first bucket is 1 MiB,
    ``dist._DEFAULT_FIRST_BUCKET_BYTES``)."""
    gradient_as_bucket_view: bool = False
    """Gradients are views into the buckets (no separate ``.grad`` tensors)."""
    find_unused_parameters: bool = False
    static_graph: bool = False
    broadcast_buffers: bool = True


@dataclass(frozen=True, slots=True, kw_only=True)
class FsdpSettings:
    """FSDP1 (``FullyShardedDataParallel``) and FSDP2 (``fully_shard``), as accelerate configures them."""

    sharding_strategy: str = "FULL_SHARD"
    """FSDP1 ``ShardingStrategy``; FSDP2 reads FULL_SHARD as ``reshard_after_forward=True`` and
    SHARD_GRAD_OP as ``False``."""
    wrap_policy: str = "transformer"
    """``transformer`` (TRANSFORMER_BASED_WRAP: one unit per decoder layer), ``size``
    (SIZE_BASED_WRAP, ``min_num_params``), ``none`` (one unit, the root) or ``peft`` (peft's
    ``fsdp_auto_wrap_policy``: the decoder layers and every trainable leaf module, each LoRA Linear a
    unit of its own; what the Trainer uses for a PEFT model from transformers 4.39)."""
    min_num_params: int = 100_000_000
    """SIZE_BASED_WRAP threshold (accelerate's default 1e8)."""
    use_orig_params: bool = True
    """FSDP1 ``use_orig_params`` (accelerate's default True)."""
    cpu_offload: bool = False
    """FSDP1 ``CPUOffload(offload_params=True)`` / FSDP2 ``CPUOffloadPolicy``: sharded params,
    their gradients and the optimizer step on the host (pinned)."""
    mixed_precision: str = "none"
    """``none``, ``fp16`` or ``bf16``: ``MixedPrecision(param_dtype=..., reduce_dtype=...)`` /
    ``MixedPrecisionPolicy``: fp32 sharded params, 16-bit unsharded copies for compute."""
    limit_all_gathers: bool = True
    """FSDP1: at most two in-flight all-gathers (the rate limiter)."""
    backward_prefetch: str = "BACKWARD_PRE"
    """FSDP1 ``BackwardPrefetch``: ``BACKWARD_PRE``, ``BACKWARD_POST`` or ``NO_PREFETCH``."""
    forward_prefetch: bool = False
    hsdp_shard_size: int | None = None
    """HYBRID_SHARD: ranks per shard group (default: the GPUs of one node)."""
    cpu_ram_efficient_loading: bool = True
    """accelerate ``fsdp_cpu_ram_efficient_loading``: only rank 0 loads the weights; the others
    build the model on the meta device and receive the shards (``sync_module_states``)."""

    def __post_init__(self) -> None:
        if self.sharding_strategy not in FSDP_STRATEGIES:
            raise MemfitError(f"FSDP sharding strategy must be one of {', '.join(FSDP_STRATEGIES)}, "
                              f"got {self.sharding_strategy!r}")
        if self.wrap_policy not in ("transformer", "size", "none", "peft"):
            raise MemfitError(f"FSDP wrap policy must be transformer, size, none or peft, got {self.wrap_policy!r}")
        if self.mixed_precision not in ("none", "fp16", "bf16"):
            raise MemfitError(f"FSDP mixed precision must be none, fp16 or bf16, got {self.mixed_precision!r}")
        if self.backward_prefetch not in ("BACKWARD_PRE", "BACKWARD_POST", "NO_PREFETCH"):
            raise MemfitError(f"FSDP backward_prefetch must be BACKWARD_PRE, BACKWARD_POST or NO_PREFETCH, "
                              f"got {self.backward_prefetch!r}")
