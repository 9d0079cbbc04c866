"""DeepSpeed configuration as typed settings: what the ledger needs, with DeepSpeed's defaults.

Parsed from the user's DeepSpeed JSON by ``memfit.core.dsconfig.parse_deepspeed_config``; every
default here is DeepSpeed 0.19.8's (checked against its own config classes in
``tests/exact/test_dsconfig_against_deepspeed.py``): ``deepspeed/runtime/zero/config.py``
(``DeepSpeedZeroConfig``), ``runtime/zero/offload_config.py``, ``runtime/precision_config.py``,
``runtime/constants.py`` and ``runtime/config.py`` (``DeepSpeedConfig``).

Glossary:
- *element*: one scalar of a tensor; DeepSpeed's bucket and threshold sizes count elements, never
  bytes (the ledger multiplies by the element size of the dtype in use).
- *precision*: the dtype the engine casts the model to (``fp16``/``bf16`` section enabled, else
  fp32).
"""

from __future__ import annotations


from memfit.core.lean_dataclass import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class OffloadSettings:
    """``zero_optimization.offload_optimizer`` or ``zero_optimization.offload_param``.

    An absent section reads as ``device="none"`` (DeepSpeed keeps ``None``; both mean no offload).
    """

    device: str = "none"
    """``none``, ``cpu`` or ``nvme``."""
    pin_memory: bool = True
    """Offload to page-locked host memory (DeepSpeed 0.19.8 default: True; it was False before)."""
    nvme_path: str | None = None
    """Directory of the swap files when ``device`` is ``nvme``."""
    buffer_count: int = 5
    """NVMe swap buffers in the pool: offload_param default 5, offload_optimizer default 4 (the
    parser fills the right one)."""
    buffer_size: int = 100_000_000
    """offload_param: elements per NVMe swap buffer (``buffer_size``; no such key for the
    optimizer)."""
    max_in_cpu: int = 1_000_000_000
    """offload_param: parameter elements kept in host memory when offloading to NVMe."""
    ratio: float = 1.0
    """offload_optimizer: fraction of the optimizer offloaded (below 1 only with ZeRO-3)."""
    pipeline_read: bool = False
    """offload_optimizer (NVMe): overlap the read of the next sub group with the current step."""
    pipeline_write: bool = False
    """offload_optimizer (NVMe): overlap the write of the previous sub group with the current step."""
    fast_init: bool = False
    """offload_optimizer (NVMe): fast optimizer initialization."""
    super_offload: bool = False
    """offload_optimizer: SuperOffload for superchips (ZeRO-3 only)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ZeroSettings:
    """``zero_optimization``: the keys that size or place memory.

    ZeRO-3 keys are named without DeepSpeed's ``stage3_`` prefix (as its pydantic fields are);
    the JSON may use either name (``stage3_prefetch_bucket_size`` or ``prefetch_bucket_size``).
    """

    stage: int = 0
    """0 (off), 1 (optimizer states partitioned), 2 (+ gradients), 3 (+ parameters)."""
    offload_optimizer: OffloadSettings = OffloadSettings(buffer_count=4)
    """Optimizer states and step on the host (cpu) or on NVMe (stages 1-3)."""
    offload_param: OffloadSettings = OffloadSettings()
    """Parameter partitions on the host or on NVMe (used by stage 3 only)."""
    overlap_comm: bool | None = None
    """Overlap gradient reduction with backward. None (not given) resolves here exactly as
    DeepSpeed's ``overlap_comm_valid`` validator does: True for stage 3, False otherwise, so the
    value read back is always a bool."""
    contiguous_gradients: bool = True
    """Copy gradients into a contiguous buffer as they are produced."""
    reduce_scatter: bool = True
    """Reduce-scatter instead of all-reduce for gradient averaging."""
    reduce_bucket_size: int = 500_000_000
    """Elements reduced at a time (the reduce bucket; must be > 0)."""
    allgather_partitions: bool = True
    """Stage 1/2: all-gather updated partitions (False: a series of broadcasts)."""
    allgather_bucket_size: int = 500_000_000
    """Stage 1/2: elements all-gathered at a time."""
    sub_group_size: int = 1_000_000_000
    """Stage 3: optimizer step tile, in elements (bounds the fp32 grad buffer of a sub group)."""
    prefetch_bucket_size: int = 50_000_000
    """Stage 3 (``stage3_prefetch_bucket_size``): elements fetched ahead of use."""
    max_live_parameters: int = 1_000_000_000
    """Stage 3 (``stage3_max_live_parameters``): gathered elements resident before releasing."""
    max_reuse_distance: int = 1_000_000_000
    """Stage 3 (``stage3_max_reuse_distance``): keep a param gathered if reused within this many
    elements."""
    param_persistence_threshold: int = 100_000
    """Stage 3 (``stage3_param_persistence_threshold``): params with fewer elements stay whole on
    every GPU."""
    model_persistence_threshold: int = 2**63 - 1
    """Stage 3 (``stage3_model_persistence_threshold``): cap on the total persistent elements
    (default ``sys.maxsize``)."""
    module_granularity_threshold: int = 0
    """Stage 3 (``stage3_module_granularity_threshold``): modules finer than this are fetched whole."""
    use_all_reduce_for_fetch_params: bool = False
    """Stage 3 (``stage3_use_all_reduce_for_fetch_params``): fetch params with all-reduce."""
    allgather_sequential: bool = False
    """Stage 3 (``stage3_allgather_sequential``): all-gather params one by one, no flat bucket."""
    gather_16bit_weights_on_model_save: bool = False
    """Stage 3 (``stage3_gather_16bit_weights_on_model_save``, or the deprecated
    ``stage3_gather_fp16_weights_on_model_save``): gather full weights to save them."""
    round_robin_gradients: bool = False
    """Stage 1/2 with CPU offload: round-robin gradient copies across ranks."""
    parameter_alignment: bool = False
    """Stage 1/2: pad flat buffers so each param starts 16-byte aligned (more memory)."""
    compute_grad_norm: bool = True
    """Stage 1/2: compute the global gradient norm (False allowed only for stages 1 and 2)."""
    zero_hpz_partition_size: int = 1
    """ZeRO++ hpZ: ranks in the secondary parameter partition group (1: off)."""
    zero_quantized_weights: bool = False
    """ZeRO++ qwZ: quantize weights for the all-gather."""
    zero_quantized_nontrainable_weights: bool = False
    """Store frozen weights quantized (memory saving for LoRA-style training)."""
    zero_quantized_gradients: bool = False
    """ZeRO++ qgZ: quantized gradient all-to-all."""
    memory_efficient_linear: bool = True
    """Stage 3: DeepSpeed's memory-efficient Linear (saves no gathered weight for backward)."""

    def __post_init__(self) -> None:
        if self.overlap_comm is None:
            # deepspeed/runtime/zero/config.py: DeepSpeedZeroConfig.overlap_comm_valid
            object.__setattr__(self, "overlap_comm", self.stage == 3)


