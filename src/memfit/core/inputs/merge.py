"""The input files merged into ``ScenarioInputs`` by the one precedence rule (``precedence.py``):
flags > scenario > TrainingArguments/SFTConfig > accelerate config > BitsAndBytesConfig > DeepSpeed
"auto" > stack files (pip freeze, ``transformers env``, ``accelerate env``, ``ds_report``) > defaults.
The stack's versions are decided first: the TrainingArguments' defaults (the Trainer's ``optim``, its
FSDP version) follow the stack's transformers and torch. What the files mean depends on the framework they end up training with (a
TrainingArguments' ``bf16: true`` is autocast for the Trainer's own loop, FSDP's MixedPrecision policy
under FSDP, and fills ``bf16.enabled`` under DeepSpeed), so the framework is decided first.

To add a file kind: its reader returns a ``Sourced`` (``core/inputs/<kind>.py``), ``_read_files``
reads it, and its settings (named as ``ScenarioInputs`` fields, ``<mapping>.<key>`` for the keys of
``fsdp``/``ddp``/``quantization``/``optim_args``) are decided here with every other input's.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace
from typing import Any

from memfit.core.inputs.common import Sourced
from memfit.core.inputs.precedence import Chosen, Given, choose, choose_mapping, layer_of_origin
from memfit.errors import MemfitError

_PLAIN = ("micro_batch", "grad_accum", "gradient_checkpointing", "load_dtype", "nodes", "accelerator",
          "zero_init", "weight_decay", "max_grad_norm",
          # evaluation and the epoch (core/scenario/run_settings.py)
          "eval_strategy", "eval_batch", "eval_generate", "generation_max_length", "num_beams", "eval_steps",
          "empty_cache_steps", "dataloader_pin_memory")
"""Settings a file gives that map one to one onto a ``ScenarioInputs`` field."""
_STACK = ("torch_version", "cuda_version", "ds_version", "transformers_version", "peft_version",
          "bitsandbytes_version", "accelerate_version", "trl_version")
"""The stack's versions (``memfit.core.stack.resolve.FIELDS``), decided before the other files are read."""
_MAPPINGS = ("fsdp", "ddp", "quantization", "optim_args")
_AMP = {"bf16": "amp_bf16", "fp16": "amp_fp16", "no": "fp32"}
_DS_PRECISION = {"bf16": "bf16", "fp16": "fp16", "no": "fp32"}
_CLIENT_ADAMW = ("adamw_torch", "adamw_torch_fused", "adamw_torch_foreach", "adamw_torch_single")
"""The Trainer's ``optim`` values that are torch's AdamW: under DeepSpeed without an ``optimizer``
section the Trainer passes it as the client optimizer, which memfit plans as AdamW (2 states)."""


def _read_stack_files(inputs) -> list[Sourced]:
    from memfit.core.inputs.stack_file import stack_sourced

    return [stack_sourced(path) for path in inputs.stack_files or ()]


def _read_files(inputs) -> list[Sourced]:
    """``inputs``: with the stack's versions decided (the TrainingArguments' defaults follow them)."""
    files = []
    if inputs.training_args:
        from memfit.core.inputs.training_args import read_training_args
        from memfit.core.stack.resolve import trainer_cpu_ram_loading, trainer_fsdp_version, trainer_optim_default

        files.append(read_training_args(inputs.training_args, fsdp_version_default=trainer_fsdp_version(inputs),
                                        optim_default=trainer_optim_default(inputs),
                                        cpu_ram_loading=trainer_cpu_ram_loading(inputs)))
    if inputs.accelerate_config:
        from memfit.core.inputs.accelerate_config import read_accelerate_config

        files.append(read_accelerate_config(inputs.accelerate_config))
    if inputs.bnb_config:
        from memfit.core.inputs.bnb_config import read_bnb_config
        from memfit.core.stack.resolve import bnb_quant_storage_read

        files.append(read_bnb_config(inputs.bnb_config, quant_storage_read=bnb_quant_storage_read(inputs)))
    return files


def _origin(inputs, name: str) -> str:
    from memfit.core.scenario.validate import input_label

    return (getattr(inputs, "origins", None) or {}).get(name) or input_label(name)


