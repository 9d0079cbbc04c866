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

from adapter_cases import CONTEXTS, SHAPES, TOKENS, TOLERANCE_BYTES, linear_weight_casts, planned_layer  # noqa: E402

from memfit.trace.adapters import build_adapted_layer, trace_adapted_layer  # noqa: E402

CASES = {
    "lora": ("LORA", {"r": 8}),
    "lora-dropout": ("LORA", {"r": 4, "lora_dropout": 0.1}),
    "dora": ("LORA", {"r": 8, "use_dora": True}),
    "dora-dropout": ("LORA", {"r": 8, "use_dora": True, "lora_dropout": 0.05}),
    "adalora": ("ADALORA", {"total_step": 10, "init_r": 6}),
    "adalora-dropout": ("ADALORA", {"total_step": 10, "lora_dropout": 0.1}),
}


@pytest.mark.parametrize("context", list(CONTEXTS))
@pytest.mark.parametrize("case", list(CASES))
def test_adapter_layer_matches_trace(case, context):
    peft_type, config = CASES[case]
    base, adapter, autocast = CONTEXTS[context]
    for in_f, out_f in SHAPES:
        model = build_adapted_layer(peft_type, config, in_features=in_f, out_features=out_f, dtype=base,
                                    adapter_dtype=adapter)
        casts = linear_weight_casts(model, autocast)
        for tokens in TOKENS:
            traced = trace_adapted_layer(peft_type, config, in_features=in_f, out_features=out_f, tokens=tokens,
                                         dtype=base, adapter_dtype=adapter, autocast=autocast, model=model)
            planned, keeps = planned_layer(peft_type, config, in_f, out_f, tokens, context)
            measured = traced.saved_bytes - casts
            assert keeps == traced.keeps_input, (case, context, in_f, out_f, tokens)
            assert abs(planned - measured) <= TOLERANCE_BYTES, (case, context, in_f, out_f, tokens, planned, measured)
