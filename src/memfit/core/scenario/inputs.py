"""The inputs of a scenario as the user gives them (``ScenarioInputs``: flags, a scenario file, Python),
the keys a scenario file has, and how flags override a file (``merge_inputs``).

The YAML file (see examples/*.yaml) has the same names as the flags::

    name: kogpt prefix tuning
    model: kakaobrain/kogpt          # catalog name, Hub id, directory or config.json
    peft: {method: prefix, num_virtual_tokens: 10, prefix_projection: true, encoder_hidden_size: 4096}
    deepspeed: deepspeed/seed.json   # relative to the YAML file
    deepspeed_version: "0.19"
    hardware: {gpus: 2xrtx3090, nodes: 1, cpu_ram: 64GB}
    load: {dtype: fp32, zero_init: false, low_cpu_mem_usage: true}   # also checkpoint_index, max_shard_size
    train: {seq_len: 512, micro_batch: 1, gradient_checkpointing: false, model_parameters: trainable}
    runtime: {torch_version: "2.13", alloc_conf: "expandable_segments:True", cuda_version: "12.8",
              pin_memory_backend: torch, alloc_conf_from_env: false}
    stack: {torch: "1.10.1", cuda: "11.3", deepspeed: "0.5.8", transformers: "4.15.0", peft: none,
            files: [pip-freeze.txt]}   # versions as strings; files: pip freeze, transformers/accelerate env, ds_report

Flags override the file; anything left unset takes the documented default. Every input, from a
flag, the file or Python, is checked by ``validate.check_inputs`` against the type its ``ScenarioInputs``
field declares (one generic check, so a new field gets it for free): an empty value is an error,
never "not given"; booleans are true/false or the words yes/no/on/off; numbers are whole and in range.
"""

from __future__ import annotations

from dataclasses import field, fields, replace
from typing import Any

from memfit.core.lean_dataclass import dataclass

SCENARIO_KEYS = {"name", "model", "peft", "deepspeed", "deepspeed_version", "hardware", "load", "train",
        "trust_remote_code", "accelerator", "runtime",
        # outside DeepSpeed (memfit.core.frameworks.pytorch; memfit.core.frameworks.resolve)
        "framework", "precision", "optim", "optim_args", "quantization", "ddp", "fsdp", "training_args",
        "accelerate_config", "bnb_config", "stack",
        # evaluation during training (core/ledger/evaluation.py)
        "eval"}
STACK_KEYS = {"torch", "cuda", "deepspeed", "transformers", "peft", "bitsandbytes", "accelerate", "trl", "files"}
"""``stack:``: a version per library (``memfit.core.stack``), and stack files to read them from."""
RUNTIME_KEYS = {"torch_version", "alloc_conf", "cuda_version", "pin_memory_backend", "alloc_conf_from_env",
                "transformers_version", "bitsandbytes_version"}
HARDWARE_KEYS = {"gpus", "nodes", "cpu_ram", "nvme", "shared_gpu", "host_reserve", "swap"}
EVAL_KEYS = {"strategy", "batch", "seq_len", "generate", "max_new_tokens", "generation_max_length", "num_beams", "steps"}
LOAD_KEYS = {"dtype", "zero_init", "low_cpu_mem_usage", "checkpoint_index", "max_shard_size", "fsdp_loading"}
TRAIN_KEYS = {"seq_len", "micro_batch", "gradient_checkpointing", "model_parameters", "attention", "dataloader_workers",
          "dataloader_pin_memory", "save",
          "dataset_tokens", "task", "target_len", "lengths", "batching", "max_seq_length", "precision", "grad_accum",
          "gradient_accumulation_steps", "max_grad_norm", "weight_decay",
          # the epoch simulation (core/epoch/)
          "epoch", "epoch_steps", "empty_cache_steps"}