@dataclass(frozen=True, slots=True, kw_only=True)
class Fp16Settings:
    """``fp16`` section options besides ``enabled`` (``DeepSpeedFP16Config``)."""

    loss_scale: float = 0.0
    """Static loss scale; 0 means dynamic loss scaling."""
    initial_scale_power: int = 16
    """Dynamic scaling starts at ``2**initial_scale_power``."""
    loss_scale_window: int = 1000
    """Steps between raising the dynamic scale."""
    hysteresis: int = 2
    """Overflows tolerated before lowering the dynamic scale."""
    consecutive_hysteresis: bool = False
    """Refill hysteresis after a step without overflow."""
    min_loss_scale: int = 1
    """Floor of the dynamic loss scale."""
    auto_cast: bool = False
    """Cast the inputs to fp16."""
    fp16_master_weights_and_grads: bool = False
    """Keep master weights and gradients in fp16 instead of fp32 (ZeRO stages 1-3 only)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Bf16Settings:
    """``bf16`` (or the old ``bfloat16``) section options besides ``enabled``
    (``DeepSpeedBF16Config``)."""

    immediate_grad_update: bool = False
    """Apply gradient updates immediately rather than delayed."""
    check_grad_overflow: bool = True
    """Skip the step on gradient overflow."""
    bf16_master_weights_and_grads: bool = False
    """Keep master weights and gradients in bf16 (ZeRO stages 1-3 only)."""
    bf16_optimizer_states: bool = False
    """Keep optimizer states in bf16 (needs ``bf16_master_weights_and_grads``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class OptimizerSettings:
    """``optimizer`` (absent: the client passes its own optimizer; memfit assumes AdamW, the
    transformers Trainer's default)."""

    type: str = "adamw"
    """Lower-cased optimizer name: DeepSpeed's own (``adam``, ``adamw``, ``adagrad``, ``lamb``,
    ``lion``, ``muadam``, ``muadamw``, ``musgd``) or a ``torch.optim`` class (``sgd``,
    ``rmsprop``, ...)."""
    states_per_param: int = 2
    """State tensors per trainable element (Adam/AdamW/Lamb: exp_avg and exp_avg_sq = 2, 3 with
    torch AMSGrad; SGD with momentum 1, without 0; Adagrad 1; Lion 1 on GPU, 2 offloaded, as
    DeepSpeedCPULion also allocates exp_avg_sq). See ``dsconfig.optimizer_states_per_param``."""
    params: tuple[tuple[str, object], ...] = ()
    """The optimizer's ``params`` as given (lr, betas, ...), "auto" resolved, for reports."""
    in_config: bool = False
    """The JSON has an ``optimizer`` section with a ``type`` (DeepSpeed builds the optimizer)."""
    adam_w_mode: bool = True
    """Adam/AdamW: decoupled weight decay. DeepSpeed's ``"type": "Adam"`` means AdamW unless
    ``adam_w_mode`` is false (engine.py ``_configure_basic_optimizer``); no effect on memory."""
    torch_adam: bool = False
    """Adam/AdamW: ``torch_adam`` asks for ``torch.optim.Adam(W)`` instead of FusedAdam/CPUAdam."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DeepSpeedSettings:
    """The whole DeepSpeed config, resolved (no ``"auto"`` left)."""

    precision: str = "fp32"
    """``fp16``, ``bf16`` or ``fp32``: dtype of the model's params and activations."""
    grad_accum_dtype: str | None = None
    """``data_types.grad_accum_dtype`` as ``fp16``/``bf16``/``fp32``; None means DeepSpeed's
    default: the precision (engine.py ``get_data_types``)."""
    param_dtype: str | None = None
    """``data_types.param_dtype`` as ``fp16``/``bf16``/``fp32``; None: the precision."""
    communication_data_type: str | None = None
    """``communication_data_type`` (``fp16``/``bf16``/``fp32``); None: the precision
    (engine.py ``communication_data_type``)."""
    zero: ZeroSettings = ZeroSettings()
    """``zero_optimization``."""
    fp16: Fp16Settings = Fp16Settings()
    """``fp16`` options (meaningful when ``precision`` is fp16)."""
    bf16: Bf16Settings = Bf16Settings()
    """``bf16`` options (meaningful when ``precision`` is bf16)."""
    optimizer: OptimizerSettings = OptimizerSettings()
    """``optimizer``."""
    has_scheduler: bool = False
    """The JSON has a ``scheduler`` section with a ``type``."""
    scheduler_type: str | None = None
    """``scheduler.type`` as given (e.g. ``WarmupLR``)."""
    zero_allow_untested_optimizer: bool = False
    """Lets ZeRO run an optimizer DeepSpeed has not tested with it (Lamb, SGD, ...)."""
    train_micro_batch_size_per_gpu: int = 1
    """Sequences per GPU per micro-step."""
    gradient_accumulation_steps: int = 1
    """Micro-steps per optimizer step."""
    train_batch_size: int | None = 1
    """``micro x accumulation x world size``; None when the world size is unknown and the JSON
    does not give it."""
    world_size: int | None = None
    """Data-parallel world size the batch sizes were checked against (None: not known)."""
    gradient_clipping: float = 1.0
    """Clip the global gradient norm to this (0: off). DeepSpeed 0.19.8's default is 1.0."""
    activation_checkpointing: bool = False
    """DeepSpeed's own ``activation_checkpointing`` section is present (it only acts when the model
    calls ``deepspeed.checkpointing``; informational)."""
    notes: tuple[str, ...] = ()
    """One-line remarks on the config: deprecated keys, defaults filled."""
    warnings: tuple[str, ...] = ()
    """Keys DeepSpeed ignores (misspelled or unknown keys, sections the ZeRO stage does not use):
    printed as warnings and listed as findings."""
    auto_resolved: tuple[str, ...] = ()
    """One line per ``"auto"`` memfit resolved: the key, its value and why (listed in a finding)."""