def merge_input_files(inputs):
    """``inputs`` with the settings of its stack files, TrainingArguments/SFTConfig, accelerate config and
    BitsAndBytesConfig files decided against its own (see the module docstring)."""
    givens: dict[str, list[Given]] = defaultdict(list)

    def add(files: list[Sourced]) -> list[Sourced]:
        for f in files:
            for name, value in f.values.items():
                givens[name].append(Given(name, value, f.layer, f.origin[name], default=name in f.defaults,
                                          shown=_shown(name, value, f.layer)))
        return files

    stack_files = add(_read_stack_files(inputs))
    mine = _Mine(inputs, givens)
    notes: list[str] = []
    assumed: list[tuple[str, str, str]] = []
    changes: dict[str, Any] = {}

    origins = dict(inputs.origins)

    def decide(name: str, *, field: str | None = None, hint: str = "") -> Chosen | None:
        chosen = choose(givens.get(name, []), notes=notes, hint=hint)
        if chosen is not None and chosen.given.layer not in ("flag", "scenario"):
            changes[field or name] = chosen.value
            origins[field or name] = chosen.given.origin
            if chosen.given.default:
                assumed.append((field or name, _value_text(chosen.value), chosen.given.origin))
        return chosen

    # 0. the stack's versions, which give the other files' defaults their release
    for name in _STACK:
        mine.add(name)
        decide(name)
    stacked = replace(inputs, **{k: v for k, v in changes.items() if k in _STACK})
    files = stack_files + add(_read_files(stacked))

    # 1. the framework, which gives every other file setting its meaning
    mine.add("framework")
    if inputs.framework is None and (inputs.deepspeed or inputs.deepspeed_inline is not None):
        mine.add_value("framework", "deepspeed", "deepspeed" if inputs.deepspeed else "deepspeed_inline")
    fw_chosen = decide("framework")
    fw = fw_chosen.value if fw_chosen else None
    if fw_chosen is not None and fw_chosen.given.layer in ("flag", "scenario") and inputs.framework is None:
        changes.pop("framework", None)  # implied by the scenario's DeepSpeed config: resolve_framework_settings says so

    # 2. the DeepSpeed config (a path or inline), under DeepSpeed only
    if inputs.deepspeed:
        mine.add_value("deepspeed_config", ("path", _same_path(inputs.deepspeed)), "deepspeed")
    elif inputs.deepspeed_inline is not None:
        mine.add_value("deepspeed_config", ("inline", inputs.deepspeed_inline), "deepspeed_inline")
    ds_raw = None
    if fw == "deepspeed":
        ds = choose(givens.get("deepspeed_config", []), notes=notes)
        if ds is not None and ds.given.layer not in ("flag", "scenario"):
            kind, value = ds.value
            changes["deepspeed" if kind == "path" else "deepspeed_inline"] = value
            changes["deepspeed_inline" if kind == "path" else "deepspeed"] = None
        if ds is not None:
            ds_raw = _ds_raw(ds.value)
    else:
        for g in givens.get("deepspeed_config", []):
            if g.layer not in ("flag", "scenario"):
                notes.append(f"{g.origin}: not used, since the run trains with {fw} ({fw_chosen.given.origin})")

    # 3. precision: the files' mixed precision, read as the chosen framework reads it
    _precision(inputs, givens, fw, ds_raw, notes, mine)
    mine.add("precision")
    decide("precision")

    # 4. the settings that mean the same whatever the framework
    for name in _PLAIN:
        mine.add(name)
        decide(name)
    # a length distribution: the file's length truncates, its packing batches; without one every
    # sequence is taken at the file's length (packed rows are that long too)
    seq_field = "max_seq_length" if inputs.lengths is not None else "seq_len"
    mine.add(seq_field, setting="seq_len")
    decide("seq_len", field=seq_field)
    if inputs.lengths is not None:
        mine.add("batching")
        decide("batching")
    else:
        givens.pop("batching", None)
    _optimizer(inputs, givens, fw, ds_raw, notes, mine, changes, decide)
    _hardware(inputs, givens, notes, changes, assumed)

    # 5. the mappings, key by key
    for name in _MAPPINGS:
        for key, value in (getattr(inputs, name) or {}).items():
            givens[f"{name}.{key}"].append(Given(f"{name}.{key}", value, layer_of_origin(_origin(inputs, name)),
                                                 f"{_origin(inputs, name)}.{key}"))
    if fw not in ("fsdp", "fsdp2"):
        _drop("fsdp.", givens, f"the run trains with {fw}", notes)
    if fw not in (None, "ddp", "torch"):
        _drop("ddp.", givens, f"the run trains with {fw}", notes)
    for name in _MAPPINGS:
        keyed = [g for s, gs in givens.items() if s.startswith(name + ".") for g in gs]
        if not keyed:
            continue
        merged, winners = choose_mapping(keyed, notes=notes)
        if any(g.layer not in ("flag", "scenario") for g in winners.values()):
            changes[name] = merged
    if "ddp_trainer" in givens and fw in (None, "ddp"):
        ddp = dict(changes.get("ddp", inputs.ddp or {}))
        if "find_unused_parameters" not in ddp:
            # the Trainer: find_unused_parameters = not gradient_checkpointing for a transformers model,
            # True for anything else (a PEFT model)
            peft = inputs.peft_method or "full"
            ckpt = changes.get("gradient_checkpointing", inputs.gradient_checkpointing) or False
            ddp["find_unused_parameters"] = True if peft not in ("full", "freeze") else not ckpt
            changes["ddp"] = ddp
    if inputs.training_args and fw in ("fsdp", "fsdp2"):  # the Trainer's FSDP plugin for a PEFT model
        from memfit.core.stack.resolve import trainer_fsdp_wrap

        wrap = trainer_fsdp_wrap(stacked)
        if wrap is not None:
            changes["fsdp"] = {**dict(changes.get("fsdp", inputs.fsdp or {})), "wrap_policy": wrap[0]}
            notes.append(wrap[1])
    warnings = tuple(w for f in files for w in f.warnings)
    out = replace(inputs, training_args=None, accelerate_config=None, bnb_config=None, origins=origins, **changes)
    return replace(out, input_notes=tuple(inputs.input_notes) + tuple(n for f in files for n in f.notes) + tuple(notes),
                   input_warnings=tuple(inputs.input_warnings) + warnings,
                   assumed=tuple(inputs.assumed) + tuple(assumed))


