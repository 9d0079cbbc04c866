"""What the adapter-layer trace tests share: the dtype contexts and memfit's own plan of one adapted layer
(``apply_peft`` on a one-layer shape, then ``memfit.core.activations.adapters``)."""

from __future__ import annotations

import torch

from memfit.core.activations.adapters import adapter_activations
from memfit.core.model import ArchSpec, ModelShape, ParamSpec
from memfit.core.peft.params import apply_peft
from memfit.core.peft.parse import adapter_config_spec

TOLERANCE_BYTES = 16  # 0-d tensors left out (the loss scalar, a torch.tensor scale); worst seen 4 B
SHAPES = [(48, 80), (96, 32)]
TOKENS = [16, 40]
CONTEXTS = {  # name: (base dtype, adapter dtype, autocast)
    "bf16+fp32-adapters": ("bf16", "fp32", None),
    "bf16": ("bf16", "bf16", None),
    "amp-bf16": ("fp32", "fp32", "bf16"),
    "bf16-base+amp": ("bf16", "fp32", "bf16"),
    "fp32": ("fp32", "fp32", None),
}
_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


def planned_layer(peft_type: str, config: dict, in_f: int, out_f: int, tokens: int, context: str,
                  bias: bool = False) -> tuple[int, bool]:
    """memfit's bytes for one adapted ``proj`` layer at ``tokens`` in ``context``, and whether it keeps the input;
    ``bias``: the base Linear has one."""
    base, adapter, autocast = CONTEXTS[context]
    arch = ArchSpec(model_type="custom", num_layers=1, hidden_size=in_f, num_heads=1, num_kv_heads=1, head_dim=in_f,
                    intermediate_size=out_f, vocab_size=1)
    shape = ModelShape(name="one-layer", architecture="Holder", arch=arch,
                       params=(ParamSpec("proj.weight", (out_f, in_f)),
                               *((ParamSpec("proj.bias", (out_f,)),) if bias else ())))
    spec = adapter_config_spec({"peft_type": peft_type, "target_modules": ["proj"], **config})
    trained = apply_peft(shape, spec)
    acts = adapter_activations(trained, spec, adapter_bytes=_BYTES[adapter],
                               autocast_bytes=_BYTES[autocast] if autocast else 0, base_bytes=_BYTES[base],
                               upcast=_BYTES[base] == 2)  # peft built the adapters on a 16-bit base
    (layer,) = acts.layers
    s = acts.saved(layer, _BYTES[base])
    return s.bytes(tokens, 1), s.keeps_input  # one sequence: the traces' input is (1, tokens, in)


BASE_NOT_RUN = {"LNTuningLayer", "HRALinear", "peft.tuners.shira.layer.Linear", "peft.tuners.supertuning.layer.Linear"}
"""Layers whose forward does not call the base ``nn.Linear`` (LN tuning runs its copy, HRA multiplies the
weight's ``.data``, SHiRA and Super-Tuning run ``F.linear`` on a rebuilt weight): no autocast copy of its weight is made.
By class name, or module and name where the name is shared (``Linear``)."""


def _frod_skips_base(m: torch.nn.Module) -> bool:
    """FRoD's ``Linear.forward`` skips the base layer with one active adapter and no dropout (``skip_base_layer``)."""
    return (f"{type(m).__module__}.{type(m).__name__}" == "peft.tuners.frod.layer.Linear"
            and all(isinstance(d, torch.nn.Identity) for d in m.frod_dropout.values()))


def linear_weight_casts(model: torch.nn.Module, autocast: str | None) -> int:
    """autocast's 16-bit copies of the nn.Linear weights that run (the ledger's amp.weight_casts), saved
    here; LN tuning runs its trained copy instead of the base layer."""
    if not autocast:
        return 0
    skip = {id(m.base_layer) for m in model.modules()
            if type(m).__name__ in BASE_NOT_RUN or f"{type(m).__module__}.{type(m).__name__}" in BASE_NOT_RUN
            or _frod_skips_base(m)}
    return sum(m.weight.numel() * 2 for m in model.modules()
               if isinstance(m, torch.nn.Linear) and m.weight.dtype == torch.float32 and id(m) not in skip
               and not hasattr(m, "base_layer"))  # a tuner layer that subclasses nn.Linear (GraLoRA's): its
    # .weight is the base layer's, counted there


def cuda_only_copies(model: torch.nn.Module) -> int:
    """Bytes a forward on CUDA copies to the device and keeps, which the CPU trace cannot see: AdaMSS's
    ``scatter_index`` (peft 0.21.2 ``tuners/adamss/layer.py``: a plain dict attribute, so neither
    ``_move_adapter_to_device_of_base_layer`` nor ``model.to()`` moves it; ``forward`` copies it with
    ``.to(adapter_delta.device)`` and ``scatter`` keeps the copy; on the CPU ``.to()`` returns the tensor itself)."""
    return sum(idx.numel() * idx.element_size() for m in model.modules()
               for idx in (getattr(m, "scatter_index", None) or {}).values())
