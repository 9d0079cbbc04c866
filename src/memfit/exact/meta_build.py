"""The real transformers model on the meta device: the reference the pure shapes are tested against.

``build_meta_model`` instantiates the class memfit models for a config (the same class
``memfit.core.shapes.modelled_architecture`` names) under ``torch.device("meta")``: every parameter
gets its true shape and dtype but no storage, so even Llama-3-70B builds in a fraction of a second
on a laptop. ``named_param_shapes`` and ``named_buffer_specs`` read it back as ``ParamSpec`` and
``BufferSpec`` rows.

The load dtype is applied as ``from_pretrained(dtype=...)`` applies it: the model is built with
that dtype as torch's default dtype (``PreTrainedModel._set_default_dtype``), so parameters take it
and buffers keep the dtype their modeling code gives them (GPT-J's rotary table and Llama's
``inv_freq`` stay fp32 in an fp16 load). A blanket ``model.to(dtype)`` would cast floating buffers
too and is not what a loaded model holds. Meta and real CPU builds register the same buffers (names,
shapes, dtypes); only their values are missing on meta.

One adjustment mirrors ``from_pretrained``: when config.json says ``tie_word_embeddings: false`` but
the class ties its output embedding anyway (transformers 5 forces ``T5Config.tie_word_embeddings``
to true), the output embedding gets its own parameter, because
``PreTrainedModel.tie_weights`` (transformers/modeling_utils.py) does not tie two weights that the
checkpoint holds with different values ("both are present in the checkpoints with different
values, so we will NOT tie them"), which is what T5 v1.1 checkpoints such as T0_3B do.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from memfit.core.catalog import ModelConfigSource
from memfit.core.families import FAMILIES
from memfit.core.model import BUFFER_DTYPE_BYTES, BufferSpec, ParamSpec
from memfit.core.shapes import modelled_architecture
from memfit.errors import MemfitError

if TYPE_CHECKING:
    import torch

DTYPES = ("fp32", "fp16", "bf16")


def _torch_dtype(dtype: str) -> torch.dtype:
    import torch

    table = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
    if dtype not in table:
        raise MemfitError(f"dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    return table[dtype]


def build_meta_model(
    source: ModelConfigSource, *, dtype: str = "fp32", trust_remote_code: bool = False
) -> torch.nn.Module:
    """The transformers model for ``source`` with every parameter on the meta device.

    Families memfit sizes build their ``modelled_architecture`` class; other model types that
    transformers knows build through ``AutoModelForCausalLM``; custom code (``auto_map``) needs
    ``trust_remote_code`` and a local directory holding the code.
    """
    import torch

    torch_dtype = _torch_dtype(dtype)
    model_type = source.model_type
    try:
        import transformers
    except ImportError as exc:
        raise MemfitError("the exact path needs transformers: pip install 'memfit[exact]'") from exc

    if "auto_map" in source.config:
        config, make = _remote_code_builder(source, trust_remote_code=trust_remote_code)
    elif model_type in FAMILIES:
        config = transformers.CONFIG_MAPPING[model_type].from_dict(source.config_dict())
        model_class = getattr(transformers, modelled_architecture(source))
        make = lambda: model_class(config)  # noqa: E731
    else:
        if model_type not in transformers.CONFIG_MAPPING:
            raise MemfitError(
                f"transformers {transformers.__version__} does not know model_type {model_type!r}"
            )
        config = transformers.CONFIG_MAPPING[model_type].from_dict(source.config_dict())
        make = lambda: transformers.AutoModelForCausalLM.from_config(config)  # noqa: E731

    default_dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch_dtype)
    try:
        with torch.device("meta"):
            model = make()
    finally:
        torch.set_default_dtype(default_dtype)
    _untie_like_checkpoint(model, source)
    for param in model.parameters():  # the few created with an explicit dtype; buffers untouched
        if param.is_floating_point() and param.dtype != torch_dtype:
            param.data = param.data.to(torch_dtype)
    return model


def _remote_code_builder(source: ModelConfigSource, *, trust_remote_code: bool):
    """Config and constructor for a model with custom code shipped next to its config.json."""
    import transformers

    if not trust_remote_code:
        raise MemfitError(f"{source.name} needs custom modeling code: pass trust_remote_code")
    if source.origin != "local" or source.path is None:
        raise MemfitError(
            f"{source.name} needs custom modeling code; the exact path builds it only from a local "
            "directory holding config.json and its .py files"
        )
    directory = os.path.dirname(source.path)
    config = transformers.AutoConfig.from_pretrained(directory, trust_remote_code=True)
    return config, lambda: transformers.AutoModelForCausalLM.from_config(
        config, trust_remote_code=True
    )


def _untie_like_checkpoint(model: torch.nn.Module, source: ModelConfigSource) -> None:
    """Give the output embedding its own parameter when config.json says it is not tied."""
    import torch

    if source.config.get("tie_word_embeddings") is not False:
        return
    get_output = getattr(model, "get_output_embeddings", None)
    get_input = getattr(model, "get_input_embeddings", None)
    output = get_output() if get_output else None
    inputs = get_input() if get_input else None
    if output is None or inputs is None or output.weight is not inputs.weight:
        return
    output.weight = torch.nn.Parameter(torch.empty_like(output.weight, device="meta"))
    tied = getattr(model, "all_tied_weights_keys", None)  # transformers 5: {target: source} names
    if tied:
        name = next(name for name, module in model.named_modules() if module is output)
        tied.pop(f"{name}.weight", None)


def named_param_shapes(model: torch.nn.Module) -> tuple[ParamSpec, ...]:
    """``ParamSpec`` rows of ``model.named_parameters()`` (tied weights once, as torch does)."""
    return tuple(
        ParamSpec(name, tuple(param.shape), param.requires_grad)
        for name, param in model.named_parameters()
    )


def buffer_dtype_name(dtype: torch.dtype) -> str:
    """memfit's name for a buffer's torch dtype (``torch.float32`` -> ``fp32``)."""
    import torch

    names = {
        torch.float64: "fp64", torch.float32: "fp32", torch.float16: "fp16",
        torch.bfloat16: "bf16", torch.int64: "int64", torch.int32: "int32", torch.int16: "int16",
        torch.int8: "int8", torch.uint8: "uint8", torch.bool: "bool",
        torch.complex64: "complex64", torch.complex128: "complex128",
    }
    if dtype not in names:
        raise MemfitError(
            f"the model has a {dtype} buffer; memfit sizes {', '.join(BUFFER_DTYPE_BYTES)} buffers"
        )
    return names[dtype]


def named_buffer_specs(
    model: torch.nn.Module, *, fp16_model: torch.nn.Module | None = None
) -> tuple[BufferSpec, ...]:
    """``BufferSpec`` rows of ``model.named_buffers()`` (shared buffers once, as torch yields them).

    ``model`` is built (or loaded) at dtype fp32; ``persistent`` is whether ``state_dict()`` holds
    the buffer. ``follows_load_dtype`` cannot be read from one build: pass ``fp16_model``, the same
    model built or loaded at fp16, and a buffer follows the load dtype when it is fp16 there and not
    in ``model``. Without ``fp16_model`` every row says False.
    """
    import torch

    saved = set(model.state_dict(keep_vars=True))
    at_fp16 = dict(fp16_model.named_buffers()) if fp16_model is not None else {}
    rows = []
    for name, buffer in model.named_buffers():
        other = at_fp16.get(name)
        follows = (
            other is not None and other.dtype == torch.float16 and buffer.dtype != torch.float16
        )
        rows.append(
            BufferSpec(
                name,
                tuple(buffer.shape),
                buffer_dtype_name(buffer.dtype),
                persistent=name in saved,
                follows_load_dtype=follows,
            )
        )
    return tuple(rows)
