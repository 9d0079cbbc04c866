"""Scenario inputs from a YAML file and/or flags, resolved into a typed ``Scenario``.

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

Flags override the file; anything left unset takes the documented default. Every input, from a
flag, the file or Python, is checked by ``check_inputs`` against the type its ``ScenarioInputs``
field declares (one generic check, so a new field gets it for free): an empty value is an error,
never "not given"; booleans are true/false or the words yes/no/on/off; numbers are whole and in range.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from memfit.core.reading import parse_bool, parse_yaml, read_text
from memfit.core.scenario.types import Scenario
from memfit.errors import MemfitError

_TOP = {"name", "model", "peft", "deepspeed", "deepspeed_version", "hardware", "load", "train",
        "trust_remote_code", "accelerator", "runtime",
        # outside DeepSpeed (memfit.core.frameworks.pytorch; memfit.core.frameworks.resolve)
        "framework", "precision", "optim", "optim_args", "quantization", "ddp", "fsdp", "training_args",
        "accelerate_config", "bnb_config"}
_RUNTIME = {"torch_version", "alloc_conf", "cuda_version", "pin_memory_backend", "alloc_conf_from_env"}
_HW = {"gpus", "nodes", "cpu_ram", "nvme"}
_LOAD = {"dtype", "zero_init", "low_cpu_mem_usage", "checkpoint_index", "max_shard_size"}
_TRAIN = {"seq_len", "micro_batch", "gradient_checkpointing", "model_parameters", "attention", "dataloader_workers",
          "dataset_tokens", "task", "target_len", "lengths", "batching", "max_seq_length", "precision", "grad_accum",
          "gradient_accumulation_steps", "max_grad_norm", "weight_decay"}


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
    checkpoint_index: str | None = None
    """A ``model.safetensors.index.json``: the checkpoint's shards (else ``max_shard_size``)."""
    max_shard_size: str | None = None
    """The checkpoint's shard size (e.g. 5GB); default: that of the transformers that saved it."""
    dataloader_workers: int | None = None
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
    input_notes: tuple[str, ...] = ()
    """What memfit resolved or ignored while reading the input files (shown in the plan's notes)."""


def merge_inputs(base: ScenarioInputs, override: ScenarioInputs) -> ScenarioInputs:
    """``override``'s given values win; PEFT options merge key by key."""
    changes = {}
    for f in fields(ScenarioInputs):
        v = getattr(override, f.name)
        if f.name in ("peft_options", "optim_args"):
            if v:
                changes[f.name] = {**getattr(base, f.name), **v}
        elif f.name == "input_notes":
            changes[f.name] = tuple(base.input_notes) + tuple(v)
        elif v is not None:
            changes[f.name] = v
    if override.deepspeed is not None:
        changes["deepspeed_inline"] = None
    return replace(base, **changes)


def _unknown(given: Mapping[str, Any], allowed: set[str], where: str, path: Path) -> None:
    unknown = sorted(set(given) - allowed)
    if unknown:
        from memfit.core.dsconfig.sections import did_you_mean

        hints = [f"{k} (did you mean {c}?)" if (c := did_you_mean(k, allowed)) else k for k in unknown]
        raise MemfitError(f"{path}: unknown key(s){where}: {', '.join(hints)} (known: {', '.join(sorted(allowed))})")


