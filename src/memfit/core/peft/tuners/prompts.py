"""Prompt-learning tuners beside prompt and prefix tuning (``memfit.core.peft.prompt_learning``): P-tuning,
multitask prompt tuning, CPT and Cartridges. The base model is frozen under ``base_model.`` and the
prompt encoder sits under ``prompt_encoder.default.`` (``PeftModel._setup_prompt_encoder``, peft 0.21),
with the sizes ``_prepare_prompt_learning_config`` fills in (``prompt_learning_dims``).

- P-tuning (``tuners/p_tuning/model.py:PromptEncoder``): ``embedding (n*subm, d)`` and, in training,
  an MLP head ``d -> h -> h -> d`` or a bidirectional ``LSTM(d, h, encoder_num_layers)`` + ``2h -> 2h -> d``.
- Multitask prompt tuning (``tuners/multitask_prompt_tuning/model.py``): ``prefix_task_cols (tasks,
  n*subm, ranks)``, ``prefix_task_rows (tasks, ranks, d)`` and the prompt ``embedding (n*subm, d)``.
- CPT (``tuners/cpt/model.py:CPTEmbedding``): a frozen ``embedding`` and a trained ``delta_embedding``,
  both ``(len(cpt_token_ids), d)``.
- Cartridges (``tuners/cartridge/model.py:CartridgeEncoder``): a key/value prefix like prefix tuning,
  ``frozen_embedding (num_frozen_tokens, 2*L*d)`` and ``trainable_embedding (n - num_frozen_tokens, 2*L*d)``.
"""

from __future__ import annotations

from memfit.core.model import ModelShape, ParamSpec
from memfit.core.peft.modules import ADAPTER_NAME
from memfit.core.peft.prompt_learning import prompt_base_params, prompt_learning_dims
from memfit.core.peft.spec import PeftSpec
from memfit.core.peft.tuners.base import Settings, Tuner, free, keys, require, sized

AT = f"prompt_encoder.{ADAPTER_NAME}."


def _tokens(spec: PeftSpec) -> int:
    require(spec.num_virtual_tokens > 0, f"num_virtual_tokens must be positive, got {spec.num_virtual_tokens}")
    return spec.num_virtual_tokens


def p_tuning(shape: ModelShape, spec: PeftSpec, s: Settings) -> ModelShape:
    dims = prompt_learning_dims(shape, spec)
    n = _tokens(spec) * dims.num_transformer_submodules
    d = dims.token_dim
    h = s["encoder_hidden_size"] or d
    enc = [ParamSpec(AT + "embedding.weight", (n, d))]
    kind = s["encoder_reparameterization_type"]
    if kind == "LSTM":
        for layer in range(s["encoder_num_layers"]):
            width = d if layer == 0 else 2 * h
            for suffix in ("", "_reverse"):
                enc += [ParamSpec(AT + f"lstm_head.weight_ih_l{layer}{suffix}", (4 * h, width)),
                        ParamSpec(AT + f"lstm_head.weight_hh_l{layer}{suffix}", (4 * h, h)),
                        ParamSpec(AT + f"lstm_head.bias_ih_l{layer}{suffix}", (4 * h,)),
                        ParamSpec(AT + f"lstm_head.bias_hh_l{layer}{suffix}", (4 * h,))]
        widths = [(2 * h, 2 * h), (d, 2 * h)]
        names = ("mlp_head.0", "mlp_head.2")
    else:
        require(kind == "MLP", f"encoder_reparameterization_type must be MLP or LSTM, got {kind!r}")
        widths = [(h, d), (h, h), (d, h)]
        names = ("mlp_head.0", "mlp_head.2", "mlp_head.4")
    for name, (out_f, in_f) in zip(names, widths):
        enc += [ParamSpec(AT + name + ".weight", (out_f, in_f)), ParamSpec(AT + name + ".bias", (out_f,))]
    return shape.with_params(prompt_base_params(shape, spec) + tuple(enc))


def multitask(shape: ModelShape, spec: PeftSpec, s: Settings) -> ModelShape:
    dims = prompt_learning_dims(shape, spec)
    n = _tokens(spec) * dims.num_transformer_submodules
    tasks, ranks = s["num_tasks"], s["num_ranks"]
    enc = (ParamSpec(AT + "prefix_task_cols", (tasks, n, ranks)), ParamSpec(AT + "prefix_task_rows", (tasks, ranks, dims.token_dim)),
           ParamSpec(AT + "embedding.weight", (n, dims.token_dim)))
    return shape.with_params(prompt_base_params(shape, spec) + enc)


