"""bitsandbytes quantization in the core (``memfit.core.quant`` and the quantized params of
``memfit.core.ledger.pytorch.params``) against the real library on this CPU (bitsandbytes 0.50.2
quantizes on the CPU).

The model is built as transformers' loader builds a quantized one (``memfit.replay.pytorch.quantize``:
``replace_with_bnb_linear`` and ``Params4bit(...).to(device)`` / ``Int8Params``), for tiny Llama and
GPT-2 (Conv1D) configs and every storage option. Checked byte for byte: which weights are quantized
(transformers' module selection: not the output head), and every tensor each quantized weight
stores: packed data in the ``bnb_4bit_quant_storage`` dtype, absmax (fp32, or uint8 + nested fp32
absmax + offset + its own dynamic map under double quantization), the 16-entry code; int8 CB + SCB.
Then ``prepare_model_for_kbit_training``: every other param fp32, as ``TParam.dtype`` says.
"""

from __future__ import annotations

import dataclasses

import pytest

from memfit.core.frameworks.pytorch import QuantSettings

torch = pytest.importorskip("torch")
pytest.importorskip("bitsandbytes")

QUANTS = [
    QuantSettings(method="4bit", quant_type="nf4", double_quant=True, compute_dtype="bf16"),
    QuantSettings(method="4bit", quant_type="fp4", double_quant=False, compute_dtype="fp32"),
    QuantSettings(method="4bit", quant_type="nf4", double_quant=True, compute_dtype="bf16", quant_storage="bf16"),
    QuantSettings(method="4bit", quant_type="nf4", double_quant=False, compute_dtype="fp16", quant_storage="fp32"),
    QuantSettings(method="8bit"),
]


def _configs():
    from memfit.replay.deepspeed.record_fixtures import TINY_LLAMA
    from memfit.replay.pytorch.record_fixtures import TINY_GPT2

    return {"llama": dict(TINY_LLAMA, num_hidden_layers=2), "gpt2": dict(TINY_GPT2, n_layer=2)}


def _scenario(cfg, q, tmp_path):
    import json

    from memfit.core.scenario.build import build_scenario
    from memfit.core.scenario.inputs import ScenarioInputs

    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return build_scenario(ScenarioInputs(model=str(path), peft_method="lora", peft_options={"lora_r": 4},
                                         quantization=dataclasses.asdict(q), load_dtype="bf16",
                                         precision="amp_bf16", accelerator="cpu"))


def _stored(p):
    """bytes of each tensor a quantized weight stores, in memfit's order."""
    qs = getattr(p, "quant_state", None)
    if qs is None:  # Int8Params
        return [p.data.untyped_storage().nbytes(), p.SCB.untyped_storage().nbytes()]
    out = [p.data.untyped_storage().nbytes()]
    if qs.nested:
        out += [qs.absmax.untyped_storage().nbytes(), qs.offset.untyped_storage().nbytes(),
                qs.state2.absmax.untyped_storage().nbytes(), qs.state2.code.untyped_storage().nbytes()]
    else:
        out.append(qs.absmax.untyped_storage().nbytes())
    out.append(qs.code.untyped_storage().nbytes())
    return out


@pytest.mark.parametrize("family", ["llama", "gpt2"])
@pytest.mark.parametrize("q", QUANTS, ids=lambda q: f"{q.method}-{q.quant_type}-dq{int(q.double_quant)}-{q.quant_storage}")
def test_quantized_storage_matches_bitsandbytes(family, q, tmp_path):
    from peft import prepare_model_for_kbit_training

    from memfit.core.ledger.pytorch.params import build_torch_model
    from memfit.replay.model_build import apply_peft
    from memfit.replay.pytorch.quantize import build_quantized_model

    cfg = _configs()[family]
    model = build_quantized_model(cfg, load_dtype="bf16", quant=q, attention="sdpa", device=torch.device("cpu"))
    model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    sc = _scenario(cfg, q, tmp_path)
    model = apply_peft(model, sc.peft)
    real = dict(model.named_parameters())
    m = build_torch_model(sc)
    assert [p.name for p in m.params] == list(real)
    n_quant = 0
    for p in m.params:
        r = real[p.name]
        quantized = type(r).__name__ in ("Params4bit", "Int8Params")
        assert p.quantized == quantized, p.name
        if quantized:
            n_quant += 1
            assert [t.nbytes for t in p.quant] == _stored(r), p.name
        else:
            assert r.dtype == {"fp32": torch.float32, "bf16": torch.bfloat16}[p.dtype], p.name
    assert n_quant >= 4 * 2  # every Linear of both blocks; the head stays unquantized
    assert not any(type(r).__name__ == "Params4bit" for n, r in real.items() if "lm_head" in n)


def test_the_dynamic_map_is_cached_once_per_device():
    import bitsandbytes.functional as F

    from memfit.core.quant import DYNAMIC_MAP_BYTES, shared_bytes

    F.quantize_4bit(torch.randn(64, 64), compress_statistics=True)
    assert F.name2qmap["dynamic"].untyped_storage().nbytes() == DYNAMIC_MAP_BYTES
    assert shared_bytes(QUANTS[0]) == DYNAMIC_MAP_BYTES and shared_bytes(QUANTS[1]) == 0