def _section(raw: Any, name: str, allowed: set[str], path: Path) -> dict[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise MemfitError(f"{path}: '{name}' must be a mapping")
    _unknown(raw, allowed, f" in '{name}'", path)
    return raw


def _text(value: Any, key: str, path: Path) -> str:
    """A non-empty string value of the file (paths, names): numbers are not accepted here."""
    if not isinstance(value, str) or not value.strip():
        raise MemfitError(f"{path}: '{key}' must be a non-empty string, got {value!r}")
    return value


def _scalar_text(value: Any) -> str | None:
    """A YAML scalar given where a string is expected (``gpus: 2xa100``, ``deepspeed_version: 0.19``)."""
    if value is None:
        return None
    return value if isinstance(value, str) else str(value) if isinstance(value, (int, float)) and \
        not isinstance(value, bool) else value


def read_scenario_file(path: str | Path) -> ScenarioInputs:
    """Parse a scenario YAML (or JSON) file into inputs; paths inside are relative to it."""
    p = Path(path)
    raw = parse_yaml(read_text(p, what="scenario file"), what=f"scenario file {p}")
    if not isinstance(raw, dict):
        raise MemfitError(f"{p}: expected a mapping of scenario keys, got {type(raw).__name__}")
    unknown = set(raw) - _TOP
    if unknown and {"distributed_type", "compute_environment"} & unknown:
        raise MemfitError(f"{p} is an accelerate config, not a memfit scenario: pass it as --accelerate-config "
                          "(or the scenario key accelerate_config) with a scenario or --model")
    if unknown and {"per_device_train_batch_size", "output_dir"} & unknown:
        raise MemfitError(f"{p} looks like TrainingArguments, not a memfit scenario: pass it as --training-args "
                          "(or the scenario key training_args) with a scenario or --model")
    _unknown(raw, _TOP, "", p)
    hw = _section(raw.get("hardware"), "hardware", _HW, p)
    load = _section(raw.get("load"), "load", _LOAD, p)
    train = _section(raw.get("train"), "train", _TRAIN, p)
    rt = _section(raw.get("runtime"), "runtime", _RUNTIME, p)
    peft = raw.get("peft")
    method, options = None, {}
    if isinstance(peft, str):
        method = peft
    elif isinstance(peft, dict):
        options = dict(peft)
        method = options.pop("method", None)
        if "adapter_config" in options:
            method = str(p.parent / _text(options.pop("adapter_config"), "peft.adapter_config", p))
    elif peft is not None:
        raise MemfitError(f"{p}: 'peft' must be a method name or a mapping")
    if method is not None and not isinstance(method, str):
        raise MemfitError(f"{p}: 'peft.method' must be a string, got {method!r}")
    if method and method.endswith(".json") and not Path(method).is_absolute():
        method = str(p.parent / method)
    ds = raw.get("deepspeed")
    ds_path, ds_inline = None, None
    if isinstance(ds, str):
        ds = _text(ds, "deepspeed", p)
        ds_path = str(p.parent / ds) if not Path(ds).is_absolute() else ds
    elif isinstance(ds, dict):
        ds_inline = ds
    elif ds is not None:
        raise MemfitError(f"{p}: 'deepspeed' must be a path to a DeepSpeed JSON or an inline mapping")
    model = raw.get("model")
    if isinstance(model, str) and (model.startswith("./") or model.startswith("../")):
        model = str(p.parent / model)
    name = raw.get("name", p.stem)

    def rel(key: str) -> str | None:
        v = raw.get(key)
        if v is None:
            return None
        v = _text(v, key, p)
        return v if Path(v).is_absolute() else str(p.parent / v)

    def mapping(key: str) -> dict[str, Any] | None:
        v = raw.get(key)
        if v is None:
            return None
        if not isinstance(v, dict):
            raise MemfitError(f"{p}: '{key}' must be a mapping")
        return dict(v)

    def one_of(a: tuple[str, Any], b: tuple[str, Any]) -> Any:
        """A value the file may give under either of two names; both given and different is refused."""
        if a[1] is not None and b[1] is not None and a[1] != b[1]:
            raise MemfitError(f"{p}: {a[0]} {a[1]!r} contradicts {b[0]} {b[1]!r}; give one")
        return a[1] if a[1] is not None else b[1]

    precision = one_of(("precision", raw.get("precision")), ("train.precision", train.get("precision")))
    grad_accum = one_of(("train.grad_accum", train.get("grad_accum")),
                        ("train.gradient_accumulation_steps", train.get("gradient_accumulation_steps")))
    return ScenarioInputs(
        framework=raw.get("framework"), precision=precision, optim=raw.get("optim"),
        optim_args=mapping("optim_args") or {}, grad_accum=grad_accum,
        max_grad_norm=train.get("max_grad_norm"), weight_decay=train.get("weight_decay"),
        quantization=mapping("quantization"), ddp=mapping("ddp"), fsdp=mapping("fsdp"),
        training_args=rel("training_args"), accelerate_config=rel("accelerate_config"), bnb_config=rel("bnb_config"),
        name=_scalar_text(name), model=model, peft_method=method, peft_options=options,
        deepspeed=ds_path, deepspeed_inline=ds_inline, ds_version=_scalar_text(raw.get("deepspeed_version")),
        gpus=_scalar_text(hw.get("gpus")), nodes=hw.get("nodes"),
        cpu_ram=_scalar_text(hw.get("cpu_ram")), nvme=_scalar_text(hw.get("nvme")),
        load_dtype=load.get("dtype"), zero_init=load.get("zero_init"), low_cpu_mem_usage=load.get("low_cpu_mem_usage"),
        checkpoint_index=(str(p.parent / load["checkpoint_index"]) if load.get("checkpoint_index") is not None
                          and not Path(str(load["checkpoint_index"])).is_absolute() else load.get("checkpoint_index")),
        max_shard_size=None if load.get("max_shard_size") is None else str(load["max_shard_size"]),
        seq_len=train.get("seq_len"), micro_batch=train.get("micro_batch"),
        gradient_checkpointing=train.get("gradient_checkpointing"), model_parameters=train.get("model_parameters"),
        attention=train.get("attention"), trust_remote_code=raw.get("trust_remote_code"),
        dataloader_workers=train.get("dataloader_workers"), dataset_tokens=train.get("dataset_tokens"),
        task=train.get("task"), target_len=train.get("target_len"),
        lengths=(str(p.parent / train["lengths"]) if train.get("lengths") and not Path(str(train["lengths"])).is_absolute()
                 else train.get("lengths")),
        batching=train.get("batching"), max_seq_length=train.get("max_seq_length"),
        accelerator=raw.get("accelerator"),
        torch_version=None if rt.get("torch_version") is None else str(rt["torch_version"]),
        alloc_conf=None if rt.get("alloc_conf") is None else str(rt["alloc_conf"]),
        alloc_conf_from_env=rt.get("alloc_conf_from_env"),
        cuda_version=None if rt.get("cuda_version") is None else str(rt["cuda_version"]),
        pin_memory_backend=rt.get("pin_memory_backend"),
    )


def _checkpoint_layout(inputs: ScenarioInputs, source, model):
    """The checkpoint's shards (``memfit.core.checkpoint``): from the index file given, else from
    ``max_shard_size`` or the saving transformers version's default."""
    from memfit.core.checkpoint import checkpoint_key, layout_from_config, layout_from_index
    from memfit.core.hardware import parse_size
    from memfit.core.ledger.context import is_adapter_param

    tensors = [(checkpoint_key(p.name), p.numel) for p in model.params if not is_adapter_param(p.name)]
    if inputs.checkpoint_index:
        return layout_from_index(inputs.checkpoint_index, tensors, source.config)
    limit = parse_size(inputs.max_shard_size, what="max_shard_size") if inputs.max_shard_size else None
    return layout_from_config(tensors, source.config, max_shard_size=limit)


def _count(value: Any, what: str) -> int:
    """A whole number >= 0 (None: 0)."""
    if value is None:
        return 0
    if isinstance(value, bool):
        raise MemfitError(f"{what} must be a whole number, got {value!r}")
    try:
        n = int(str(value))
    except ValueError:
        raise MemfitError(f"{what} must be a whole number, got {value!r}") from None
    if n < 0:
        raise MemfitError(f"{what} must be at least 0, got {n}")
    return n


def _positive_int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        try:
            value = int(str(value))
        except ValueError:
            raise MemfitError(f"{what} must be a whole number, got {value!r}") from None
    if value < 1:
        raise MemfitError(f"{what} must be at least 1, got {value}")
    return value


# ------------------------------------------------------------------- one check for every input

MAX_INT = 2**31 - 1
"""The largest count any input may be (sequence length, micro batch, nodes, accumulation): far
beyond any real run, and small enough that every size computed from it stays exact."""

_YAML_KEY = {**{k: f"hardware.{k}" for k in _HW}, **{k: f"train.{k}" for k in _TRAIN},
             "load_dtype": "load.dtype", "zero_init": "load.zero_init", "low_cpu_mem_usage": "load.low_cpu_mem_usage",
             "peft_method": "peft.method", "ds_version": "deepspeed_version", "deepspeed_inline": "deepspeed"}
_FLAG = {"peft_method": "--peft", "ds_version": "--deepspeed-version", "deepspeed_inline": "--deepspeed"}


def input_label(name: str) -> str:
    """How the user names a ``ScenarioInputs`` field: its flag and its scenario-file key."""
    flag = _FLAG.get(name, "--" + name.replace("_", "-"))
    return f"{flag} (scenario key {_YAML_KEY.get(name, name)})"


def check_inputs(inputs: ScenarioInputs) -> ScenarioInputs:
    """Every field checked against its declared type, whoever set it (flag, file, Python): ``str``
    non-empty; ``bool`` a boolean or true/false/yes/no/on/off; ``int`` a whole number (digits in a
    string too) from 1 (0 for ``_MAY_BE_ZERO``) to ``MAX_INT``; mappings mappings. Returns the inputs with booleans and
    numbers normalised. A new ``ScenarioInputs`` field is checked by its annotation, with no code."""
    hints = typing.get_type_hints(ScenarioInputs)
    changes: dict[str, Any] = {}
    for f in fields(ScenarioInputs):
        value = getattr(inputs, f.name)
        if value is None:
            continue
        hint = hints[f.name]
        if typing.get_origin(hint) in (typing.Union, types.UnionType):  # X | None
            hint = next(t for t in typing.get_args(hint) if t is not type(None))
        kind = typing.get_origin(hint) or hint
        label = input_label(f.name)
        if kind is bool:
            changes[f.name] = parse_bool(value, what=label)
        elif kind is int:
            changes[f.name] = _whole(value, label, minimum=_MAY_BE_ZERO.get(f.name, 1))
        elif kind is str:
            if not isinstance(value, str):
                raise MemfitError(f"{label} must be a string, got {value!r:.80}")
            if not value.strip():
                raise MemfitError(f"{label} is empty: give a value, or leave it out for the default")
        elif kind in (dict, Mapping, types.MappingProxyType) and not isinstance(value, Mapping):
            raise MemfitError(f"{label} must be a mapping, got {value!r:.80}")
    return replace(inputs, **changes) if changes else inputs


_MAY_BE_ZERO = {"dataloader_workers": 0, "dataset_tokens": 0}
"""Counts for which 0 is a real value (no workers, no dataset in memory); every other int is >= 1."""


def _whole(value: Any, what: str, *, limit: int = MAX_INT, minimum: int = 1) -> int:
    if isinstance(value, str) and value.strip().isdigit() and len(value.strip()) <= 19:
        value = int(value.strip())
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise MemfitError(f"{what} must be a whole number, got {value!r:.80}")
    if not minimum <= value <= limit:
        shown = f"{value}" if abs(value) < 10**30 else f"a number of about {int(value.bit_length() * 0.30103)} digits"
        raise MemfitError(f"{what} must be from {minimum} to {limit:,}, got {shown}")
    return value


def build_scenario(inputs: ScenarioInputs) -> Scenario:
    """Resolve model, PEFT method, DeepSpeed config and hardware into a ``Scenario``."""
    from memfit.core.catalog import resolve_model_config
    from memfit.core.dsconfig import AutoContext, parse_deepspeed_config, read_deepspeed_json, trainer_defaults
    from memfit.core.frameworks.resolve import apply_input_files, resolve_framework_settings
    from memfit.core.hardware import Hardware, parse_gpus, parse_size
    from memfit.core.peft.params import apply_peft
    from memfit.core.peft.parse import load_adapter_config, parse_peft_options
    from memfit.core.scenario.types import LoadSettings, Scenario, TrainSettings
    from memfit.core.shapes import build_model_shape

    inputs = apply_input_files(check_inputs(inputs))
    if not inputs.model:
        raise MemfitError("no model given: pass --model (e.g. --model kakaobrain/kogpt) or a scenario file")
    source = resolve_model_config(inputs.model, trust_remote_code=bool(inputs.trust_remote_code))
    base = _model_shape(source, inputs)
    method = inputs.peft_method or "full"
    if method.endswith(".json") or Path(method).is_file():
        if inputs.peft_options:
            raise MemfitError("PEFT options cannot be combined with an adapter_config.json")
        spec = load_adapter_config(method)
    else:
        spec = parse_peft_options(method, **inputs.peft_options)
    model = apply_peft(base, spec)

    count, gpu = parse_gpus(inputs.gpus or "1xa100-80gb")
    nodes = inputs.nodes if inputs.nodes is not None else 1
    hw = Hardware(gpu=gpu, gpus_per_node=count, nodes=nodes,
                  cpu_ram_bytes=parse_size(inputs.cpu_ram or "256GB", what="cpu_ram"),
                  nvme_bytes=parse_size(inputs.nvme, what="nvme") if inputs.nvme else None)
    has_ds_json = bool(inputs.deepspeed or inputs.deepspeed_inline)
    if inputs.precision is not None:
        modes = ("fp16", "bf16", "fp32") if has_ds_json or inputs.framework == "deepspeed" else \
            ("fp16", "bf16", "fp32", "amp_fp16", "amp_bf16")
        if inputs.precision not in modes:
            raise MemfitError(f"{input_label('precision')} must be {', '.join(modes)}"
                              + (" with DeepSpeed (amp_* are the torch/DDP/FSDP precision modes)"
                                 if len(modes) == 3 else "") + f", got {inputs.precision!r}")
    fw = resolve_framework_settings(inputs, hw, has_deepspeed_json=has_ds_json)
    micro = inputs.micro_batch
    if fw.framework == "deepspeed":
        if inputs.precision is not None and inputs.precision not in ("fp16", "bf16", "fp32"):
            raise MemfitError(f"{input_label('precision')} must be fp16, bf16 or fp32 under DeepSpeed, got "
                              f"{inputs.precision!r}")
        precision = inputs.precision or ("bf16" if gpu.bf16 else "fp16")
        precision_why = (f"{input_label('precision')}" if inputs.precision else
                         f"the default for the GPU ({gpu.name} {'supports' if gpu.bf16 else 'has no'} bf16; "
                         "--precision chooses)")
    else:  # the precision mode is the torch settings'; the stub DeepSpeed config only carries the batch
        precision, precision_why = ("bf16" if gpu.bf16 else "fp16"), "unused outside DeepSpeed"
    if inputs.deepspeed:
        raw = read_deepspeed_json(inputs.deepspeed)
    elif inputs.deepspeed_inline is not None:
        raw = inputs.deepspeed_inline
    else:  # no config: the one the flags describe, said in a finding
        raw = {"train_micro_batch_size_per_gpu": micro or 1, "gradient_accumulation_steps": inputs.grad_accum or 1,
               "zero_optimization": {"stage": 0}}
        if precision != "fp32":
            raw[precision] = {"enabled": True}
    fills, sources = trainer_defaults(raw, precision=precision, precision_why=precision_why)
    if micro is not None:
        fills["micro_batch_size"] = micro
    elif isinstance(raw.get("train_micro_batch_size_per_gpu"), str):  # "auto" without --micro-batch
        fills["micro_batch_size"], sources["micro_batch_size"] = 1, "memfit's default (--micro-batch chooses)"
    if inputs.grad_accum is not None:
        fills["gradient_accumulation_steps"] = inputs.grad_accum
    elif isinstance(raw.get("gradient_accumulation_steps"), str):
        fills["gradient_accumulation_steps"] = 1
        sources["gradient_accumulation_steps"] = "transformers' TrainingArguments default (--grad-accum chooses)"
    if inputs.precision is not None and fw.framework == "deepspeed":
        fills["precision"] = precision
    ctx = AutoContext(world_size=hw.world_size, hidden_size=base.arch.hidden_size, sources=sources, **fills)
    ds = parse_deepspeed_config(raw, context=ctx)
    from memfit.core.dsconfig import resolve_auto

    ds_json = resolve_auto(raw, ctx)
    if not inputs.deepspeed and inputs.deepspeed_inline is None and fw.framework == "deepspeed":
        from dataclasses import replace as _replace

        ds = _replace(ds, notes=ds.notes + (
            f"no DeepSpeed config given: memfit plans ZeRO stage 0, {precision} ({precision_why}), micro batch "
            f"{raw['train_micro_batch_size_per_gpu']}, gradient accumulation {raw['gradient_accumulation_steps']}",))
    if micro is None:
        micro = ds.train_micro_batch_size_per_gpu
    elif micro != ds.train_micro_batch_size_per_gpu:
        raise MemfitError(f"micro_batch {micro} contradicts the DeepSpeed config's train_micro_batch_size_per_gpu "
                          f"{ds.train_micro_batch_size_per_gpu}")
    load = LoadSettings(dtype=inputs.load_dtype or "fp32", zero_init=bool(inputs.zero_init),
                        low_cpu_mem_usage=True if inputs.low_cpu_mem_usage is None else inputs.low_cpu_mem_usage,
                        checkpoint=_checkpoint_layout(inputs, source, model))
    seq_len, batch_shape = _sequence_shape(inputs, micro, hw.world_size)
    train = TrainSettings(
        seq_len=seq_len,
        micro_batch=micro,
        gradient_checkpointing=bool(inputs.gradient_checkpointing),
        model_parameters=inputs.model_parameters or "trainable",
        attention=_attention(base, inputs.attention),
        target_len=_target_len(base, inputs.target_len),
        batch_shape=batch_shape,
        dataloader_workers=_count(inputs.dataloader_workers, "dataloader_workers"),
        dataset_tokens=_count(inputs.dataset_tokens, "dataset_tokens"),
    )
    return Scenario(name=inputs.name or f"{source.name} ({spec.method})", model_ref=source.name, model=model,
                    peft=spec, deepspeed=ds, deepspeed_json=ds_json, hardware=hw, load=load, train=train,
                    ds_version=str(inputs.ds_version or "0.19"), accelerator=inputs.accelerator or "cuda",
                    runtime=runtime_settings(inputs),
                    framework=fw.framework, torch=fw.torch, quant=fw.quant, ddp=fw.ddp, fsdp=fw.fsdp,
                    input_notes=tuple(inputs.input_notes))


def runtime_settings(inputs: ScenarioInputs):  # -> RuntimeSettings
    """torch version, PYTORCH_CUDA_ALLOC_CONF (from the environment only when asked), CUDA version and
    DeepSpeed's pinning backend, validated (a bad value is one MemfitError line)."""
    import os

    from memfit.core.alloc.versions import DEFAULT_TORCH, resolve_torch_version
    from memfit.core.scenario.types import RuntimeSettings

    if inputs.alloc_conf_from_env is not None and not isinstance(inputs.alloc_conf_from_env, bool):
        raise MemfitError(f"alloc_conf_from_env must be true or false, got {inputs.alloc_conf_from_env!r}")
    version = resolve_torch_version(inputs.torch_version or DEFAULT_TORCH)
    conf, source = inputs.alloc_conf or "", ""
    if inputs.alloc_conf_from_env:
        if inputs.alloc_conf:
            raise MemfitError("give the allocator config either as --alloc-conf or from the environment, not both")
        for var in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF") if version.at_least("2.9") else ("PYTORCH_CUDA_ALLOC_CONF",):
            if os.environ.get(var):
                conf, source = os.environ[var], f"{var} from the environment"
                break
        else:
            source = "asked to read PYTORCH_CUDA_ALLOC_CONF from the environment: not set, torch's defaults"
    return RuntimeSettings(torch_version=version.name, alloc_conf=conf, alloc_conf_source=source,
                           cuda_version=inputs.cuda_version, pin_memory_backend=inputs.pin_memory_backend or "torch")


def _model_shape(source, inputs: ScenarioInputs):
    """The pure builder's shapes, or, for a model_type transformers ships without a pure builder,
    the meta build's (torch and transformers run: slower, and said so in the shape's notes)."""
    from memfit.core.shapes import NoPureBuilder, build_model_shape

    try:
        return build_model_shape(source, task=inputs.task, trust_remote_code=bool(inputs.trust_remote_code))
    except NoPureBuilder:
        from memfit.core.families import TRANSFORMERS_MODEL_TYPES

        if source.model_type not in TRANSFORMERS_MODEL_TYPES and not inputs.trust_remote_code:
            raise
        try:
            from memfit.exact.meta_build import shape_from_meta_build
        except ImportError as exc:
            raise MemfitError(f"model_type {source.model_type!r} has no pure-Python builder and the exact path "
                              "needs torch and transformers (pip install 'memfit[exact]')") from exc
        return shape_from_meta_build(source, task=inputs.task, trust_remote_code=bool(inputs.trust_remote_code))


def _attention(shape, requested: str | None) -> str:
    """transformers' choice for the family (sdpa, or eager where sdpa is not supported), or the
    requested one if the family supports it (the same one-line refusal as the exact path)."""
    from memfit.core.families import FAMILIES
    from memfit.core.families.attention import IMPLEMENTATIONS, resolve

    if shape.arch.model_type in FAMILIES:
        return resolve(shape.arch.model_type, requested)
    if requested is not None and requested not in IMPLEMENTATIONS:
        raise MemfitError(f"attention must be one of {', '.join(IMPLEMENTATIONS)}, got {requested!r}")
    return requested or "sdpa"


def _target_len(shape, value: Any) -> int | None:
    if value is None:
        return None
    if not shape.arch.num_encoder_layers:
        raise MemfitError(f"target_len applies to encoder-decoder models; {shape.architecture} has no decoder "
                          "of its own (use seq_len)")
    return _positive_int(value, "target_len")


def _sequence_shape(inputs: ScenarioInputs, micro: int, world: int):
    """``(seq_len, batch_shape)``: the given seq_len, or the largest batch of a length distribution."""
    from memfit.core.batch_shapes import longest_batch, read_lengths

    if inputs.lengths is None:
        if inputs.batching is not None:
            raise MemfitError("batching needs a length distribution (--lengths FILE)")
        return _positive_int(inputs.seq_len if inputs.seq_len is not None else 2048, "seq_len"), None
    if inputs.seq_len is not None:
        raise MemfitError("give either seq_len or lengths (the plan then takes the largest batch's length)")
    cap = None if inputs.max_seq_length is None else _positive_int(inputs.max_seq_length, "max_seq_length")
    shape = longest_batch(read_lengths(inputs.lengths), rule=inputs.batching or "pad-longest", micro_batch=micro,
                          max_seq_length=cap, world_size=world)
    return shape.seq_len, shape


def describe_scenario(sc: Scenario) -> dict[str, Any]:
    """The resolved scenario, for JSON output and fixtures."""
    from memfit.core.alloc.versions import resolve_torch_version

    z = sc.deepspeed.zero
    return {
        "name": sc.name,
        "model": sc.model_ref,
        "architecture": sc.model.architecture,
        "peft": sc.peft.method,
        "deepspeed_version": sc.ds_version,
        "zero_stage": z.stage,
        "precision": sc.deepspeed.precision,
        "offload_optimizer": z.offload_optimizer.device,
        "offload_param": z.offload_param.device,
        "world_size": sc.world_size,
        "gpus_per_node": sc.hardware.gpus_per_node,
        "nodes": sc.hardware.nodes,
        "gpu": sc.hardware.gpu.name,
        "gpu_total_bytes": sc.hardware.gpu.total_bytes,
        "cpu_ram_bytes": sc.hardware.cpu_ram_bytes,
        "load_dtype": sc.load.dtype,
        "zero_init": sc.load.zero_init,
        "seq_len": sc.train.seq_len,
        "task": sc.model.arch.task,
        "target_len": sc.train.target_len,
        "attention": sc.train.attention,
        "batch_shape": None if sc.train.batch_shape is None else {
            "rule": sc.train.batch_shape.rule, "micro_batch": sc.train.batch_shape.micro_batch,
            "seq_len": sc.train.batch_shape.seq_len, "probability": sc.train.batch_shape.probability,
            "batches_per_epoch": sc.train.batch_shape.batches_per_epoch},
        "micro_batch": sc.train.micro_batch,
        "gradient_checkpointing": sc.train.gradient_checkpointing,
        "accelerator": sc.accelerator,
        "torch_version": sc.runtime.torch_version,
        "alloc_conf": sc.runtime.alloc_conf,
        "cuda_version": sc.runtime.cuda_version or resolve_torch_version(sc.runtime.torch_version).default_cuda,
        "pin_memory_backend": sc.runtime.pin_memory_backend,
        "framework": sc.framework,
        **({} if sc.framework == "deepspeed" else {
            "precision_mode": sc.torch.precision, "optim": sc.torch.optim,
            "gradient_accumulation_steps": sc.torch.gradient_accumulation_steps}),
        **({"quantization": sc.quant.method, "bnb_4bit_quant_type": sc.quant.quant_type,
            "bnb_4bit_quant_storage": sc.quant.quant_storage} if sc.quant.enabled else {}),
    }