class _Mine:
    """The inputs' own values (flags, scenario) added as ``Given``s above every file."""

    def __init__(self, inputs, givens: dict[str, list[Given]]) -> None:
        self.inputs, self.givens = inputs, givens

    def add(self, field: str, *, setting: str | None = None) -> None:
        value = getattr(self.inputs, field)
        if value is not None:
            self.add_value(setting or field, value, field)

    def add_value(self, setting: str, value: Any, field: str) -> None:
        origin = _origin(self.inputs, field)
        self.givens[setting].append(Given(setting, value, layer_of_origin(origin), origin,
                                          shown=None if not isinstance(value, tuple) else repr(value[1])[:60]))


def _precision(inputs, givens, fw, ds_raw, notes, mine) -> None:
    """The files' ``mixed_precision`` as the framework reads it, added to ``givens["precision"]`` (and
    ``fsdp.mixed_precision`` under FSDP)."""
    mps = givens.pop("mixed_precision", [])
    if not mps:
        return
    ta = next((g for g in mps if g.layer == "training_args"), None)
    acc = next((g for g in mps if g.layer == "accelerate_config"), None)
    if fw == "deepspeed" and ta is not None:
        # the Trainer fills fp16/bf16.enabled from its own fp16/bf16 and refuses a written value that
        # differs (HfTrainerDeepSpeedConfig.trainer_config_process, fill_match); accelerate's DeepSpeedPlugin
        # sets the sections of an inline config from TrainingArguments' mixed precision, which is
        # accelerate's when TrainingArguments says neither
        inline = ds_raw is not None and _from_accelerate_inline(givens)
        if inline and acc is not None and not acc.default and ta.default and acc.value != ta.value:
            raise MemfitError(f"{acc.describe()} contradicts {ta.describe()}: under DeepSpeed the Trainer requires the "
                              f"config's {acc.value}.enabled (set from it) to equal its own {acc.value}, and refuses "
                              f"the mismatch; set {acc.value}: true in the TrainingArguments")
        chosen = Given("precision", _DS_PRECISION[ta.value], ta.layer, ta.origin, shown=ta.shown)
    else:
        c = choose(mps, notes=notes)
        chosen = c.given if c is not None else None
        if chosen is None:
            return
        if fw == "deepspeed":
            chosen = Given("precision", _DS_PRECISION[chosen.value], chosen.layer, chosen.origin, chosen.default,
                           chosen.shown)
        elif fw in ("fsdp", "fsdp2"):
            if chosen.value in ("bf16", "fp16"):
                givens["fsdp.mixed_precision"].append(Given("fsdp.mixed_precision", chosen.value, chosen.layer,
                                                            chosen.origin, chosen.default, chosen.shown))
            # sharded params stay fp32; FSDP computes in its param_dtype
            chosen = Given("precision", "fp32", chosen.layer, chosen.origin, chosen.default, chosen.shown)
        else:
            chosen = Given("precision", _AMP[chosen.value], chosen.layer, chosen.origin, chosen.default, chosen.shown)
    givens["precision"].append(chosen)


def _from_accelerate_inline(givens) -> bool:
    return any(g.layer == "accelerate_config" and g.value[0] == "inline" for g in givens.get("deepspeed_config", []))


