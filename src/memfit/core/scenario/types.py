"""A training scenario: every input a plan needs, typed, validated once.

Built from CLI flags, a scenario YAML file (flags override the file), or the Python API. The model,
PEFT method and DeepSpeed config are kept both as the user gave them (for replays, which rebuild
the real thing) and resolved (for the ledger).
"""

from __future__ import annotations

from dataclasses import field

from memfit.core.lean_dataclass import dataclass
from memfit.core.batch_shapes import BatchShape, LengthDistribution
from memfit.core.checkpoint import CheckpointLayout
from memfit.core.frameworks.deepspeed import DeepSpeedSettings
from memfit.core.frameworks.pytorch import FRAMEWORKS, DdpSettings, FsdpSettings, QuantSettings, TorchSettings
from memfit.core.hardware import Hardware
from memfit.core.model import ModelShape
from memfit.core.peft.spec import PeftSpec
from memfit.core.quant_kernels import DEFAULT_BNB_VERSION, bnb_release
from memfit.core.stack.types import Stack
from memfit.errors import MemfitError

DS_VERSIONS = ("0.19", "0.6", "0.5")
"""Allocation behaviours memfit models: the current release line (0.19.x, also 0.13-0.18 where
nothing changed), 0.6.x (Feb 2022) and 0.5.x (Jan 2022, the seed case's era)."""

DTYPES = ("fp32", "fp16", "bf16")


