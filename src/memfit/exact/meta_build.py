"""The real transformers model on the meta device: the reference the pure shapes are tested against,
the model a trace runs, and the plan's shapes for a ``model_type`` without a pure builder.

``build_meta_model`` instantiates the class for a config and task under ``torch.device("meta")``:
every parameter gets its true shape and dtype but no storage, so even Llama-3-70B builds in a
fraction of a second. The class is the family's (``memfit.core.shapes.modelled_architecture``), or,
for other ``model_type``s transformers ships, the one ``architectures[0]`` names when it is a
transformers class of that task, else the Auto class of the task (``AutoModelForCausalLM``,
``AutoModelForSeq2SeqLM`` for encoder-decoders, ``AutoModelForMaskedLM`` ...). Custom code
(``auto_map``) runs only with ``trust_remote_code`` and only from a local directory.
``named_param_shapes`` and ``named_buffer_specs`` read it back as ``ParamSpec`` and ``BufferSpec``
rows; ``shape_from_meta_build`` turns them into a ``ModelShape`` (``source="meta"``).

The load dtype is applied as ``from_pretrained(dtype=...)`` applies it: the model is built with
that dtype as torch's default dtype (``PreTrainedModel._set_default_dtype``), so parameters take it
and buffers keep the dtype their modeling code gives them (GPT-J's rotary table and Llama's
``inv_freq`` stay fp32 in an fp16 load). A blanket ``model.to(dtype)`` would cast floating buffers
too and is not what a loaded model holds.

One adjustment mirrors ``from_pretrained``: when config.json says ``tie_word_embeddings: false`` but
the class ties its output embedding anyway (transformers 5 forces ``T5Config.tie_word_embeddings``
to true), the output embedding gets its own parameter, because ``PreTrainedModel.tie_weights``
(transformers/modeling_utils.py) does not tie two weights that the checkpoint holds with different
values, which is what T5 v1.1 checkpoints such as T0_3B do.

Every failure of transformers (an unsupported attention implementation, a class that does not fit
the config) becomes one ``MemfitError`` line, never transformers' multi-kilobyte message.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from memfit.core.catalog import ModelConfigSource
from memfit.core.families import FAMILIES, TRANSFORMERS_MODEL_TYPES
from memfit.core.families import attention as attention_table
from memfit.core.families.heads import TASKS, head_labels, num_labels, task_of_class
from memfit.core.model import BUFFER_DTYPE_BYTES, ArchSpec, BufferSpec, ModelShape, ParamSpec
from memfit.core.shapes import modelled_architecture
from memfit.errors import MemfitError

if TYPE_CHECKING:
    import torch

DTYPES = ("fp32", "fp16", "bf16")

AUTO_CLASSES = {
    "causal-lm": "AutoModelForCausalLM",
    "masked-lm": "AutoModelForMaskedLM",
    "seq2seq-lm": "AutoModelForSeq2SeqLM",
    "sequence-classification": "AutoModelForSequenceClassification",
    "token-classification": "AutoModelForTokenClassification",
    "question-answering": "AutoModelForQuestionAnswering",
}
"""The Auto class of each task (transformers/models/auto/modeling_auto.py)."""


def _torch_dtype(dtype: str) -> torch.dtype:
    import torch

    table = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
    if dtype not in table:
        raise MemfitError(f"dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    return table[dtype]


def _one_line(exc: BaseException) -> str:
    """The first sentence of a library error (transformers lists every model class otherwise)."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    head = text.split(". ")[0]
    return head if len(head) <= 300 else head[:297] + "..."


def _transformers():
    try:
        import transformers
    except ImportError as exc:
        raise MemfitError("the exact path needs transformers: pip install 'memfit[exact]'") from exc
    return transformers


def default_task(source: ModelConfigSource) -> str:
    """The task of ``architectures[0]``, else causal LM (seq2seq LM for encoder-decoder configs)."""
    archs = source.config.get("architectures")
    if isinstance(archs, list | tuple) and archs and isinstance(archs[0], str):
        task = task_of_class(archs[0])
        if task is not None:
            return task
    return "seq2seq-lm" if source.config.get("is_encoder_decoder") else "causal-lm"


def resolve_class(source: ModelConfigSource, task: str | None = None) -> tuple[Any, str]:
    """``(constructor, task)``: the transformers class (or Auto class) a meta build uses."""
    transformers = _transformers()
    model_type = source.model_type
    if model_type in FAMILIES:
        name = modelled_architecture(source, task=task)
        return getattr(transformers, name), task_of_class(name) or FAMILIES[model_type].default_task
    if model_type not in transformers.CONFIG_MAPPING:
        raise MemfitError(f"transformers {transformers.__version__} does not know model_type {model_type!r}")
    task = task or default_task(source)
    if task not in TASKS:
        raise MemfitError(f"--task must be one of {', '.join(TASKS)}, got {task!r}")
    archs = source.config.get("architectures")
    named = archs[0] if isinstance(archs, list | tuple) and archs and isinstance(archs[0], str) else None
    if named and task_of_class(named) == task and hasattr(transformers, named):
        return getattr(transformers, named), task
    return getattr(transformers, AUTO_CLASSES[task]), task


def hf_config(source: ModelConfigSource):
    """The transformers config object of ``source`` (its own config class, no remote code)."""
    transformers = _transformers()
    try:
        return transformers.CONFIG_MAPPING[source.model_type].from_dict(source.config_dict())
    except KeyError as exc:
        raise MemfitError(
            f"transformers {transformers.__version__} does not know model_type {source.model_type!r}"
        ) from exc
    except (ValueError, TypeError, AttributeError) as exc:
        raise MemfitError(f"transformers rejects {source.name}'s config.json: {_one_line(exc)}") from exc


