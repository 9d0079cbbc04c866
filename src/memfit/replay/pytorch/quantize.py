"""A bitsandbytes-quantized model for replays, built with the calls transformers' loader makes.

``from_pretrained(quantization_config=BitsAndBytesConfig(...))`` (transformers 5.24) does, in
order: ``Bnb4BitHfQuantizer._process_model_before_weight_loading`` ->
``integrations/bitsandbytes.py:replace_with_bnb_linear`` (every ``nn.Linear``/``Conv1D`` not in
``get_modules_to_not_convert`` becomes a ``Linear4bit``/``Linear8bitLt`` on the meta device), then
per quantized weight ``Bnb4bitQuantize.convert``: ``bnb.nn.Params4bit(value, requires_grad=False,
**old.__dict__).to(value.device)`` (8-bit: ``Int8Params(...).to(device)``), and
``_process_model_after_weight_loading`` sets ``is_loaded_in_4bit``/``is_loaded_in_8bit``.

A replay has no checkpoint, so ``value`` is the weight of a ``from_config`` model in the load dtype
(random values, same shapes): the same modules are replaced and each weight is quantized by the same
call, on the replay's device.
"""

from __future__ import annotations

from typing import Any

from memfit.core.frameworks.pytorch import QuantSettings

_DTYPE = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16", "uint8": "uint8"}


def bnb_config(q: QuantSettings):
    import torch
    import transformers

    if q.method == "8bit":
        return transformers.BitsAndBytesConfig(load_in_8bit=True,
                                               llm_int8_skip_modules=None if q.skip_modules is None else list(q.skip_modules))
    return transformers.BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type=q.quant_type, bnb_4bit_use_double_quant=q.double_quant,
        bnb_4bit_compute_dtype=getattr(torch, _DTYPE[q.compute_dtype]),
        bnb_4bit_quant_storage=getattr(torch, _DTYPE[q.quant_storage]),
        llm_int8_skip_modules=None if q.skip_modules is None else list(q.skip_modules))


def build_quantized_model(config: dict[str, Any], *, load_dtype: str, quant: QuantSettings, attention: str, device):
    import bitsandbytes as bnb
    import torch
    from transformers.integrations.bitsandbytes import replace_with_bnb_linear
    from transformers.pytorch_utils import Conv1D
    from transformers.quantizers.base import HfQuantizer

    from memfit.replay.model_build import build_model

    model = build_model(config, dtype=load_dtype, attention=attention)
    qc = bnb_config(quant)
    skip = HfQuantizer.get_modules_to_not_convert(model, qc.llm_int8_skip_modules,
                                                  getattr(model, "_keep_in_fp32_modules", None))
    originals = {name: (mod.weight, mod.bias, isinstance(mod, Conv1D))
                 for name, mod in model.named_modules() if isinstance(mod, Conv1D) or type(mod) is torch.nn.Linear}
    replace_with_bnb_linear(model, modules_to_not_convert=skip, quantization_config=qc, pre_quantized=False)
    for name, mod in model.named_modules():
        if not isinstance(mod, (bnb.nn.Linear4bit, bnb.nn.Linear8bitLt)):
            continue
        weight, bias, conv1d = originals.pop(name)
        value = weight.data.T if conv1d else weight.data
        old = mod.weight
        if isinstance(mod, bnb.nn.Linear4bit):
            new = bnb.nn.Params4bit(value, requires_grad=False, **old.__dict__).to(device)
        else:
            new = bnb.nn.Int8Params(value, requires_grad=False, **old.__dict__).to(device)
        mod.weight = new
        mod.bias = bias
        del weight, value, old
    originals.clear()
    model.config.quantization_config = qc
    setattr(model, "is_loaded_in_4bit" if quant.method == "4bit" else "is_loaded_in_8bit", True)
    return model
