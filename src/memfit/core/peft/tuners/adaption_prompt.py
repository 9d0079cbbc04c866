"""Adaption prompt (LLaMA-Adapter): a trained prompt and gate in each of the last ``adapter_layers``
attention modules (peft 0.21 ``tuners/adaption_prompt/``: ``AdaptionPromptModel.add_adapter`` wraps each
module named ``*.<target_modules>`` in an ``AdaptedAttention`` holding the original as ``model``)."""

from __future__ import annotations

from memfit.core.model import ModelShape, ParamSpec
from memfit.core.peft.modules import module_names
from memfit.core.peft.spec import PeftSpec
from memfit.core.peft.tuners.base import Settings, Tuner, keys, require, sized

ATTENTION = {"llama": "self_attn", "mistral": "self_attn", "gpt2": "attn"}
"""``adaption_prompt/config.py:TRANSFORMERS_MODEL_CONFIG``: the attention module per supported model type."""


def adaption_prompt(shape: ModelShape, spec: PeftSpec, s: Settings) -> ModelShape:
    """``adaption_prompt (1, adapter_len, hidden)`` and ``adaption_gate (1,)`` in each adapted attention,
    before its own (frozen) parameters, now under ``<attention>.model.``; everything else frozen."""
    model_type = shape.arch.model_type
    require(model_type in ATTENTION, f"Unsupported model type for adaption prompt: {model_type!r} (peft supports "
            f"{', '.join(ATTENTION)})")
    target = spec.target_modules_pattern or ATTENTION[model_type]
    length, count = s["adapter_len"], s["adapter_layers"]
    require(isinstance(length, int) and length > 0, f"adapter_len must be a positive integer, got {length!r}")
    require(isinstance(count, int) and count > 0, f"adapter_layers must be a positive integer, got {count!r}")
    parents = [m for m in module_names(shape.params) if m.endswith("." + target)]
    require(len(parents) >= count, f"Config specifies more adapter layers '{count}' than the model has "
            f"'{len(parents)}'.")
    adapted = parents[-count:]
    out: list[ParamSpec] = []
    seen: set[str] = set()
    for p in shape.params:
        module = next((a for a in adapted if p.name.startswith(a + ".")), None)
        if module is None:
            out.append(ParamSpec("base_model.model." + p.name, p.shape, False))
            continue
        if module not in seen:
            seen.add(module)
            out += [ParamSpec(f"base_model.model.{module}.adaption_prompt", (1, length, shape.arch.hidden_size)),
                    ParamSpec(f"base_model.model.{module}.adaption_gate", (1,))]
        out.append(ParamSpec(f"base_model.model.{module}.model{p.name[len(module):]}", p.shape, False))
    return shape.with_params(tuple(out))


TUNER = Tuner(
    peft_type="ADAPTION_PROMPT", method="adaption_prompt", prefix="adaption_",
    source="peft/tuners/adaption_prompt/model.py, layer.py", build=adaption_prompt,
    keys=keys(
        target_modules=sized("str", None, "the attention module's name (default per model type)"),
        adapter_len=sized("int", None, "prompt tokens per adapted layer"),
        adapter_layers=sized("int", None, "adapted layers, counted from the top"),
    ),
)
