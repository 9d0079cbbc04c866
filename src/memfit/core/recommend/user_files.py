"""A recommendation as the user's own files, changed: which setting goes into which file, and the
files' new text.

The user's run is described by the files they gave (a DeepSpeed JSON, a TrainingArguments or TRL
SFTConfig, an accelerate config YAML, a BitsAndBytesConfig JSON) and by the scenario (flags or a
scenario YAML). A setting the recommendation changes goes where the user keeps it:

- into every file that sets it explicitly (so no two files disagree), else
- into the file whose library reads it: the TrainingArguments for what the Trainer fills
  (``per_device_train_batch_size``, ``gradient_accumulation_steps``, ``bf16``/``fp16``,
  ``gradient_checkpointing``, ``optim``; a DeepSpeed ``"auto"`` stays ``"auto"``), the accelerate
  config for how the run is launched (``distributed_type``, ``fsdp_config``), the
  BitsAndBytesConfig for the quantization (a new ``bnb_config.json`` when the user had none),
  else
- into the scenario YAML that ``memfit recommend --out`` writes beside them.

The DeepSpeed JSON is ``patch.patch_deepspeed_json``'s. A file path inside a written file (a
TrainingArguments' ``deepspeed``) is written absolute, so it is found from any working directory,
as the Trainer opens it (relative to the working directory: transformers
``integrations/deepspeed.py: HfDeepSpeedConfig``).
"""

from __future__ import annotations

import difflib
from dataclasses import field, replace
from pathlib import Path
from typing import Any

from memfit.core.lean_dataclass import dataclass
from memfit.core.recommend.file_edits import DELETE, Changes, edit_json, edit_yaml
from memfit.core.scenario.inputs import ScenarioInputs
from memfit.errors import MemfitError

TRAINER_PRECISION = {"amp_bf16": (True, False), "amp_fp16": (False, True), "fp32": (False, False),
                     "bf16": (True, False), "fp16": (False, True)}
"""A precision as the Trainer's ``(bf16, fp16)``. Under DeepSpeed ``bf16``/``fp16`` are the config's
sections the Trainer fills; outside it, the pure 16-bit modes are not a Trainer setting (the
search offers only what the user's files can say: ``pytorch.search``)."""
ACCELERATE_PRECISION = {"amp_bf16": "bf16", "amp_fp16": "fp16", "fp32": "no", "bf16": "bf16", "fp16": "fp16"}
DISTRIBUTED_TYPE = {"torch": "NO", "ddp": "MULTI_GPU", "fsdp": "FSDP", "fsdp2": "FSDP", "deepspeed": "DEEPSPEED"}
TORCH_DTYPE_NAMES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


@dataclass(frozen=True, slots=True, kw_only=True)
class UserFile:
    """One of the user's files as read (or a new one memfit writes)."""

    role: str
    """``deepspeed``, ``training_args``, ``accelerate_config`` or ``bnb_config``."""
    path: str | None
    """The user's file; None for a file memfit creates."""
    name: str
    """Its name in a recommendation's folder (the user's own file name)."""
    text: str
    raw: dict[str, Any]

    @property
    def yaml(self) -> bool:
        return self.name.lower().endswith((".yaml", ".yml"))


@dataclass(frozen=True, slots=True, kw_only=True)
class WrittenFile:
    """A file of a recommendation: its name in the folder, its text, and the diff to the user's."""

    role: str
    name: str
    text: str
    original: str | None
    """The user's file it changes (None: new)."""
    diff: str
    notes: tuple[str, ...] = ()


@dataclass(slots=True)
class Placement:
    """Where each changed setting went (built up by ``place``)."""

    training_args: list = field(default_factory=list)
    accelerate_config: list = field(default_factory=list)
    bnb_config: dict[str, Any] | None = None
    scenario: dict[str, Any] = field(default_factory=dict)
    """``ScenarioInputs`` fields the scenario YAML sets."""
    notes: list[str] = field(default_factory=list)


