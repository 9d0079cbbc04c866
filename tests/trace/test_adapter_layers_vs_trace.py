"""Each PEFT method's adapted layer: memfit's saved-tensor formula against peft's own layer, traced.

For every case the real peft tuner wraps one ``nn.Linear`` (``memfit.trace.adapters``) and runs on
CPU tensors with CUDA's dropout kernel (a 1-byte mask); memfit plans the same layer through its
own path (``apply_peft`` on a one-layer shape, then ``memfit.core.activations.adapters``). Both are
compared at two token counts and two layer shapes (so per-token and weight-sized terms are both
pinned) and three dtype contexts: a bf16 base with fp32 adapters (peft's ``autocast_adapter_dtype``
in the torch loop), everything bf16 (DeepSpeed's cast), an fp32 model under bf16 autocast (torch
AMP; autocast's copies of ``nn.Linear`` weights are the ledger's ``amp.weight_casts`` and are taken
out of the traced figure here).

Tolerance: 16 bytes, the 0-d tensors memfit leaves out (the loss's own scalar, a ``torch.tensor``
scale); every formula is otherwise exact (worst seen: 4 bytes).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

from memfit.core.activations.adapters import adapter_activations  # noqa: E402
from memfit.core.model import ArchSpec, ModelShape, ParamSpec  # noqa: E402
from memfit.core.peft.params import apply_peft  # noqa: E402
from memfit.core.peft.parse import adapter_config_spec  # noqa: E402
from memfit.trace.adapters import build_adapted_layer, trace_adapted_layer  # noqa: E402

TOLERANCE_BYTES = 16  # 0-d tensors left out (the loss scalar, a torch.tensor scale); worst seen 4 B
SHAPES = [(48, 80), (96, 32)]
TOKENS = [16, 40]
CONTEXTS = {  # name: (base dtype, adapter dtype, autocast)
    "bf16+fp32-adapters": ("bf16", "fp32", None),
    "bf16": ("bf16", "bf16", None),
    "amp-bf16": ("fp32", "fp32", "bf16"),
}
_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}

CASES = {
    "lora": ("LORA", {"r": 8}),
    "lora-dropout": ("LORA", {"r": 4, "lora_dropout": 0.1}),
    "dora": ("LORA", {"r": 8, "use_dora": True}),
    "dora-dropout": ("LORA", {"r": 8, "use_dora": True, "lora_dropout": 0.05}),
    "adalora": ("ADALORA", {"total_step": 10, "init_r": 6}),
    "adalora-dropout": ("ADALORA", {"total_step": 10, "lora_dropout": 0.1}),
}


def _planned(peft_type: str, config: dict, in_f: int, out_f: int, tokens: int, context: str) -> int:
    base, adapter, autocast = CONTEXTS[context]
    arch = ArchSpec(model_type="custom", num_layers=1, hidden_size=in_f, num_heads=1, num_kv_heads=1, head_dim=in_f,
                    intermediate_size=out_f, vocab_size=1)
    shape = ModelShape(name="one-layer", architecture="Holder", arch=arch,
                       params=(ParamSpec("proj.weight", (out_f, in_f)),))
    spec = adapter_config_spec({"peft_type": peft_type, "target_modules": ["proj"], **config})
    trained = apply_peft(shape, spec)
    acts = adapter_activations(trained, spec, adapter_bytes=_BYTES[adapter],
                               autocast_bytes=_BYTES[autocast] if autocast else 0, base_bytes=_BYTES[base],
                               upcast=_BYTES[base] == 2)  # peft built the adapters on a 16-bit base
    (layer,) = acts.layers
    s = acts.saved(layer, _BYTES[base])
    return s.per_token * tokens + s.fixed, s.keeps_input


def _linear_weight_casts(model: torch.nn.Module, autocast: str | None) -> int:
    """autocast's 16-bit copies of the nn.Linear weights (the ledger's amp.weight_casts), saved here."""
    if not autocast:
        return 0
    return sum(m.weight.numel() * 2 for m in model.modules()
               if isinstance(m, torch.nn.Linear) and m.weight.dtype == torch.float32)


@pytest.mark.parametrize("context", list(CONTEXTS))
@pytest.mark.parametrize("case", list(CASES))
def test_adapter_layer_matches_trace(case, context):
    peft_type, config = CASES[case]
    base, adapter, autocast = CONTEXTS[context]
    for in_f, out_f in SHAPES:
        model = build_adapted_layer(peft_type, config, in_features=in_f, out_features=out_f, dtype=base,
                                    adapter_dtype=adapter)
        casts = _linear_weight_casts(model, autocast)
        for tokens in TOKENS:
            traced = trace_adapted_layer(peft_type, config, in_features=in_f, out_features=out_f, tokens=tokens,
                                         dtype=base, adapter_dtype=adapter, autocast=autocast, model=model)
            planned, keeps = _planned(peft_type, config, in_f, out_f, tokens, context)
            measured = traced.saved_bytes - casts
            assert keeps == traced.keeps_input, (case, context, in_f, out_f, tokens)
            assert abs(planned - measured) <= TOLERANCE_BYTES, (case, context, in_f, out_f, tokens, planned, measured)
