"""Build the real model a replay trains: random weights from config.json, then the PEFT method.

``build_model`` instantiates the class named by ``architectures[0]`` (else ``AutoModelForCausalLM``)
with ``_from_config(config, dtype=...)`` (what ``AutoModelForCausalLM.from_config`` calls), which allocates every parameter as real tensors in the
load dtype and runs the model's weight init: the same tensors ``from_pretrained(torch_dtype=...)``
would hold, with random values. The PEFT method is applied by the real peft library through
``memfit.exact.peft_build.build_peft_meta_model`` (``get_peft_model``; prefix tuning with
``prefix_projection`` builds peft's ``PrefixEncoder``: embedding plus a two-layer MLP, the seed's
prefix encoder), which also sets ``requires_grad`` as the method freezes.
"""

from __future__ import annotations

from typing import Any

from memfit.core.peft.spec import PeftSpec
from memfit.errors import MemfitError

TORCH_DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


def torch_dtype(name: str):
    import torch

    return getattr(torch, TORCH_DTYPES[name])


def build_config(config: dict[str, Any], *, attention: str):
    """The transformers config object for a config.json dict."""
    import transformers

    model_type = config["model_type"]
    try:
        config_class = transformers.AutoConfig.for_model(model_type).__class__
    except ValueError as exc:
        raise MemfitError(f"transformers {transformers.__version__} does not know model_type {model_type!r}") from exc
    cfg = config_class.from_dict(dict(config))
    cfg._attn_implementation = attention
    return cfg


def build_model(config: dict[str, Any], *, dtype: str, attention: str = "sdpa"):
    """Random-weight model of ``config`` with every parameter a real tensor in ``dtype``."""
    import transformers

    cfg = build_config(config, attention=attention)
    arch = (config.get("architectures") or [None])[0]
    model_class = getattr(transformers, arch, None) if arch else None
    if model_class is None:
        model_class = transformers.AutoModelForCausalLM
    if hasattr(model_class, "from_config"):  # an Auto class
        return model_class.from_config(cfg, dtype=torch_dtype(dtype), attn_implementation=attention)
    # What AutoModel*.from_config calls for the concrete class (modeling_utils.py), including the
    # deepspeed.zero.Init wrapping when HfDeepSpeedConfig is alive.
    return model_class._from_config(cfg, dtype=torch_dtype(dtype), attn_implementation=attention)


def apply_peft(model, spec: PeftSpec):
    """``model`` as trained under ``spec``: the shared builder the PEFT accounting is tested against."""
    from memfit.exact.peft_build import build_peft_meta_model

    return build_peft_meta_model(model, spec)


def num_layers(config) -> int:
    """Block count of a transformers config object (its canonical ``num_hidden_layers``)."""
    for attr in ("num_hidden_layers", "n_layer", "num_layers"):
        value = getattr(config, attr, None)
        if isinstance(value, int):
            return value
    return 0