def _read(path: str, what: str) -> tuple[str, dict[str, Any]]:
    from memfit.core.reading import parse_json, parse_yaml, read_text

    text = read_text(path, what=what)
    raw = parse_json(text, what=path) if path.lower().endswith(".json") else parse_yaml(text, what=path)
    if not isinstance(raw, dict):
        raise MemfitError(f"{path}: {what} must be a mapping")
    return text, raw


def read_user_files(inputs: ScenarioInputs) -> dict[str, UserFile]:
    """The files the user gave, as written (before any merge), by role. The DeepSpeed JSON is the
    one named in the scenario, in the TrainingArguments (``deepspeed``) or in the accelerate config
    (``deepspeed_config_file``), whichever gives it."""
    out: dict[str, UserFile] = {}
    for role, path, what in (("training_args", inputs.training_args, "TrainingArguments/SFTConfig file"),
                             ("accelerate_config", inputs.accelerate_config, "accelerate config"),
                             ("bnb_config", inputs.bnb_config, "BitsAndBytesConfig file")):
        if path:
            text, raw = _read(path, what)
            out[role] = UserFile(role=role, path=path, name=Path(path).name, text=text, raw=raw)
    from memfit.core.inputs.training_args import relative_path  # where the input readers find it

    ds = inputs.deepspeed
    if ds is None and "training_args" in out and isinstance(out["training_args"].raw.get("deepspeed"), str):
        ds = relative_path(out["training_args"].raw["deepspeed"], out["training_args"].path)
    if ds is None and "accelerate_config" in out:
        dc = out["accelerate_config"].raw.get("deepspeed_config") or {}
        if isinstance(dc, dict) and isinstance(dc.get("deepspeed_config_file"), str):
            ds = relative_path(dc["deepspeed_config_file"], out["accelerate_config"].path)
    if ds:
        text, raw = _read(ds, "DeepSpeed config")
        out["deepspeed"] = UserFile(role="deepspeed", path=ds, name=Path(ds).name, text=text, raw=raw)
    return out


def unified_diff(before: str, after: str, *, original: str | None, name: str) -> str:
    if before == after:
        return ""
    return "".join(difflib.unified_diff(before.splitlines(True), after.splitlines(True),
                                        fromfile=original or "/dev/null", tofile=name))


def mapping_changes(old: Any, new: Any, path: tuple[str, ...] = ()) -> Changes:
    """The (key path, value) changes that turn mapping ``old`` into ``new``."""
    out: list = []
    for k, v in new.items():
        if isinstance(v, dict) and isinstance(old.get(k), dict):
            out += mapping_changes(old[k], v, path + (k,))
        elif k not in old or old[k] != v or type(old[k]) is not type(v):
            out.append((path + (k,), v))
    out += [(path + (k,), DELETE) for k in old if k not in new]
    return tuple(out)


def edited(f: UserFile, changes: Changes) -> WrittenFile:
    """The user's file with ``changes``, and its diff."""
    if f.yaml:
        text, kept = edit_yaml(f.text, f.raw, changes) if changes else (f.text, True)
    else:
        text, kept = (edit_json(f.text, f.raw, changes) if changes else f.text), True
    notes = () if kept else (f"{f.name}: rewritten whole (its layout could not be kept line by line)",)
    return WrittenFile(role=f.role, name=f.name, text=text, original=f.path,
                       diff=unified_diff(f.text, text, original=f.path, name=f.name), notes=notes)


def new_file(role: str, name: str, text: str) -> WrittenFile:
    return WrittenFile(role=role, name=name, text=text, original=None,
                       diff=unified_diff("", text, original=None, name=name))


# ------------------------------------------------------------------ where each setting goes

def _ta_has(files: dict[str, UserFile], *keys: str) -> str | None:
    ta = files.get("training_args")
    return next((k for k in keys if ta is not None and k in ta.raw), None)


