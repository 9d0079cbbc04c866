"""The model a trace runs: built from config.json on the meta device (``memfit.exact.meta_build``,
the same class and task the pure shapes mirror), PEFT applied by the real peft library, then given
fake storage in the training dtype.

Building on ``torch.device("meta")`` skips weight initialization (a 6B model builds in a tenth of
a second); ``materialize_fake`` then swaps every meta parameter, buffer and tensor attribute (peft's
``prompt_tokens``) for an empty tensor created under ``FakeTensorMode`` on the CPU device, keeping
tied parameters tied. Parameters are cast to the training dtype and buffers keep theirs, as
DeepSpeed 0.19.8 casts a model (engine.py ``_cast_module_mixed_precision``: "Cast params only;
preserve fp32 buffers").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from memfit.core.peft.spec import PeftSpec
from memfit.errors import MemfitError

TORCH_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
PEFT_METHODS = ("full", "freeze", "lora", "prefix", "prompt")  # kept for older callers; apply_peft takes every method

from memfit.trace.results import TRACED_AS  # noqa: E402 (pure data: ledger_step reads it without torch)


def build_meta_model(config: Mapping[str, Any], *, attention: str, task: str | None = None) -> torch.nn.Module:
    """The transformers model for a config.json mapping and task, on the meta device, in fp32.

    ``attention`` is checked against the family's support first (one line if unsupported), then
    built as ``TRACED_AS`` says.
    """
    from memfit.core.catalog import source_from_config
    from memfit.core.families import FAMILIES
    from memfit.core.families.attention import resolve
    from memfit.exact import meta_build

    source = source_from_config(config, name=str(config.get("_name_or_path") or config.get("model_type")))
    if source.model_type in FAMILIES:
        resolve(source.model_type, attention)
    return meta_build.build_meta_model(source, task=task, attention=TRACED_AS.get(attention, attention))


def apply_peft(model: torch.nn.Module, spec: PeftSpec) -> torch.nn.Module:
    """``model`` as trained under ``spec``, by the real peft library (the same builder the pure
    PEFT accounting is tested against: ``memfit.exact.peft_build``)."""
    from memfit.exact.peft_build import build_peft_meta_model

    from memfit.core.peft.params import PEFT_METHODS as ALL_METHODS

    if spec.method not in ALL_METHODS:
        raise MemfitError(f"PEFT method must be one of {', '.join(ALL_METHODS)}, got {spec.method!r}")
    try:
        return build_peft_meta_model(model, spec)
    except ValueError as exc:  # peft's NoMatchingPeftModuleError and config checks
        first = str(exc).strip().split(". ")[0]
        raise MemfitError(f"peft cannot apply {spec.method} to {type(model).__name__}: {first} "
                          "(give target_modules)") from exc


def materialize_fake(model: torch.nn.Module, fake_mode: Any, dtype: torch.dtype | None) -> None:
    """Replace meta tensors by fake CPU tensors (floating params in ``dtype``; None: each in its own
    dtype), in place, keeping ties."""
    memo: dict[int, torch.Tensor] = {}
    originals: list[torch.Tensor] = []  # keeps every meta tensor alive so no id() is reused

    def fake_like(t: torch.Tensor, *, param: bool) -> torch.Tensor:
        if id(t) not in memo:
            originals.append(t)
            target = dtype if dtype is not None and param and t.is_floating_point() else t.dtype
            empty = torch.empty(t.shape, dtype=target, device="cpu")
            memo[id(t)] = torch.nn.Parameter(empty, requires_grad=t.requires_grad) if param else empty
        return memo[id(t)]

    with fake_mode:
        for module in model.modules():
            for name, param in list(module._parameters.items()):
                if param is not None:
                    module._parameters[name] = fake_like(param, param=True)
            for name, buf in list(module._buffers.items()):
                if buf is not None:
                    module._buffers[name] = fake_like(buf, param=False)
            for name, value in list(vars(module).items()):
                if isinstance(value, torch.Tensor) and value.device.type == "meta":
                    setattr(module, name, fake_like(value, param=False))
                elif isinstance(value, dict) and value and all(isinstance(v, torch.Tensor) for v in value.values()):
                    for k, v in list(value.items()):
                        if v.device.type == "meta":
                            value[k] = fake_like(v, param=False)