FSDP_LOADINGS = {
    "rank0_host": "rank 0 reads the weights into its host memory, the other ranks build on the meta device",
    "rank0_host_quantized": "each weight is quantized on the GPU, its packed storage kept on rank 0's host (meta "
                            "elsewhere), its quantization state on the GPU",
    "every_rank_host_quantized": "each weight is quantized on the GPU, its packed storage kept on every rank's host",
    "every_rank": "every rank loads the whole model (a bitsandbytes model onto its GPU)",
}
"""``LoadSettings.fsdp_loading``'s values: the loading modes of ``FsdpRun`` (``ledger/pytorch/fsdp.py``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadSettings:
    """How the user's script builds the model before ``deepspeed.initialize``."""

    dtype: str = "fp32"
    """``torch_dtype`` of ``from_pretrained`` (the stack's default when the script gives none:
    ``stack.transformers.load_dtype_default``)."""
    dtype_why: str = ""
    """Where ``dtype`` came from when no input gave it (the stack's rule, said as an assumption)."""
    zero_init: bool = False
    """Built under ``deepspeed.zero.Init`` (or with transformers' ``HfDeepSpeedConfig`` alive
    before ``from_pretrained``): params are partitioned as they are created."""
    low_cpu_mem_usage: bool = True
    """from_pretrained loads weights straight into the model (current transformers always does);
    False: older transformers built a random model and held the state dict too (2x host memory)."""

    fsdp_loading: str | None = None
    """Under FSDP, how the script's own loader fills the model, one of ``FSDP_LOADINGS``, given where
    the script does not load through ``from_pretrained`` (e.g. Answer.AI's fsdp_qlora train.py with
    ``low_memory``: rank 0 quantizes each weight on its GPU and keeps it on its host, the other ranks
    on the meta device, as ``rank0_host_quantized``). None: as the stack's ``from_pretrained`` does
    (``stack.transformers.fsdp_efficient_loading``)."""

    from_checkpoint: bool = True
    """Weights are read from a checkpoint (from_pretrained). False: built from the config with
    random weights (from_config), as replays do; no checkpoint is held in host memory."""
    checkpoint: CheckpointLayout | None = None
    """The checkpoint's shards (``memfit.core.checkpoint``), loaded one at a time; None: one file
    holding every base parameter in the load dtype."""

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise MemfitError(f"load dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.fsdp_loading is not None and self.fsdp_loading not in FSDP_LOADINGS:
            raise MemfitError(f"load.fsdp_loading: invalid value {self.fsdp_loading!r:.40}; valid: "
                              f"{', '.join(FSDP_LOADINGS)}")


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainSettings:
    """The step being run."""

    seq_len: int = 2048
    micro_batch: int = 1
    """Sequences per GPU per micro-step (DeepSpeed's train_micro_batch_size_per_gpu)."""
    gradient_checkpointing: bool = False
    model_parameters: str = "trainable"
    """What the script passes as ``deepspeed.initialize(model_parameters=...)``: ``trainable``
    (only requires_grad params, e.g. ``model.prefix_encoder.parameters()``) or ``all``."""
    attention: str = "sdpa"
    """Attention implementation (``memfit.core.families.attention.IMPLEMENTATIONS``): ``eager``
    materializes the score matrix; ``sdpa``, ``flash_attention_2/3`` and ``flex_attention`` keep a
    logsumexp instead. ``build_scenario`` resolves it per family (transformers' default when not given)."""
    target_len: int | None = None
    """Encoder-decoder models: decoder tokens per sequence (``seq_len`` is the encoder's); None: seq_len."""
    batch_shape: BatchShape | None = None
    """From a length distribution: the largest batch the batching rule forms (``seq_len`` is its length)."""
    dataloader_workers: int = 0
    """``DataLoader(num_workers=...)``: forked worker processes per rank (their host memory)."""
    dataloader_pin_memory: bool = False
    """``DataLoader(pin_memory=True)``: each batch copied to page-locked memory (the Trainer's default)."""
    dataset_tokens: int = 0
    """Tokens of the tokenized dataset held in memory (0: not given, not counted)."""
    save: bool = True
    """The run saves the model at the end (``save_pretrained`` / the framework's full state dict): the
    plan's save phase; False drops it (``core/plan.py``)."""

    def __post_init__(self) -> None:
        if self.dataloader_workers < 0 or self.dataset_tokens < 0:
            raise MemfitError(f"dataloader_workers and dataset_tokens must be >= 0, got {self.dataloader_workers} "
                              f"and {self.dataset_tokens}")
        if self.seq_len < 1 or self.micro_batch < 1:
            raise MemfitError(f"seq_len and micro_batch must be >= 1, got {self.seq_len} and {self.micro_batch}")
        if self.model_parameters not in ("trainable", "all"):
            raise MemfitError(f"model_parameters must be 'trainable' or 'all', got {self.model_parameters!r}")
        from memfit.core.families.attention import IMPLEMENTATIONS

        if self.attention not in IMPLEMENTATIONS:
            raise MemfitError(f"attention must be one of {', '.join(IMPLEMENTATIONS)}, got {self.attention!r}")
        if self.target_len is not None and self.target_len < 1:
            raise MemfitError(f"target_len must be >= 1, got {self.target_len}")


EVAL_STRATEGIES = ("no", "steps", "epoch")


@dataclass(frozen=True, slots=True, kw_only=True)
class EvalSettings:
    """The Trainer's evaluation during training (``Trainer.evaluate`` at ``eval_strategy``), and its
    generation (``Seq2SeqTrainer`` with ``predict_with_generate``): ``core/ledger/evaluation.py``."""

    strategy: str = "no"
    """``eval_strategy``: ``no`` (no evaluation phases), ``steps`` (every ``steps``) or ``epoch``."""
    batch: int = 8
    """``per_device_eval_batch_size`` (transformers' default 8)."""
    seq_len: int | None = None
    """Tokens of an eval input (None: the training seq_len); the prompt length of ``generate``."""
    generate: bool = False
    """``predict_with_generate``: ``prediction_step`` calls ``model.generate``."""
    max_new_tokens: int | None = None
    """Tokens generated (``generation_max_length`` for an encoder-decoder, whose decoder starts empty;
    for a decoder-only model ``generation_max_length`` minus the prompt)."""
    num_beams: int = 1
    """``generation_num_beams`` (``num_beams`` of the generation config; 1: greedy)."""
    steps: int | None = None
    """``eval_steps``: optimizer steps between evaluations (``strategy`` steps)."""
    source: str = ""
    """Where the settings came from, in words."""

    @property
    def enabled(self) -> bool:
        return self.strategy != "no"

    def __post_init__(self) -> None:
        if self.strategy not in EVAL_STRATEGIES:
            raise MemfitError(f"eval_strategy must be one of {', '.join(EVAL_STRATEGIES)}, got {self.strategy!r}")
        if self.batch < 1 or self.num_beams < 1:
            raise MemfitError(f"eval batch and num_beams must be >= 1, got {self.batch} and {self.num_beams}")
        if self.generate and not self.max_new_tokens:
            raise MemfitError("predict_with_generate needs the length to generate: generation_max_length or "
                              "max_new_tokens")


@dataclass(frozen=True, slots=True, kw_only=True)
class EpochSettings:
    """The epoch simulation (``core/epoch/``): many steps of the batch shapes the data gives, through one
    CUDA caching allocator whose cache carries from step to step."""

    simulate: bool = False
    lengths: LengthDistribution | None = None
    """Token counts of the samples (``--lengths``); None with ``simulate``: ``default_lengths``."""
    default_lengths: bool = False
    """No distribution was given: memfit's stated default (``core/epoch/shapes.py:default_distribution``)."""
    rule: str = "pad-longest"
    """``pad-longest``, ``bucket`` (group_by_length) or ``pack``."""
    max_seq_length: int | None = None
    steps: int | None = None
    """Optimizer steps to simulate (None: one epoch, at most ``core/epoch/simulate.MAX_STEPS``)."""
    empty_cache_steps: int | None = None
    """``torch_empty_cache_steps``: ``torch.cuda.empty_cache()`` after the forward of every step whose
    global step is a multiple of it (``Trainer.training_step``)."""
    seed: int = 0
    """Of the sampler's shuffle (the epoch is one draw of the batch order)."""


PIN_MEMORY_BACKENDS = ("torch", "native")


@dataclass(frozen=True, slots=True, kw_only=True)
class RuntimeSettings:
    """The software stack under DeepSpeed: which allocator rules apply (see ``core/alloc``)."""

    torch_version: str = "2.13"
    """torch release line (``core/alloc/versions.py``); the default is the release whose source was read."""
    alloc_conf: str = ""
    """``PYTORCH_CUDA_ALLOC_CONF`` as the run sets it (empty: torch's defaults)."""
    cuda_version: str | None = None
    """CUDA of the torch build (None: the usual one for that torch release)."""
    pin_memory_backend: str = "torch"
    """DeepSpeed 0.19's ``DS_PIN_MEMORY_BACKEND``: ``torch`` (tensor.pin_memory()) or ``native`` (mlock)."""
    alloc_conf_source: str = ""
    """Where ``alloc_conf`` came from when not typed in (e.g. the environment, on request)."""
    bitsandbytes_version: str = DEFAULT_BNB_VERSION
    """bitsandbytes release (``memfit.core.quant_kernels``: what its 4-bit and 8-bit matmuls keep);
    the default is the one installed here, and a plan with quantization says when it assumed it."""
    bitsandbytes_version_given: bool = False
    """The version came from the user (else the plan notes the assumption)."""

    def __post_init__(self) -> None:
        from memfit.core.alloc.conf import parse_alloc_conf
        from memfit.core.alloc.versions import resolve_torch_version

        version = resolve_torch_version(self.torch_version)
        parse_alloc_conf(self.alloc_conf, version)
        if self.cuda_version is not None:
            parts = str(self.cuda_version).split(".")
            if not (1 <= len(parts) <= 3 and all(p.isdigit() for p in parts)):
                raise MemfitError(f"--cuda-version: expected e.g. 12.8 or 11.3, got {self.cuda_version!r}")
        bnb_release(self.bitsandbytes_version)  # a version memfit did not read is refused in one line
        if self.pin_memory_backend not in PIN_MEMORY_BACKENDS:
            raise MemfitError(f"--pin-memory-backend must be one of {', '.join(PIN_MEMORY_BACKENDS)}, "
                              f"got {self.pin_memory_backend!r}")


@dataclass(frozen=True, slots=True)
class Assumption:
    """A value the plan uses that no input gave: what it is, the value, and where it comes from."""

    kind: str
    """``hardware``, ``lengths``, ``stack`` or ``defaults``: the group it is shown in."""
    what: str
    value: str
    why: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Scenario:
    """Everything a plan needs."""

    name: str
    model_ref: str
    """Model as the user named it (catalog name, hub id or path)."""
    model: ModelShape
    """The trained model: base params plus PEFT params, with trainable flags applied."""
    peft: PeftSpec
    deepspeed: DeepSpeedSettings
    deepspeed_json: dict = field(default_factory=dict, hash=False, compare=False)
    """The user's DeepSpeed config with "auto" resolved, as handed to ``deepspeed.initialize``
    by replays (the core reads ``deepspeed`` only)."""
    hardware: Hardware
    load: LoadSettings = LoadSettings()
    train: TrainSettings = TrainSettings()
    ds_version: str = "0.19"
    accelerator: str = "cuda"
    """``cuda``: GPU plus host memory; ``cpu``: DeepSpeed's CPU accelerator, where the "device" is
    host memory, moves to it are no-ops and nothing is pinned (what CPU replays run)."""
    runtime: RuntimeSettings = RuntimeSettings()
    """torch version, PYTORCH_CUDA_ALLOC_CONF, CUDA version, DeepSpeed's pinning backend."""
    framework: str = "deepspeed"
    """``deepspeed``, ``torch`` (one GPU, a plain loop or the Trainer), ``ddp``, ``fsdp`` or
    ``fsdp2`` (see ``memfit.core.frameworks.pytorch``)."""
    torch: TorchSettings = TorchSettings()
    """Precision mode, optimizer and loop settings of the non-DeepSpeed frameworks."""
    quant: QuantSettings = QuantSettings()
    """bitsandbytes quantization of the base model (any framework)."""
    ddp: DdpSettings = DdpSettings()
    fsdp: FsdpSettings = FsdpSettings()
    eval: EvalSettings = EvalSettings()
    epoch: EpochSettings = EpochSettings()
    input_notes: tuple[str, ...] = field(default=(), hash=False, compare=False)
    """What memfit resolved or ignored while reading the input files (TrainingArguments, ...)."""
    input_warnings: tuple[str, ...] = field(default=(), hash=False, compare=False)
    """What a library would ignore in the input files, or memfit reads but does not model."""
    assumptions: tuple[Assumption, ...] = field(default=(), hash=False, compare=False)
    """Every value the plan uses that no input gave (``memfit.core.scenario.assumptions``)."""
    stack: Stack | None = field(default=None, hash=False, compare=False)
    """The software stack (``memfit.core.stack``), given, read or assumed per library; ``ds_version``
    and ``runtime``'s torch and CUDA versions are its views (``build_scenario`` derives them from
    it). None for a scenario built directly from those fields (tests, replays): ``stack_of`` derives
    one."""

    def __post_init__(self) -> None:
        if self.framework not in FRAMEWORKS:
            raise MemfitError(f"framework must be one of {', '.join(FRAMEWORKS)}, got {self.framework!r}")
        if self.ds_version not in DS_VERSIONS:
            raise MemfitError(f"--deepspeed-version must be one of {', '.join(DS_VERSIONS)}, got {self.ds_version!r}")
        if self.accelerator not in ("cuda", "cpu"):
            raise MemfitError(f"accelerator must be 'cuda' or 'cpu', got {self.accelerator!r}")
        if self.runtime.pin_memory_backend == "native" and self.ds_version != "0.19":
            raise MemfitError("--pin-memory-backend native (DS_PIN_MEMORY_BACKEND) exists in DeepSpeed 0.19 only")
        if self.framework == "deepspeed" and self.load.dtype != "fp32" and self.deepspeed.precision == "fp32":
            # engine.py _configure_distributed_model casts only when fp16 or bf16 is enabled
            why = f" ({self.load.dtype_why})" if self.load.dtype_why else ""
            raise MemfitError(
                f"the model is loaded in {self.load.dtype}{why} but the DeepSpeed config enables neither fp16 nor bf16: "
                f"DeepSpeed then trains the {self.load.dtype} parameters as they are, which memfit's ledger does not "
                f"model; load in fp32 (--load-dtype fp32) or enable {self.load.dtype} in the config")

    @property
    def world_size(self) -> int:
        return self.hardware.world_size

    @property
    def versions(self) -> Stack:
        """The stack, given or derived from ``ds_version`` and ``runtime`` (see ``stack``)."""
        if self.stack is not None:
            return self.stack
        from memfit.core.stack.resolve import stack_from_fields

        return stack_from_fields(self)
