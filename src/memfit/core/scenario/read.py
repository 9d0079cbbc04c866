"""Reading a scenario YAML (or JSON) file into ``ScenarioInputs``: unknown keys refused with "did you
mean", paths inside made relative to the file, every value of the expected kind."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from memfit.core.reading import parse_yaml, read_text
from memfit.core.scenario.inputs import (EVAL_KEYS, HARDWARE_KEYS, LOAD_KEYS, RUNTIME_KEYS, SCENARIO_KEYS, STACK_KEYS,
                                         TRAIN_KEYS, ScenarioInputs)
from memfit.errors import MemfitError


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
    text = read_text(p, what="scenario file")
    try:
        raw = parse_yaml(text, what=f"scenario file {p}")
    except MemfitError:
        # A published-run case dates its source (``date: 2023-02-13``, not a JSON type): name the case
        # for what it is rather than its first date; any other file keeps the first error.
        dated = _parse_or_none(text, p)
        if isinstance(dated, dict) and {"scenario", "outcome", "measurements"} <= set(dated):
            read_scenario_mapping(dated, p)
        raise
    return read_scenario_mapping(raw, p)


def _parse_or_none(text: str, p: Path) -> Any:
    try:
        return parse_yaml(text, what=f"scenario file {p}", dates_as_text=True)
    except MemfitError:
        return None


def read_scenario_mapping(raw: Any, p: Path) -> ScenarioInputs:
    """A scenario mapping already parsed (e.g. the ``scenario:`` of a public-run case), read as if it
    were the file ``p``: its relative paths resolve against ``p``'s folder, ``p``'s stem names it."""
    if not isinstance(raw, dict):
        raise MemfitError(f"{p}: expected a mapping of scenario keys, got {type(raw).__name__}")
    unknown = set(raw) - SCENARIO_KEYS
    if unknown and {"distributed_type", "compute_environment"} & unknown:
        raise MemfitError(f"{p} is an accelerate config, not a memfit scenario: pass it as --accelerate-config "
                          "(or the scenario key accelerate_config) with a scenario or --model")
    if unknown and {"scenario", "outcome", "measurements"} <= unknown:
        raise MemfitError(f"{p} is a published-run case, not a memfit scenario: `memfit compare {p}` plans its "
                          "scenario: and compares the plan with its measurements")
    if unknown and {"per_device_train_batch_size", "output_dir"} & unknown:
        raise MemfitError(f"{p} looks like TrainingArguments, not a memfit scenario: pass it as --training-args "
                          "(or the scenario key training_args) with a scenario or --model")
    _unknown(raw, SCENARIO_KEYS, "", p)
    hw = _section(raw.get("hardware"), "hardware", HARDWARE_KEYS, p)
    load = _section(raw.get("load"), "load", LOAD_KEYS, p)
    train = _section(raw.get("train"), "train", TRAIN_KEYS, p)
    rt = _section(raw.get("runtime"), "runtime", RUNTIME_KEYS, p)
    ev = _section(raw.get("eval"), "eval", EVAL_KEYS, p)
    st = _section(raw.get("stack"), "stack", STACK_KEYS, p)
    peft = raw.get("peft")
    method, options = None, {}
    if isinstance(peft, str):
        method = peft
    elif isinstance(peft, dict):
        options = dict(peft)
        method = options.pop("method", None)
        if "adapter_config" in options:
            if method is not None:
                raise MemfitError(f"{p}: give peft.method or peft.adapter_config, not both")
            method = _text(options.pop("adapter_config"), "peft.adapter_config", p)
    elif peft is not None:
        raise MemfitError(f"{p}: 'peft' must be a method name or a mapping")
    if method is not None and not isinstance(method, str):
        raise MemfitError(f"{p}: 'peft.method' must be a string, got {method!r}")
    if method and (method.endswith(".json") or "/" in method) and not Path(method).is_absolute():
        method = str(p.parent / method)  # relative to the scenario's folder, once
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
    versions = {k: _version_text(st.get(k), f"stack.{k}", p) for k in STACK_KEYS - {"files"}}
    ds_version = one_of(("deepspeed_version", _scalar_text(raw.get("deepspeed_version"))),
                        ("stack.deepspeed", versions["deepspeed"]))
    torch_version = one_of(("runtime.torch_version", None if rt.get("torch_version") is None else str(rt["torch_version"])),
                           ("stack.torch", versions["torch"]))
    cuda_version = one_of(("runtime.cuda_version", None if rt.get("cuda_version") is None else str(rt["cuda_version"])),
                          ("stack.cuda", versions["cuda"]))
    rt_transformers = None if rt.get("transformers_version") is None else str(rt["transformers_version"])
    transformers_version = one_of(("runtime.transformers_version", rt_transformers),
                                  ("stack.transformers", versions["transformers"]))
    rt_bnb = None if rt.get("bitsandbytes_version") is None else str(rt["bitsandbytes_version"])
    bitsandbytes_version = one_of(("runtime.bitsandbytes_version", rt_bnb),
                                  ("stack.bitsandbytes", versions["bitsandbytes"]))
    aliased = {"bitsandbytes_version": ("stack.bitsandbytes", rt_bnb),
               "ds_version": ("stack.deepspeed", raw.get("deepspeed_version")),
               "torch_version": ("stack.torch", rt.get("torch_version")),
               "cuda_version": ("stack.cuda", rt.get("cuda_version")),
               "transformers_version": ("stack.transformers", rt_transformers)}
    files = st.get("files") or []
    if isinstance(files, str):
        files = [files]
    if not isinstance(files, list):
        raise MemfitError(f"{p}: 'stack.files' must be a file name or a list of them")
    stack_files = tuple(v if Path(v).is_absolute() else str(p.parent / v)
                        for v in (_text(f, "stack.files", p) for f in files))
    grad_accum = one_of(("train.grad_accum", train.get("grad_accum")),
                        ("train.gradient_accumulation_steps", train.get("gradient_accumulation_steps")))
    inputs = ScenarioInputs(
        framework=raw.get("framework"), precision=precision, optim=raw.get("optim"),
        optim_args=mapping("optim_args") or {}, grad_accum=grad_accum,
        max_grad_norm=train.get("max_grad_norm"), weight_decay=train.get("weight_decay"),
        quantization=mapping("quantization"), ddp=mapping("ddp"), fsdp=mapping("fsdp"),
        training_args=rel("training_args"), accelerate_config=rel("accelerate_config"), bnb_config=rel("bnb_config"),
        name=_scalar_text(name), model=model, peft_method=method, peft_options=options,
        deepspeed=ds_path, deepspeed_inline=ds_inline, ds_version=ds_version,
        gpus=_scalar_text(hw.get("gpus")), nodes=hw.get("nodes"),
        cpu_ram=_scalar_text(hw.get("cpu_ram")), nvme=_scalar_text(hw.get("nvme")),
        load_dtype=load.get("dtype"), zero_init=load.get("zero_init"), low_cpu_mem_usage=load.get("low_cpu_mem_usage"),
        fsdp_loading=_scalar_text(load.get("fsdp_loading")),
        checkpoint_index=(str(p.parent / load["checkpoint_index"]) if load.get("checkpoint_index") is not None
                          and not Path(str(load["checkpoint_index"])).is_absolute() else load.get("checkpoint_index")),
        max_shard_size=None if load.get("max_shard_size") is None else str(load["max_shard_size"]),
        seq_len=train.get("seq_len"), micro_batch=train.get("micro_batch"),
        gradient_checkpointing=train.get("gradient_checkpointing"), model_parameters=train.get("model_parameters"),
        attention=train.get("attention"), trust_remote_code=raw.get("trust_remote_code"),
        dataloader_workers=train.get("dataloader_workers"), dataset_tokens=train.get("dataset_tokens"),
        dataloader_pin_memory=train.get("dataloader_pin_memory"), save=train.get("save"),
        task=train.get("task"), target_len=train.get("target_len"),
        lengths=(str(p.parent / train["lengths"]) if train.get("lengths") and not Path(str(train["lengths"])).is_absolute()
                 else train.get("lengths")),
        batching=train.get("batching"), max_seq_length=train.get("max_seq_length"),
        accelerator=raw.get("accelerator"),
        torch_version=torch_version,
        alloc_conf=None if rt.get("alloc_conf") is None else str(rt["alloc_conf"]),
        alloc_conf_from_env=rt.get("alloc_conf_from_env"),
        cuda_version=cuda_version,
        pin_memory_backend=rt.get("pin_memory_backend"),
        shared_gpu=hw.get("shared_gpu"), host_reserve=_scalar_text(hw.get("host_reserve")),
        swap=_scalar_text(hw.get("swap")),
        eval_strategy="no" if ev.get("strategy") is False else _scalar_text(ev.get("strategy")), eval_batch=ev.get("batch"), eval_seq_len=ev.get("seq_len"),
        eval_generate=ev.get("generate"), max_new_tokens=ev.get("max_new_tokens"),
        generation_max_length=ev.get("generation_max_length"), num_beams=ev.get("num_beams"),
        eval_steps=ev.get("steps"),
        epoch=train.get("epoch"), epoch_steps=train.get("epoch_steps"), empty_cache_steps=train.get("empty_cache_steps"),
        transformers_version=transformers_version, peft_version=versions["peft"],
        bitsandbytes_version=bitsandbytes_version, accelerate_version=versions["accelerate"],
        trl_version=versions["trl"], stack_files=stack_files,
    )
    from dataclasses import fields, replace

    from memfit.core.scenario.validate import scenario_key

    given = {f.name: f"{p}: {scenario_key(f.name)}" for f in fields(ScenarioInputs)
             if f.name not in ("name", "origins") and getattr(inputs, f.name) not in (None, {}, ())}
    for name, (stack_key, old) in aliased.items():  # the key the file used, where a field has two
        if name in given and old is None:
            given[name] = f"{p}: {stack_key}"
    return replace(inputs, origins=given)


def _version_text(value: Any, key: str, path: Path) -> str | None:
    """A version under ``stack:``: a string (``"1.10"``). YAML reads an unquoted ``1.10`` as the number
    1.1, so a number is refused with the fix rather than read as another release; ``null`` or
    ``none`` is a library the run does not have."""
    if value is None:
        return None
    if isinstance(value, bool) or isinstance(value, (int, float)):
        raise MemfitError(f"{path}: {key}: write the version as a string in quotes (\"{value}\" is read by YAML as "
                          f"the number {value!r}, and \"1.10\" unquoted would be 1.1)")
    return _text(value, key, path)
