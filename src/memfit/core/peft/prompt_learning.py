"""Prompt learning: ``get_peft_model`` with a prompt-tuning or prefix-tuning config: the frozen model
under ``base_model.`` plus ``prompt_encoder.default.*`` (peft 0.21 ``tuners/prefix_tuning/model.py``,
``tuners/prompt_tuning/model.py``)."""

from __future__ import annotations


from memfit.core.lean_dataclass import dataclass
from memfit.core.model import ArchSpec, ModelShape, ParamSpec
from memfit.core.peft.modules import (
    ADAPTER_NAME,
    TASK_MODULES_TO_SAVE,
    flatten,
    module_names,
    modules_to_save,
    task_type,
    with_modules_to_save,
)
from memfit.core.peft.spec import PeftSpec

# fmt: off
MODEL_TYPES_WITHOUT_KV_HEADS_KEY: frozenset[str] = frozenset({
    "bart", "bert", "bloom", "codegen", "deberta", "deberta-v2", "electra", "falcon", "gpt2", "gpt_neo",
    "gpt_neox", "gptj", "longt5", "mbart", "mpt", "mt5", "openai-gpt", "opt", "RefinedWeb",
    "RefinedWebModel", "roberta", "t5", "umt5", "xlm-roberta",
})
# fmt: on
"""``model_type``s whose ``config.to_dict()`` has no ``num_key_value_heads`` key, so peft sizes
their prefix by the hidden size even when the model has fewer key/value heads (falcon) or a head
width that does not multiply out to it (t5's ``d_kv``). Every other type is taken to have the key.
A shape's ``ArchSpec.kv_heads_key`` overrides the list: Falcon's config has the key from transformers
5.25 (``families.falcon.at_release``; ``falcon`` is listed for 5.24 and earlier). A test checks each
entry against the installed transformers (``has_kv_heads_key`` with its release)."""


def has_kv_heads_key(arch: ArchSpec) -> bool:
    """Whether peft's ``"num_key_value_heads" in model_config`` (``_prepare_prompt_learning_config``, peft
    0.21.2 ``utils/other.py``) holds for this model's config."""
    if arch.kv_heads_key is not None:
        return arch.kv_heads_key
    return arch.model_type not in MODEL_TYPES_WITHOUT_KV_HEADS_KEY


KV_PREFIX_METHODS = frozenset({"prefix", "cartridge"})
"""Methods whose prompt is a key/value prefix per layer: ``_prepare_prompt_learning_config`` sizes
their ``token_dim`` by the key/value heads (``peft_type in {"PREFIX_TUNING", "CARTRIDGE"}``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PromptLearningDims:
    """The sizes peft's ``_prepare_prompt_learning_config`` fills into a prompt-learning config."""

    token_dim: int
    """Width of one virtual token: the hidden size, except for prefix tuning on a config with
    ``num_key_value_heads``, where it is ``head_dim * num_key_value_heads`` (peft #1901)."""
    num_layers: int
    """``config.num_hidden_layers`` (the encoder's count for encoder-decoder models)."""
    encoder_hidden_size: int
    """Prefix projection MLP width (peft default: ``token_dim``)."""
    num_transformer_submodules: int
    """2 for SEQ_2_SEQ_LM (encoder and decoder each get the prompt), else 1."""


def prompt_learning_dims(shape: ModelShape, spec: PeftSpec) -> PromptLearningDims:
    """Mirror of ``peft.utils.other._prepare_prompt_learning_config`` plus ``_setup_prompt_encoder``.

    Values saved in an adapter_config.json (``spec.token_dim``, ...) win, except that prefix tuning
    on a model whose config has ``num_key_value_heads`` always recomputes ``token_dim``.
    """
    arch: ArchSpec = shape.arch
    token_dim = spec.token_dim or arch.hidden_size
    num_layers = spec.num_layers or (arch.num_encoder_layers or arch.num_layers)
    if spec.method in KV_PREFIX_METHODS and has_kv_heads_key(arch):
        token_dim = arch.head_dim * arch.num_kv_heads
    submodules = spec.num_transformer_submodules or (2 if task_type(shape, spec) == "SEQ_2_SEQ_LM" else 1)
    return PromptLearningDims(
        token_dim=token_dim,
        num_layers=num_layers,
        encoder_hidden_size=spec.encoder_hidden_size or token_dim,
        num_transformer_submodules=submodules,
    )


def prefix_encoder_params(dims: PromptLearningDims, spec: PeftSpec) -> tuple[ParamSpec, ...]:
    """peft's ``PrefixEncoder`` (``tuners/prefix_tuning/model.py``), training mode.

    With ``L = num_layers``, ``d = token_dim``, ``h = encoder_hidden_size``, ``n = num_virtual_tokens``:
    plain: ``Embedding(n, 2*L*d)``; with ``prefix_projection``: ``Embedding(n, d)`` then
    ``Linear(d, h)``, ``Tanh``, ``Linear(h, 2*L*d)``, i.e. ``n*d + (d+1)*h + (h+1)*2*L*d`` params
    (the seed case, GPT-J 6B with n=10, h=4096: 956,575,744).
    """
    n, d, h = spec.num_virtual_tokens, dims.token_dim, dims.encoder_hidden_size
    kv = dims.num_layers * 2 * d
    at = f"prompt_encoder.{ADAPTER_NAME}."
    if not spec.prefix_projection:
        return (ParamSpec(at + "embedding.weight", (n, kv)),)
    return (
        ParamSpec(at + "embedding.weight", (n, d)),
        ParamSpec(at + "transform.0.weight", (h, d)),
        ParamSpec(at + "transform.0.bias", (h,)),
        ParamSpec(at + "transform.2.weight", (kv, h)),
        ParamSpec(at + "transform.2.bias", (kv,)),
    )


def prompt_embedding_params(dims: PromptLearningDims, spec: PeftSpec) -> tuple[ParamSpec, ...]:
    """peft's ``PromptEmbedding`` (``tuners/prompt_tuning/model.py``).

    ``Embedding(num_virtual_tokens * num_transformer_submodules, token_dim)``.
    """
    rows = spec.num_virtual_tokens * dims.num_transformer_submodules
    return (ParamSpec(f"prompt_encoder.{ADAPTER_NAME}.embedding.weight", (rows, dims.token_dim)),)


def prompt_base_params(shape: ModelShape, spec: PeftSpec) -> tuple[ParamSpec, ...]:
    """The base model as every prompt-learning method leaves it: frozen under ``base_model.``
    (``PeftModel._setup_prompt_encoder``), with the ``modules_to_save`` copies trainable."""
    task = task_type(shape, spec)
    wrapped = modules_to_save(
        module_names(shape.params),
        (*spec.modules_to_save, *TASK_MODULES_TO_SAVE.get(task, ())),
        required=spec.modules_to_save,
    )
    # _setup_prompt_encoder freezes the parameters of the model's children: a parameter held by the
    # model object itself (no dot in its name) keeps its requires_grad.
    paired = [(ParamSpec(p.name, p.shape, p.trainable and "." not in p.name), []) for p in shape.params]
    return flatten(with_modules_to_save(paired, wrapped), "base_model.")


def prompt_learning_params(shape: ModelShape, spec: PeftSpec) -> tuple[ParamSpec, ...]:
    """Prompt/prefix tuning: ``prompt_base_params`` and the prompt encoder (``prompt_encoder.default.``)."""
    dims = prompt_learning_dims(shape, spec)
    base = prompt_base_params(shape, spec)
    encoder = (
        prefix_encoder_params(dims, spec) if spec.method == "prefix" else prompt_embedding_params(dims, spec)
    )
    return base + encoder
