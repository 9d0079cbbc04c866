"""A scenario YAML from ``ScenarioInputs``: the inverse of ``memfit.core.scenario.read``, so that
``memfit plan FILE`` reads back exactly the inputs it was written from.

Every ``ScenarioInputs`` field is either written under its scenario key (``FIELD_KEYS``) or named
in ``NOT_WRITTEN`` with the reason; a test fails when a field is added to ``ScenarioInputs`` and
to neither. Paths are written relative to the folder when they are files written there, else
absolute (a path in ``ScenarioInputs`` is relative to the working directory).
"""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Any

from memfit.core.scenario.inputs import ScenarioInputs

FIELD_KEYS: dict[str, tuple[str, ...]] = {
    "name": ("name",), "model": ("model",), "ds_version": ("deepspeed_version",),
    "gpus": ("hardware", "gpus"), "nodes": ("hardware", "nodes"), "cpu_ram": ("hardware", "cpu_ram"),
    "nvme": ("hardware", "nvme"), "shared_gpu": ("hardware", "shared_gpu"),
    "host_reserve": ("hardware", "host_reserve"), "swap": ("hardware", "swap"),
    "load_dtype": ("load", "dtype"), "zero_init": ("load", "zero_init"),
    "low_cpu_mem_usage": ("load", "low_cpu_mem_usage"), "fsdp_loading": ("load", "fsdp_loading"),
    "checkpoint_index": ("load", "checkpoint_index"),
    "max_shard_size": ("load", "max_shard_size"),
    "dataloader_workers": ("train", "dataloader_workers"), "dataset_tokens": ("train", "dataset_tokens"),
    "seq_len": ("train", "seq_len"), "micro_batch": ("train", "micro_batch"),
    "gradient_checkpointing": ("train", "gradient_checkpointing"), "save": ("train", "save"),
    "model_parameters": ("train", "model_parameters"), "attention": ("train", "attention"),
    "task": ("train", "task"), "target_len": ("train", "target_len"), "lengths": ("train", "lengths"),
    "batching": ("train", "batching"), "max_seq_length": ("train", "max_seq_length"),
    "grad_accum": ("train", "grad_accum"), "max_grad_norm": ("train", "max_grad_norm"),
    "weight_decay": ("train", "weight_decay"),
    "epoch": ("train", "epoch"), "epoch_steps": ("train", "epoch_steps"),
    "empty_cache_steps": ("train", "empty_cache_steps"),
    "eval_strategy": ("eval", "strategy"), "eval_batch": ("eval", "batch"), "eval_seq_len": ("eval", "seq_len"),
    "eval_generate": ("eval", "generate"), "max_new_tokens": ("eval", "max_new_tokens"),
    "generation_max_length": ("eval", "generation_max_length"), "num_beams": ("eval", "num_beams"),
    "eval_steps": ("eval", "steps"),
    "trust_remote_code": ("trust_remote_code",), "accelerator": ("accelerator",),
    "torch_version": ("runtime", "torch_version"), "transformers_version": ("runtime", "transformers_version"),
    "bitsandbytes_version": ("runtime", "bitsandbytes_version"), "alloc_conf": ("runtime", "alloc_conf"),
    "alloc_conf_from_env": ("runtime", "alloc_conf_from_env"), "cuda_version": ("runtime", "cuda_version"),
    "pin_memory_backend": ("runtime", "pin_memory_backend"),
    "peft_version": ("stack", "peft"), "accelerate_version": ("stack", "accelerate"), "trl_version": ("stack", "trl"),
    "stack_files": ("stack", "files"), "dataloader_pin_memory": ("train", "dataloader_pin_memory"),
    "framework": ("framework",), "precision": ("precision",), "optim": ("optim",), "optim_args": ("optim_args",),
    "quantization": ("quantization",), "ddp": ("ddp",), "fsdp": ("fsdp",),
    "training_args": ("training_args",), "accelerate_config": ("accelerate_config",), "bnb_config": ("bnb_config",),
}
"""Each field's key in the scenario file (``memfit.core.scenario.inputs`` documents them)."""

SPECIAL = {"peft_method", "peft_options", "deepspeed", "deepspeed_inline"}
"""Written by ``scenario_document`` itself: ``peft`` (a method, its options, or an adapter_config)
and ``deepspeed`` (a path or an inline mapping)."""

NOT_WRITTEN = {"input_notes": "what memfit noted while reading the files; it notes them again",
               "input_warnings": "what memfit warned while reading the files; it warns again",
               "assumed": "the library defaults memfit took from the files; it takes them again",
               "origins": "where each value came from; the written scenario is their origin now"}

PATH_FIELDS = {"checkpoint_index", "lengths", "training_args", "accelerate_config", "bnb_config"}


def _plain(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return v


def _path(value: str, written: set[str]) -> str:
    """A file written into the folder by its name, any other path absolute."""
    return value if value in written else str(Path(value).resolve())


def scenario_document(inputs: ScenarioInputs, *, written: set[str] = frozenset()) -> dict[str, Any]:
    """The scenario mapping of ``inputs``. ``written``: the names of files written beside the
    scenario (paths equal to one of them are kept as they are)."""
    doc: dict[str, Any] = {}

    def put(path: tuple[str, ...], value: Any) -> None:
        node = doc
        for k in path[:-1]:
            node = node.setdefault(k, {})
        node[path[-1]] = value

    for f in fields(ScenarioInputs):
        name = f.name
        if name in SPECIAL or name in NOT_WRITTEN:
            continue
        value = getattr(inputs, name)
        if value is None or (name == "optim_args" and not value):
            continue
        if name == "stack_files":
            if not value:
                continue
            value = [_path(v, written) for v in value]
        elif name in PATH_FIELDS:
            value = _path(value, written)
        elif name == "model" and Path(value).exists():
            value = str(Path(value).resolve())
        put(FIELD_KEYS[name], _plain(value))
    method = inputs.peft_method
    if method is not None or inputs.peft_options:
        if method and method.endswith(".json"):
            peft: Any = {"adapter_config": _path(method, written)}
        elif inputs.peft_options:
            peft = {"method": method or "full", **_plain(inputs.peft_options)}
        else:
            peft = method
        if isinstance(peft, dict) and "adapter_config" in peft and inputs.peft_options:
            peft.update(_plain(inputs.peft_options))
        doc["peft"] = peft
    if inputs.deepspeed is not None:
        doc["deepspeed"] = _path(inputs.deepspeed, written)
    elif inputs.deepspeed_inline is not None:
        doc["deepspeed"] = _plain(inputs.deepspeed_inline)
    order = ["name", "model", "peft", "framework", "deepspeed", "deepspeed_version", "training_args",
             "accelerate_config", "bnb_config", "precision", "optim", "optim_args", "quantization", "ddp", "fsdp",
             "hardware", "load", "train", "eval", "runtime", "stack", "accelerator", "trust_remote_code"]
    return {k: doc[k] for k in sorted(doc, key=lambda k: order.index(k) if k in order else len(order))}


def scenario_yaml(doc: dict[str, Any], header: str) -> str:
    import yaml

    return "".join(f"# {line}\n" for line in header.splitlines()) + yaml.safe_dump(doc, sort_keys=False, width=100)
