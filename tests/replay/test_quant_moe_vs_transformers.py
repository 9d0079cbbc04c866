"""Which weights of a mixture-of-experts model bitsandbytes quantizes, against transformers 5.24 itself.

Tiny Mixtral, Qwen2-MoE, Qwen3-MoE and DeepSeek-V3 models are built on the meta device and passed
through ``replace_with_bnb_linear`` with the skips ``get_modules_to_not_convert`` gives (what
``from_pretrained(quantization_config=BitsAndBytesConfig(load_in_4bit=True))`` does before loading):
the modules it turns into ``Linear4bit`` equal ``memfit.core.quant.quantized_weights``, by name and
shape. In 5.24 the fused 3-D experts and every router (``*TopKRouter``: no ``nn.Linear``) stay in the
load dtype. A real build of the Mixtral (bitsandbytes' CPU backend quantizing each weight:
``memfit.replay.pytorch.quantize``) then holds exactly the packed and quant-state bytes memfit counts.

Older releases, from their source (``transformers`` v4.48.1 ``models/mixtral/modeling_mixtral.py``):
``MixtralBlockSparseTop2MLP`` with ``w1``/``w2``/``w3`` as ``nn.Linear`` per expert and
``self.gate = nn.Linear(hidden_dim, num_experts, bias=False)``, all quantized by that release's
``replace_with_bnb_linear`` (``isinstance(module, (nn.Linear, Conv1D))``); memfit does not plan that
layout and says so in a note (checked below).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("bitsandbytes")

from memfit.core.catalog import ModelConfigSource  # noqa: E402
from memfit.core.frameworks.pytorch import QuantSettings  # noqa: E402
from memfit.core.quant import quantized_bytes, quantized_weights, shared_bytes  # noqa: E402
from memfit.core.shapes import build_model_shape  # noqa: E402

BASE = dict(vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, tie_word_embeddings=False)
MOE = {
    "mixtral": ("Mixtral", dict(num_local_experts=4, num_experts_per_tok=2)),
    "qwen2_moe": ("Qwen2Moe", dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                                   shared_expert_intermediate_size=32)),
    "qwen3_moe": ("Qwen3Moe", dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)),
    "deepseek_v3": ("DeepseekV3", dict(n_routed_experts=4, num_experts_per_tok=2, n_group=2, topk_group=1,
                                       moe_intermediate_size=32, first_k_dense_replace=1, q_lora_rank=None,
                                       kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16)),
}
Q = QuantSettings(method="4bit", quant_type="nf4", double_quant=True, compute_dtype="bf16")


def _config(model_type: str) -> dict:
    name, extra = MOE[model_type]
    return {**BASE, **extra, "model_type": model_type, "architectures": [f"{name}ForCausalLM"]}


def _memfit(model_type: str):
    m = build_model_shape(ModelConfigSource(name=model_type, config=_config(model_type), path=None, origin="local"))
    return m, quantized_weights(m.params, Q, model_type)


@pytest.mark.parametrize("model_type", sorted(MOE))
def test_replaced_modules_equal_transformers(model_type):
    import bitsandbytes as bnb
    from transformers.integrations.bitsandbytes import replace_with_bnb_linear
    from transformers.quantizers.base import HfQuantizer

    name, _ = MOE[model_type]
    cfg = getattr(transformers, f"{name}Config")(**{k: v for k, v in _config(model_type).items()
                                                     if k not in ("model_type", "architectures")})
    with torch.device("meta"):
        model = getattr(transformers, f"{name}ForCausalLM")(cfg)
    qc = transformers.BitsAndBytesConfig(load_in_4bit=True)
    skip = HfQuantizer.get_modules_to_not_convert(model, qc.llm_int8_skip_modules,
                                                  getattr(model, "_keep_in_fp32_modules", None))
    replace_with_bnb_linear(model, modules_to_not_convert=skip, quantization_config=qc, pre_quantized=False)
    theirs = {f"{n}.weight": (mod.out_features, mod.in_features) for n, mod in model.named_modules()
              if isinstance(mod, bnb.nn.Linear4bit)}
    _, mine = _memfit(model_type)
    assert mine == theirs
    assert not any(".experts." in n or n.endswith((".mlp.gate.weight", ".router.weight")) for n in mine)


def test_real_quantized_mixtral_holds_what_memfit_counts():
    import bitsandbytes as bnb
    import bitsandbytes.functional as F

    from memfit.replay.pytorch.quantize import build_quantized_model

    model = build_quantized_model(_config("mixtral"), load_dtype="bf16", quant=Q, attention="sdpa", device="cpu")
    held = 0
    for mod in model.modules():
        if isinstance(mod, bnb.nn.Linear4bit):
            qs = mod.weight.quant_state
            held += sum(t.numel() * t.element_size() for t in (mod.weight, qs.absmax, qs.code, qs.offset,
                                                                qs.state2.absmax, qs.state2.code))
    held += sum(t.numel() * t.element_size() for t in F.name2qmap.values())
    _, mine = _memfit("mixtral")
    assert sum(quantized_bytes(Q, s) for s in mine.values()) + shared_bytes(Q) == held


def test_pre_5_releases_are_said_out_loud():
    from memfit.core.quant import quant_notes

    class _V:
        transformers = "4.48"  # Stack.transformers is the release line

    class _R:
        bitsandbytes_version_given = True

    m, _ = _memfit("mixtral")
    sc = type("Sc", (), dict(quant=Q, versions=_V(), runtime=_R(), framework="torch", model=m))()
    assert any("builds each expert as nn.Linear" in n for n in quant_notes(sc))
    _V.transformers = "5.24"
    assert not any("builds each expert" in n for n in quant_notes(sc))