def cpt(shape: ModelShape, spec: PeftSpec, s: Settings) -> ModelShape:
    require(spec.task_type in (None, "CAUSAL_LM"), "CPTConfig only supports task_type = CAUSAL_LM.")
    ids = s["cpt_token_ids"] or (0,)
    for key in ("cpt_mask", "cpt_tokens_type_mask"):
        require(s[key] is None or len(s[key]) == len(ids),
                "cpt_token_ids, cpt_mask and cpt_tokens_type_mask must have the same length.")
    d = shape.arch.hidden_size
    enc = (ParamSpec(AT + "embedding.weight", (len(ids), d), False), ParamSpec(AT + "delta_embedding.weight", (len(ids), d)))
    return shape.with_params(prompt_base_params(shape, spec) + enc)


def cartridge(shape: ModelShape, spec: PeftSpec, s: Settings) -> ModelShape:
    dims = prompt_learning_dims(shape, spec)
    n, frozen = _tokens(spec), s["num_frozen_tokens"]
    require(0 <= frozen <= n, f"`num_frozen_tokens` must be in [0, num_virtual_tokens], got {frozen} for "
            f"num_virtual_tokens={n}.")
    width = dims.num_layers * 2 * dims.token_dim
    enc = ((ParamSpec(AT + "frozen_embedding", (frozen, width), False),) if frozen else ()) + (
        ParamSpec(AT + "trainable_embedding", (n - frozen, width)),)
    return shape.with_params(prompt_base_params(shape, spec) + enc)


_INIT_TEXT = free("str", None, "initialization text (same shapes)")
_TOKENIZER = free("str", None, "tokenizer for the init text")

P_TUNING = Tuner(
    peft_type="P_TUNING", method="p_tuning", prefix="", source="peft/tuners/p_tuning/model.py:PromptEncoder",
    build=p_tuning, prompt_learning=True,
    keys=keys(
        encoder_reparameterization_type=sized("str", "MLP", "the prompt encoder: an MLP or a bidirectional LSTM",
                                              choices=("MLP", "LSTM")),
        encoder_hidden_size=sized("int", None, "the encoder's width (default: token_dim)"),
        encoder_num_layers=sized("int", 2, "LSTM layers (the MLP always has 3 Linear layers)"),
        encoder_dropout=free("float", 0.0, "LSTM dropout between layers (masks of (1, n, 2h): negligible)"),
    ),
)

MULTITASK_PROMPT_TUNING = Tuner(
    peft_type="MULTITASK_PROMPT_TUNING", method="multitask_prompt_tuning", prefix="",
    source="peft/tuners/multitask_prompt_tuning/model.py:MultitaskPromptEmbedding", build=multitask,
    prompt_learning=True,
    keys=keys(
        prompt_tuning_init=free("str", "RANDOM", "initialization (same shapes)"),
        prompt_tuning_init_text=_INIT_TEXT, tokenizer_name_or_path=_TOKENIZER,
        tokenizer_kwargs=free("dict", None, "tokenizer options"),
        prompt_tuning_init_state_dict_path=free("str", None, "source-task prompts to start from (same shapes)"),
        prompt_tuning_init_task=free("int", 0, "which source task to start from"),
        num_ranks=sized("int", 1, "rank of the task-specific factors"),
        num_tasks=sized("int", 1, "tasks sharing the prompt"),
    ),
)

CPT = Tuner(
    peft_type="CPT", method="cpt", prefix="", source="peft/tuners/cpt/config.py, model.py:CPTEmbedding", build=cpt,
    prompt_learning=True,
    keys=keys(
        cpt_token_ids=sized("list", None, "the context tokens: the prompt length"),
        cpt_mask=sized("list", None, "one entry per context token"),
        cpt_tokens_type_mask=sized("list", None, "one entry per context token"),
        opt_weighted_loss_type=free("str", "none", "CPT's loss weighting (scalars per token)"),
        opt_loss_decay_factor=free("float", 1.0, "loss decay"),
        opt_projection_epsilon=free("float", 0.1, "projection radius of the delta"),
        opt_projection_format_epsilon=free("float", 0.1, "projection radius of format tokens"),
        tokenizer_name_or_path=_TOKENIZER,
    ),
)

CARTRIDGE = Tuner(
    peft_type="CARTRIDGE", method="cartridge", prefix="", source="peft/tuners/cartridge/model.py:CartridgeEncoder",
    build=cartridge, prompt_learning=True,
    keys=keys(num_frozen_tokens=sized("int", 1, "leading prefix tokens kept frozen")),
)
