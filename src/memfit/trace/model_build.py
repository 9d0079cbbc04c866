"""The model a trace runs: built from config.json on the meta device, PEFT applied by the real peft
library, then given fake storage in the training dtype.

Building on ``torch.device("meta")`` skips weight initialization (a 6B model builds in a tenth of
a second); ``materialize_fake`` then swaps every meta parameter, buffer and tensor attribute (peft's
``prompt_tokens``) for an empty tensor created under ``FakeTensorMode`` on the CPU device, keeping
tied parameters tied. Parameters are cast to the training dtype and buffers keep theirs, as
DeepSpeed 0.19.8 casts a model (engine.py ``_cast_module_mixed_precision``: "Cast params only;
preserve fp32 buffers").
"""

from __future__ import annotations

import contextlib
import fnmatch
from collections.abc import Mapping
from typing import Any

import torch

from memfit.core.peft_spec import PeftSpec
from memfit.errors import MemfitError

TORCH_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
PEFT_METHODS = ("full", "freeze", "lora", "prefix", "prompt")


def build_meta_model(config: Mapping[str, Any], *, attention: str) -> torch.nn.Module:
    """``AutoModelForCausalLM`` for a config.json mapping, on the meta device, in fp32."""
    import transformers

    cfg = dict(config)
    model_type = cfg.get("model_type")
    if model_type not in transformers.CONFIG_MAPPING:
        raise MemfitError(f"transformers {transformers.__version__} does not know model_type {model_type!r}")
    hf_config = transformers.CONFIG_MAPPING[model_type].from_dict(cfg)
    with torch.device("meta"):
        try:
            return transformers.AutoModelForCausalLM.from_config(
                hf_config, attn_implementation=attention, dtype=torch.float32
            )
        except ValueError as exc:
            raise MemfitError(f"cannot build {model_type} with attention={attention}: {exc}") from exc


def apply_peft(model: torch.nn.Module, spec: PeftSpec) -> torch.nn.Module:
    """``model`` as trained under ``spec``: requires_grad flags for full/freeze, else peft's
    ``get_peft_model`` (under ``torch.device("meta")`` for a meta model, so new modules get no
    storage)."""
    method = spec.method
    if method not in PEFT_METHODS:
        raise MemfitError(f"PEFT method must be one of {', '.join(PEFT_METHODS)}, got {method!r}")
    if method in ("full", "freeze"):
        for name, param in model.named_parameters():
            param.requires_grad_(method == "full" or _trained_under_freeze(name, spec))
        return model
    import peft

    hidden = _hidden_size(model)
    modules_to_save = list(spec.modules_to_save) or None
    if method == "lora":
        pattern = getattr(spec, "target_modules_pattern", None)
        cfg = peft.LoraConfig(
            task_type="CAUSAL_LM",
            r=spec.lora_r,
            lora_alpha=spec.lora_alpha,
            target_modules=list(spec.target_modules) or pattern,
            bias=spec.lora_bias,
            modules_to_save=modules_to_save,
            use_dora=bool(getattr(spec, "use_dora", False)),
        )
    elif method == "prefix":
        cfg = peft.PrefixTuningConfig(
            task_type="CAUSAL_LM",
            num_virtual_tokens=spec.num_virtual_tokens,
            prefix_projection=spec.prefix_projection,
            encoder_hidden_size=spec.encoder_hidden_size or hidden,
            modules_to_save=modules_to_save,
        )
    else:
        cfg = peft.PromptTuningConfig(
            task_type="CAUSAL_LM", num_virtual_tokens=spec.num_virtual_tokens, modules_to_save=modules_to_save
        )
    on_meta = any(p.device.type == "meta" for p in model.parameters())
    with torch.device("meta") if on_meta else contextlib.nullcontext():
        return peft.get_peft_model(model, cfg)


def _trained_under_freeze(name: str, spec: PeftSpec) -> bool:
    if spec.train_patterns:
        return any(fnmatch.fnmatchcase(name, p) for p in spec.train_patterns)
    return not any(fnmatch.fnmatchcase(name, p) for p in spec.freeze_patterns)


def _hidden_size(model: torch.nn.Module) -> int:
    cfg = model.config
    for key in ("hidden_size", "n_embd", "d_model"):
        value = getattr(cfg, key, None)
        if isinstance(value, int):
            return value
    raise MemfitError(f"cannot find the hidden size of {type(model).__name__}")


def materialize_fake(model: torch.nn.Module, fake_mode: Any, dtype: torch.dtype) -> None:
    """Replace meta tensors by fake CPU tensors (params in ``dtype``), in place, keeping ties."""
    memo: dict[int, torch.Tensor] = {}
    originals: list[torch.Tensor] = []  # keeps every meta tensor alive so no id() is reused

    def fake_like(t: torch.Tensor, *, param: bool) -> torch.Tensor:
        if id(t) not in memo:
            originals.append(t)
            target = dtype if param and t.is_floating_point() else t.dtype
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