@dataclass(frozen=True, slots=True, kw_only=True)
class ScenarioInputs:
    """What the user said, before resolution. ``None`` means "not given"."""

    name: str | None = None
    model: str | None = None
    peft_method: str | None = None
    """``full``, ``prefix``, ``prompt``, ``lora``, ``freeze``, or a path to adapter_config.json."""
    peft_options: dict[str, Any] = field(default_factory=dict)
    deepspeed: str | None = None
    """Path to the DeepSpeed JSON."""
    deepspeed_inline: dict[str, Any] | None = None
    """A DeepSpeed config given inline in the YAML file."""
    ds_version: str | None = None
    gpus: str | None = None
    nodes: int | None = None
    cpu_ram: str | None = None
    nvme: str | None = None
    load_dtype: str | None = None
    zero_init: bool | None = None
    low_cpu_mem_usage: bool | None = None
    fsdp_loading: str | None = None
    """How the script's own loader fills an FSDP model (``types.FSDP_LOADINGS``); None: as the stack's
    ``from_pretrained`` does under FSDP (``stack.transformers.fsdp_efficient_loading``)."""
    checkpoint_index: str | None = None
    """A ``model.safetensors.index.json``: the checkpoint's shards (else ``max_shard_size``)."""
    max_shard_size: str | None = None
    """The checkpoint's shard size (e.g. 5GB); default: that of the transformers that saved it."""
    dataloader_workers: int | None = None
    dataloader_pin_memory: bool | None = None
    """``DataLoader(pin_memory=...)`` (the Trainer's ``dataloader_pin_memory``, True by default)."""
    save: bool | None = None
    """``train.save``: the run saves the model at the end (default true: the plan has a save phase)."""
    """DataLoader worker processes per rank (default 0)."""
    dataset_tokens: int | None = None
    """Tokens of the in-memory tokenized dataset (default: not counted)."""
    seq_len: int | None = None
    micro_batch: int | None = None
    gradient_checkpointing: bool | None = None
    model_parameters: str | None = None
    attention: str | None = None
    task: str | None = None
    """Head to plan (``memfit.core.families.heads.TASKS``); default: config's ``architectures[0]``."""
    target_len: int | None = None
    """Encoder-decoders: decoder tokens per sequence (``seq_len`` is the encoder's)."""
    lengths: str | None = None
    """A file of token counts per sample (or a histogram): the plan takes the largest batch."""
    batching: str | None = None
    """How batches are formed from ``lengths``: pad-longest (default), bucket, pack."""
    max_seq_length: int | None = None
    """Truncation length (and the row length of ``pack``)."""
    trust_remote_code: bool | None = None
    accelerator: str | None = None
    torch_version: str | None = None
    alloc_conf: str | None = None
    alloc_conf_from_env: bool | None = None
    """Read PYTORCH_CUDA_ALLOC_CONF (then PYTORCH_ALLOC_CONF) from the environment: only when asked."""
    cuda_version: str | None = None
    pin_memory_backend: str | None = None
    # -- the rest of the stack (memfit.core.stack; torch, CUDA and DeepSpeed are the fields above)
    transformers_version: str | None = None
    """The transformers release whose Trainer and from_pretrained run (its DeepSpeed-config handling
    changed in 4.6; ``memfit.core.stack.transformers``); default 5.24. (``stack.transformers`` or
    ``runtime.transformers_version`` in YAML.)"""
    peft_version: str | None = None
    """``none`` where the run does not install peft."""
    bitsandbytes_version: str | None = None
    """The bitsandbytes release of the run (its quantized matmuls: ``memfit.core.quant_kernels``).
    (``stack.bitsandbytes`` or ``runtime.bitsandbytes_version`` in YAML.)"""
    accelerate_version: str | None = None
    trl_version: str | None = None
    stack_files: tuple[str, ...] = ()
    """pip freeze / requirements files, ``transformers env``/``accelerate env`` or ``ds_report`` output."""
    # -- outside DeepSpeed (see memfit.core.frameworks.resolve) ---------------------------------
    framework: str | None = None
    """``deepspeed``, ``torch``, ``ddp``, ``fsdp``, ``fsdp2``; None: inferred from the inputs."""
    precision: str | None = None
    """With DeepSpeed: ``fp16``, ``bf16`` or ``fp32`` (the Trainer's --fp16/--bf16), filling ``"auto"``
    in the config's fp16/bf16 sections or setting them without a config (default: bf16 where the GPU
    supports it, else fp16). Outside DeepSpeed: the precision mode, ``fp32``, ``amp_fp16``,
    ``amp_bf16``, ``fp16``, ``bf16``."""
    optim: str | None = None
    """The Trainer's ``optim`` string."""
    optim_args: dict[str, Any] = field(default_factory=dict)
    """``momentum`` (sgd), ``beta1`` (adafactor)."""
    grad_accum: int | None = None
    """Gradient accumulation steps: fills ``"auto"`` in a DeepSpeed config, or sets it without one."""
    max_grad_norm: float | None = None
    weight_decay: float | None = None
    quantization: dict[str, Any] | None = None
    """bitsandbytes settings (memfit's names: method, quant_type, double_quant, compute_dtype,
    quant_storage, skip_modules, prepare_kbit)."""
    ddp: dict[str, Any] | None = None
    fsdp: dict[str, Any] | None = None
    training_args: str | None = None
    """Path to a TrainingArguments / TRL SFTConfig JSON or YAML."""
    accelerate_config: str | None = None
    """Path to an accelerate config YAML."""
    bnb_config: str | None = None
    """Path to a BitsAndBytesConfig JSON."""
    # -- the verdict's hardware margins (core/verdict.py) --------------------------------------
    shared_gpu: bool | None = None
    """Other processes may use the cards: a GPU that fits is at risk at best."""
    host_reserve: str | None = None
    """Host RAM per node kept for the OS and other processes (default: verdict.host_reserve_bytes)."""
    swap: str | None = None
    """Swap space per node, with its unit (default: none, the host verdict compares RAM only)."""
    # -- evaluation (core/ledger/evaluation.py) ---------------------------------------------------
    eval_strategy: str | None = None
    """``eval_strategy``: no (default), steps, epoch."""
    eval_batch: int | None = None
    """``per_device_eval_batch_size`` (default 8)."""
    eval_seq_len: int | None = None
    """Tokens of an eval input / generation prompt (default: seq_len)."""
    eval_generate: bool | None = None
    """``predict_with_generate``."""
    max_new_tokens: int | None = None
    generation_max_length: int | None = None
    """``generation_max_length``: the whole output (encoder-decoders) or prompt + new tokens."""
    num_beams: int | None = None
    """``generation_num_beams`` (default 1)."""
    eval_steps: int | None = None
    # -- the epoch simulation (core/epoch/) -------------------------------------------------------
    epoch: bool | None = None
    """Simulate an epoch of steps of varying shapes (on by default with ``lengths``)."""
    epoch_steps: int | None = None
    """Optimizer steps to simulate (default: one epoch, at most 1,000)."""
    empty_cache_steps: int | None = None
    """``torch_empty_cache_steps``."""
    input_notes: tuple[str, ...] = ()
    """What memfit resolved or ignored while reading the input files (shown in the plan's notes)."""
    input_warnings: tuple[str, ...] = ()
    """What a library would ignore in the input files, or memfit reads but does not model (printed
    as warnings, and findings)."""
    assumed: tuple[tuple[str, str, str], ...] = ()
    """``(setting, value, why)`` for each value taken from a library's default in an input file."""
    origins: dict[str, str] = field(default_factory=dict)
    """Where each given field came from, as the user would find it: ``--micro-batch``,
    ``run.yaml: train.micro_batch`` (``memfit.core.inputs.precedence``)."""


def merge_inputs(base: ScenarioInputs, override: ScenarioInputs) -> ScenarioInputs:
    """``override``'s given values win (flags over a scenario file), each override said in a note;
    PEFT options and optimizer arguments merge key by key."""
    changes: dict[str, Any] = {}
    notes = []
    for f in fields(ScenarioInputs):
        v = getattr(override, f.name)
        old = getattr(base, f.name)
        if f.name in ("peft_options", "optim_args"):
            if v:
                changes[f.name] = {**old, **v}
        elif f.name in ("input_notes", "input_warnings", "assumed", "stack_files"):
            changes[f.name] = tuple(old) + tuple(v)
        elif f.name == "origins":
            changes[f.name] = {**old, **v}
        elif v is not None:
            changes[f.name] = v
            if old is not None and old != v and f.name in override.origins and f.name in base.origins:
                notes.append(f"{override.origins[f.name]} {v!r:.60} overrides {base.origins[f.name]} = {old!r:.60}")
    if override.deepspeed is not None:
        changes["deepspeed_inline"] = None
    changes["input_notes"] = tuple(changes["input_notes"]) + tuple(notes)
    return replace(base, **changes)