def _accel_fsdp(files: dict[str, UserFile]) -> dict[str, Any] | None:
    ac = files.get("accelerate_config")
    fc = ac.raw.get("fsdp_config") if ac is not None else None
    return fc if isinstance(fc, dict) else None


def place_trainer_setting(p: Placement, files: dict[str, UserFile], user: ScenarioInputs, setting: str,
                          value: Any, *, framework: str) -> None:
    """A setting the Trainer (or the plain loop) reads: micro_batch, grad_accum,
    gradient_checkpointing, precision, optim, load_dtype."""
    ta = files.get("training_args")
    given = getattr(user, setting, None) is not None  # the scenario or a flag sets it: it wins, keep it right
    if setting == "micro_batch":
        if ta is not None:
            p.training_args.append((("per_device_train_batch_size",), value))
    elif setting == "grad_accum":
        if ta is not None:
            p.training_args.append((("gradient_accumulation_steps",), value))
    elif setting == "gradient_checkpointing":
        fc = _accel_fsdp(files)
        in_accel = fc is not None and "fsdp_activation_checkpointing" in fc
        if in_accel:
            p.accelerate_config.append((("fsdp_config", "fsdp_activation_checkpointing"), value))
        key = _ta_has(files, "activation_checkpointing", "gradient_checkpointing")
        if ta is not None and (key or not in_accel):
            p.training_args.append(((key or "gradient_checkpointing",), value))
        if (ta is None and not in_accel) or given:
            p.scenario["gradient_checkpointing"] = value
        return
    elif setting == "precision":
        placed = False
        if ta is not None:
            bf16, fp16 = TRAINER_PRECISION[value]
            p.training_args += [(("bf16",), bf16), (("fp16",), fp16)]
            placed = True
        ac = files.get("accelerate_config")
        if ac is not None and framework in ("torch", "ddp") and ("mixed_precision" in ac.raw or not placed):
            p.accelerate_config.append((("mixed_precision",), ACCELERATE_PRECISION[value]))
            placed = True
        if not placed or given:
            p.scenario["precision"] = value
        return
    elif setting == "optim":
        if ta is not None:
            p.training_args.append((("optim",), value))
    elif setting == "load_dtype":
        mik = ta.raw.get("model_init_kwargs") if ta is not None else None
        if isinstance(mik, dict) and any(mik.get(k) not in (None, "auto") for k in ("torch_dtype", "dtype")):
            key = "dtype" if mik.get("dtype") not in (None, "auto") else "torch_dtype"
            p.training_args.append((("model_init_kwargs", key), TORCH_DTYPE_NAMES[value]))
            if given:
                p.scenario["load_dtype"] = value
            return
        p.scenario["load_dtype"] = value
        return
    else:
        raise ValueError(setting)
    if ta is None or given:
        p.scenario[setting] = value


