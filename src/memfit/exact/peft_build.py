"""Apply the real peft library to a transformers model, as a ``PeftSpec`` describes.

The reference for ``memfit.core.peft.params.apply_peft`` (tests compare the two name by name) and the way
the trace and replay code get the model as trained. On a meta model the new modules (LoRA A/B, the
prefix encoder) are built on the meta device too, so the seed case's 956M-parameter prefix encoder
costs no memory; on a real model peft puts them where the base layers are.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from memfit.core.model import ParamSpec
from memfit.core.peft.lora import ALL_LINEAR
from memfit.core.peft.modules import resolve_task_type
from memfit.core.peft.params import trained_under_freeze, validate_peft_spec
from memfit.core.peft.spec import PeftSpec

if TYPE_CHECKING:
    import torch
    from peft import PeftConfig


def peft_config_for(model: torch.nn.Module, spec: PeftSpec) -> PeftConfig | None:
    """The peft config equivalent to ``spec`` for ``model`` (``None`` for ``full`` and ``freeze``).

    The task type comes from ``spec.task_type`` or the model class, as ``apply_peft`` reads it, so
    ``get_peft_model`` picks the same ``PeftModelFor<task>`` class.
    """
    from peft import PEFT_TYPE_TO_CONFIG_MAPPING, LoraConfig, PrefixTuningConfig, PromptTuningConfig

    from memfit.core.peft.tuners import TUNERS
    from memfit.core.peft.tuners.read import tuner_config

    validate_peft_spec(spec)
    if spec.method in ("full", "freeze"):
        return None
    config = getattr(model, "config", None)
    task = resolve_task_type(
        type(model).__name__, is_encoder_decoder=bool(getattr(config, "is_encoder_decoder", False)), spec=spec
    )
    modules_to_save = list(spec.modules_to_save) or None
    if spec.method in TUNERS:
        tuner = TUNERS[spec.method]
        return PEFT_TYPE_TO_CONFIG_MAPPING[tuner.peft_type](task_type=task, **tuner_config(tuner, spec))
    if spec.method == "lora":
        pattern = spec.target_modules_pattern
        if pattern is not None and pattern.lower() == ALL_LINEAR:
            pattern = ALL_LINEAR
        exclude = spec.exclude_pattern if spec.exclude_pattern is not None else (list(spec.exclude_modules) or None)
        return LoraConfig(
            task_type=task,
            r=spec.lora_r,
            lora_alpha=spec.lora_alpha,
            lora_dropout=spec.lora_dropout,
            target_modules=list(spec.target_modules) or pattern,
            exclude_modules=exclude,
            layers_to_transform=list(spec.layers_to_transform) or None,
            layers_pattern=list(spec.layers_pattern) or None,
            rank_pattern=dict(spec.rank_pattern),
            alpha_pattern=dict(spec.alpha_pattern),
            bias=spec.lora_bias,
            modules_to_save=modules_to_save,
            use_dora=spec.use_dora,
        )
    common = dict(
        task_type=task,
        num_virtual_tokens=spec.num_virtual_tokens,
        token_dim=spec.token_dim,
        num_transformer_submodules=spec.num_transformer_submodules,
        modules_to_save=modules_to_save,
    )
    if spec.method == "prefix":
        return PrefixTuningConfig(
            **common,
            num_layers=spec.num_layers,
            prefix_projection=spec.prefix_projection,
            encoder_hidden_size=spec.encoder_hidden_size,
        )
    return PromptTuningConfig(**common)


def build_peft_meta_model(model: torch.nn.Module, spec: PeftSpec) -> torch.nn.Module:
    """``model`` as trained under ``spec``, built by the real libraries.

    ``full``/``freeze`` set ``requires_grad`` on ``model`` itself and return it; the peft methods
    return ``peft.get_peft_model(model, peft_config_for(model, spec))``, run under
    ``torch.device("meta")`` when ``model`` is on the meta device.
    """
    import torch

    validate_peft_spec(spec)
    if spec.method in ("full", "freeze"):  # no peft (nor the bitsandbytes it imports: seconds of CPU)
        for name, param in model.named_parameters():
            param.requires_grad_(spec.method == "full" or trained_under_freeze(name, spec))
        return model
    from peft import get_peft_model

    from memfit.core.peft.tuners import TUNERS

    if spec.method in TUNERS and getattr(model, "config", None) is not None:
        for key, value in TUNERS[spec.method].model_config.items():  # what peft requires of the base (Tuner doc)
            setattr(model.config, key, value)
    config = peft_config_for(model, spec)
    on_meta = any(p.device.type == "meta" for p in model.parameters())
    if on_meta:
        with torch.device("meta"):
            built = get_peft_model(model, config)
    else:
        built = get_peft_model(model, config)
    if spec.lora_fa:  # peft/optimizers/lorafa.py:create_lorafa_optimizer
        for name, param in built.named_parameters():
            if "lora_A" in name:
                param.requires_grad_(False)
    return built


def named_param_specs(module: torch.nn.Module) -> tuple[ParamSpec, ...]:
    """``module.named_parameters()`` as ``ParamSpec``s (tied weights once, trainable = requires_grad)."""
    return tuple(ParamSpec(name, tuple(p.shape), p.requires_grad) for name, p in module.named_parameters())