def _optimizer(inputs, givens, fw, ds_raw, notes, mine, changes, decide) -> None:
    """The Trainer's ``optim``: its optimizer outside DeepSpeed; under DeepSpeed the client optimizer
    it passes to ``deepspeed.initialize`` when the config has no ``optimizer`` section (transformers 5.24
    ``integrations/deepspeed.py: deepspeed_optim_sched``), else unused (DeepSpeed builds the section's)."""
    mine.add("optim")
    if fw != "deepspeed":
        decide("optim")
        return
    chosen = choose(givens.get("optim", []), notes=notes)
    if chosen is None:
        return
    if chosen.given.layer in ("flag", "scenario"):
        changes["optim"] = None  # read here, not by the torch settings
    g = chosen.given
    if isinstance(ds_raw, dict) and "optimizer" in ds_raw:
        if not g.default:
            notes.append(f"{g.describe()} is not used: the DeepSpeed config has an optimizer section, which DeepSpeed "
                         "builds (the Trainer passes a DummyOptim)")
        return
    if g.value not in _CLIENT_ADAMW:
        raise MemfitError(f"{g.describe()}: under DeepSpeed without an optimizer section the Trainer hands this "
                          "optimizer to deepspeed.initialize; memfit models a client torch AdamW only ("
                          f"{', '.join(_CLIENT_ADAMW)}); give the DeepSpeed config an optimizer section or use one of them")
    zero = ds_raw.get("zero_optimization") if isinstance(ds_raw, dict) else None
    off = zero.get("offload_optimizer") if isinstance(zero, dict) else None
    device = off.get("device") if isinstance(off, dict) else None
    if device in ("cpu", "nvme") and _allocation_line(changes.get("ds_version", inputs.ds_version)) == "0.19" and \
            ds_raw.get("zero_force_ds_cpu_optimizer", True) is not False:
        raise MemfitError(f"{g.describe()} with offload_optimizer {device} and no optimizer section: DeepSpeed 0.19 "
                          "refuses ZeRO-Offload with a client optimizer (engine.py _configure_basic_optimizer: "
                          "zero_force_ds_cpu_optimizer); add an optimizer section (DeepSpeedCPUAdam) or set "
                          '"zero_force_ds_cpu_optimizer": false')
    notes.append(f"{g.describe()}: the Trainer's optimizer, handed to deepspeed.initialize as the client optimizer "
                 "(no optimizer section in the DeepSpeed config); planned as torch AdamW, 2 fp32 states per trained "
                 "parameter")


def _allocation_line(release: str | None) -> str:
    """memfit's DeepSpeed allocation model of a release (``0.19.8`` -> ``0.19``; ``memfit.core.stack``)."""
    from memfit.core.stack.deepspeed import allocation_line
    from memfit.core.stack.releases import release_line
    from memfit.core.stack.resolve import LABELS

    return allocation_line(None if release is None else release_line("deepspeed", release, where=LABELS["deepspeed"]))


def _hardware(inputs, givens, notes, changes, assumed) -> None:
    counts = givens.pop("gpus_count", [])
    if not counts:
        return
    g = counts[0]
    nodes = changes.get("nodes", inputs.nodes) or 1
    if inputs.gpus:
        from memfit.core.hardware import parse_gpus

        count, _ = parse_gpus(inputs.gpus)
        if count != g.value and not g.default:
            notes.append(f"{_origin(inputs, 'gpus')} {inputs.gpus} overrides {g.origin} = {g.value * nodes} processes "
                         f"on {nodes} machine(s)")
        return
    from memfit.core.hardware import DEFAULT_GPU

    changes["gpus"] = f"{g.value}x{DEFAULT_GPU}"
    assumed.append(("gpus", f"{g.value} x {DEFAULT_GPU}",
                    f"count from {g.origin}, model memfit's default; --gpus"))


def _drop(prefix: str, givens, why: str, notes: list[str]) -> None:
    for setting in [s for s in givens if s.startswith(prefix)]:
        for g in givens.pop(setting):
            if not g.default and g.layer not in ("flag", "scenario"):
                notes.append(f"{g.describe()} is not used: {why}")


def _same_path(path: str) -> str:
    import os

    return os.path.normpath(os.path.abspath(path))


def _ds_raw(value: tuple[str, Any]):
    kind, v = value
    if kind == "inline":
        return v if isinstance(v, dict) else None
    from memfit.core.dsconfig import read_deepspeed_json

    return read_deepspeed_json(v)


def _shown(name: str, value: Any, layer: str) -> str | None:
    """The value as the file writes it, where memfit's name for it differs."""
    if name == "deepspeed_config":
        return repr(value[1])[:60]
    if name == "mixed_precision" and layer == "training_args":
        return "false" if value == "no" else "true"
    return None


def _value_text(value: Any) -> str:
    return value if isinstance(value, str) else repr(value)