def build_meta_model(
    source: ModelConfigSource,
    *,
    dtype: str = "fp32",
    task: str | None = None,
    trust_remote_code: bool = False,
    attention: str | None = None,
) -> torch.nn.Module:
    """The transformers model for ``source`` and ``task`` with every parameter on the meta device.

    ``attention``: the ``attn_implementation`` to build (None: transformers' default); refused with
    one line when the family does not support it (``memfit.core.families.attention``).
    """
    import torch

    torch_dtype = _torch_dtype(dtype)
    kwargs: dict[str, Any] = {}
    if attention is not None:
        if source.model_type in FAMILIES:
            attention_table.resolve(source.model_type, attention)
        kwargs["attn_implementation"] = attention
    if "auto_map" in source.config and (trust_remote_code or source.model_type not in TRANSFORMERS_MODEL_TYPES):
        config, make = _remote_code_builder(source, trust_remote_code=trust_remote_code, task=task, kwargs=kwargs)
    else:
        config = hf_config(source)
        model_class, _ = resolve_class(source, task)
        # dtype given explicitly, as from_pretrained(dtype=...) does: the config's own torch_dtype
        # would otherwise become the default dtype during the build
        if hasattr(model_class, "from_config"):  # an Auto class
            make = lambda: model_class.from_config(config, dtype=torch_dtype, **kwargs)  # noqa: E731
        else:
            make = lambda: model_class._from_config(config, dtype=torch_dtype, **kwargs)  # noqa: E731

    default_dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch_dtype)
    try:
        with torch.device("meta"):
            model = make()
    except (ValueError, TypeError, KeyError, ImportError, AttributeError, AssertionError) as exc:
        raise MemfitError(f"transformers cannot build {source.name}: {_one_line(exc)}") from exc
    finally:
        torch.set_default_dtype(default_dtype)
    _untie_like_checkpoint(model, source)
    for param in model.parameters():  # the few created with an explicit dtype; buffers untouched
        if param.is_floating_point() and param.dtype != torch_dtype:
            param.data = param.data.to(torch_dtype)
    return model


def _remote_code_builder(source: ModelConfigSource, *, trust_remote_code: bool, task: str | None, kwargs: dict):
    """Config and constructor for a model with custom code shipped next to its config.json."""
    transformers = _transformers()

    if not trust_remote_code:
        raise MemfitError(f"{source.name} needs custom modeling code: pass --trust-remote-code")
    if source.origin != "local" or source.path is None:
        raise MemfitError(
            f"{source.name} needs custom modeling code; the exact path builds it only from a local "
            "directory holding config.json and its .py files"
        )
    directory = os.path.dirname(source.path)
    config = transformers.AutoConfig.from_pretrained(directory, trust_remote_code=True)
    auto = getattr(transformers, AUTO_CLASSES[task or default_task(source)])
    return config, lambda: auto.from_config(config, trust_remote_code=True, **kwargs)


def _untie_like_checkpoint(model: torch.nn.Module, source: ModelConfigSource) -> None:
    """Give the output embedding its own parameter when config.json says it is not tied."""
    import torch

    if source.config.get("tie_word_embeddings") is not False:
        return
    get_output = getattr(model, "get_output_embeddings", None)
    get_input = getattr(model, "get_input_embeddings", None)
    output = get_output() if get_output else None
    inputs = get_input() if get_input else None
    if output is None or inputs is None or getattr(output, "weight", None) is not inputs.weight:
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


def _first_int(config: Any, *names: str, default: int = 0) -> int:
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return default


def shape_from_meta_build(
    source: ModelConfigSource, *, task: str | None = None, trust_remote_code: bool = False
) -> ModelShape:
    """A ``ModelShape`` read from the meta-device build of a class memfit has no pure builder for.

    Parameters and buffers are exact (the class's own ``named_parameters``/``named_buffers``); the
    architecture numbers are read from the transformers config object where it has the usual
    names, for labels and notes only: the activations of such a model come from a trace.
    """
    model = build_meta_model(source, task=task, trust_remote_code=trust_remote_code)
    config = model.config
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    resolved_task = task or task_of_class(type(model).__name__) or default_task(source)
    d = _first_int(text, "hidden_size", "d_model", "n_embd", "dim", default=1)
    heads = _first_int(text, "num_attention_heads", "n_head", "num_heads", "encoder_attention_heads", default=1)
    labels = num_labels(source.config)
    encoder_decoder = bool(getattr(config, "is_encoder_decoder", False))
    layers = _first_int(text, "num_hidden_layers", "n_layer", "num_layers", "decoder_layers", default=1)
    arch = ArchSpec(
        model_type=source.model_type,
        num_layers=layers,
        hidden_size=d,
        num_heads=heads,
        num_kv_heads=_first_int(text, "num_key_value_heads", "num_kv_heads", default=heads),
        head_dim=_first_int(text, "head_dim", default=max(d // heads, 1)),
        intermediate_size=_first_int(text, "intermediate_size", "ffn_dim", "n_inner", "d_ff", default=4 * d),
        vocab_size=_first_int(text, "vocab_size", default=1),
        num_encoder_layers=_first_int(text, "encoder_layers", "num_layers", default=layers) if encoder_decoder else 0,
        max_positions=_first_int(text, "max_position_embeddings", "n_positions", default=0),
        task=resolved_task,
        num_labels=head_labels(resolved_task, labels),
    )
    note = (f"{source.model_type} has no pure-Python builder: parameters from a meta-device build of "
            f"{type(model).__name__}, activations traced from its code (slower: torch and transformers run)")
    return ModelShape(
        name=source.name,
        architecture=type(model).__name__,
        arch=arch,
        params=named_param_shapes(model),
        buffers=named_buffer_specs(model),
        notes=(note,),
        source="meta",
    )