def place_structure(p: Placement, files: dict[str, UserFile], user: ScenarioInputs, *, framework: str,
                    sharding: str | None, cpu_offload: bool, fsdp_inputs: dict[str, Any] | None) -> None:
    """The framework and its FSDP settings: in the accelerate config (how the run is launched), in
    the TrainingArguments' ``fsdp``, or in the scenario."""
    ac = files.get("accelerate_config")
    ta = files.get("training_args")
    fsdp = framework in ("fsdp", "fsdp2")
    if ac is not None:
        p.accelerate_config.append((("distributed_type",), DISTRIBUTED_TYPE[framework]))
        if fsdp:
            fc = _accel_fsdp(files) or {}
            p.accelerate_config.append((("fsdp_config", "fsdp_version"), 2 if framework == "fsdp2" else 1))
            if framework == "fsdp2":
                p.accelerate_config.append((("fsdp_config", "fsdp_reshard_after_forward"), sharding != "SHARD_GRAD_OP"))
            else:
                p.accelerate_config.append((("fsdp_config", "fsdp_sharding_strategy"), sharding))
            p.accelerate_config.append((("fsdp_config", "fsdp_offload_params"), bool(cpu_offload)))
            if "fsdp_auto_wrap_policy" not in fc:
                p.accelerate_config.append((("fsdp_config", "fsdp_auto_wrap_policy"), "TRANSFORMER_BASED_WRAP"))
        if user.framework is not None:
            p.scenario["framework"] = framework
        return
    if ta is not None and (fsdp or ta.raw.get("fsdp")):
        if fsdp:
            tokens = [{"FULL_SHARD": "full_shard", "SHARD_GRAD_OP": "shard_grad_op", "HYBRID_SHARD": "hybrid_shard",
                       "NO_SHARD": "no_shard"}.get(sharding or "FULL_SHARD", "full_shard"), "auto_wrap"]
            if cpu_offload:
                tokens.append("offload")
            p.training_args.append((("fsdp",), " ".join(tokens)))
            cfg = dict(ta.raw.get("fsdp_config") or {}) if isinstance(ta.raw.get("fsdp_config"), dict) else {}
            cfg["version"] = 2 if framework == "fsdp2" else 1
            if framework == "fsdp2":
                cfg["reshard_after_forward"] = sharding != "SHARD_GRAD_OP"
            p.training_args.append((("fsdp_config",), cfg))
        else:
            p.training_args.append((("fsdp",), DELETE))
            p.training_args.append((("fsdp_config",), DELETE))
        if user.framework is not None:
            p.scenario["framework"] = framework
        return
    p.scenario["framework"] = framework
    if fsdp:
        p.scenario["fsdp"] = {**(fsdp_inputs or {}), "sharding_strategy": sharding, "cpu_offload": bool(cpu_offload)}
    elif user.fsdp is not None:
        p.scenario["fsdp"] = None


BNB_DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16", "uint8": "uint8"}


def bnb_json(quant: dict[str, Any]) -> dict[str, Any]:
    """A BitsAndBytesConfig as ``to_json_file`` writes its keys (transformers
    ``utils/quantization_config.py``), for memfit's quantization settings."""
    four = quant.get("method") == "4bit"
    return {"quant_method": "bitsandbytes", "load_in_4bit": four, "load_in_8bit": not four,
            "bnb_4bit_quant_type": quant.get("quant_type", "fp4"),
            "bnb_4bit_use_double_quant": bool(quant.get("double_quant", False)),
            "bnb_4bit_compute_dtype": BNB_DTYPES[quant.get("compute_dtype", "fp32")],
            "bnb_4bit_quant_storage": BNB_DTYPES[quant.get("quant_storage", "uint8")],
            "llm_int8_threshold": 6.0}


def place_quantization(p: Placement, files: dict[str, UserFile], user: ScenarioInputs,
                       quant: dict[str, Any]) -> None:
    bnb = files.get("bnb_config")
    if bnb is not None:
        raw = bnb.raw.get("quantization_config") if isinstance(bnb.raw.get("quantization_config"), dict) else bnb.raw
        new = {**raw, **{k: v for k, v in bnb_json(quant).items() if k in raw or k.startswith(("load_in", "bnb_4bit"))}}
        p.bnb_config = {**bnb.raw, "quantization_config": new} if raw is not bnb.raw else new
    elif user.quantization is not None or not quant or quant.get("method", "none") == "none":
        p.scenario["quantization"] = quant
    else:
        p.bnb_config = bnb_json(quant)


def scenario_inputs(user: ScenarioInputs, p: Placement, *, file_names: dict[str, str]) -> ScenarioInputs:
    """The scenario YAML's inputs: the user's own, the settings placed in the scenario, and the
    written files by their names (``file_names``: role -> name in the folder)."""
    changes = dict(p.scenario)
    for role, name in file_names.items():
        if role == "deepspeed":
            changes["deepspeed"] = name
            changes["deepspeed_inline"] = None
        else:
            changes[role] = name
    return replace(user, **changes)
