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
layout for those releases (``families.moe.per_expert_params``, checked below against 4.51.0's source).
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


PRE5_BLOCK = {"mixtral": ("MixtralBlockSparseTop2MLP", "MixtralSparseMoeBlock"),
              "qwen2_moe": ("Qwen2MoeMLP", "Qwen2MoeSparseMoeBlock"), "qwen3_moe": ("Qwen3MoeMLP", "Qwen3MoeSparseMoeBlock")}


@pytest.mark.parametrize("model_type", sorted(PRE5_BLOCK))
def test_pre_5_layout_is_the_releases_and_bitsandbytes_quantizes_every_expert(request, tmp_path_factory, model_type):
    """transformers 4.51.0's own modeling file (the wheel, sha256-pinned): each expert's three
    ``nn.Linear`` in registration order, the sparse block's attribute name, and the router an
    ``nn.Linear``; memfit's shape for that release names and sizes every expert's weights so, and
    quantizes each of them and the router (4.51's ``replace_with_bnb_linear`` converts every
    ``nn.Linear`` outside ``lm_head``). The count equals the fused 5.x layout's."""
    import re

    from conftest import sdist_cache
    from sdist_source import SourceUnavailable, wheel_files

    path = f"transformers/models/{model_type}/modeling_{model_type}.py"
    try:
        src = wheel_files("transformers", "4.51.0", (path,), sdist_cache(request, tmp_path_factory))[path]
    except SourceUnavailable as e:
        pytest.fail(f"transformers 4.51.0's wheel is needed: {e}", pytrace=False)
    expert_cls, block_cls = PRE5_BLOCK[model_type]
    body = src[src.index(f"class {expert_cls}("):]
    body = body[:body.index("def forward")]
    linears = re.findall(r"self\.(\w+) = nn\.Linear\(self\.(\w+), self\.(\w+)", body)
    assert len(linears) == 3
    block_attr = re.search(rf"self\.(\w+) = {block_cls}\(config\)", src).group(1)
    block = src[src.index(f"class {block_cls}("):]
    assert re.search(r"self\.gate = nn\.Linear\(", block[:block.index("def forward")])  # the router: a Linear
    dims = {"hidden_dim": "d", "hidden_size": "d", "ffn_dim": "i", "intermediate_size": "i"}

    cfg = _config(model_type)
    src_cfg = ModelConfigSource(name=model_type, config=cfg, path=None, origin="local")
    fused = build_model_shape(src_cfg)
    old = build_model_shape(src_cfg, transformers_line="4.51")
    assert sum(p.numel for p in old.params) == sum(p.numel for p in fused.params)
    d = cfg["hidden_size"]
    i = cfg.get("moe_intermediate_size", cfg["intermediate_size"])
    E = cfg.get("num_local_experts", cfg.get("num_experts"))
    size = {"d": d, "i": i}
    shapes = {p.name: p.shape for p in old.params}
    layer0 = [n for n in shapes if n.startswith(f"model.layers.0.{block_attr}.experts.")]
    assert layer0 == [f"model.layers.0.{block_attr}.experts.{e}.{name}.weight" for e in range(E)
                      for name, _, _ in linears]
    for e in range(E):
        for name, fan_in, fan_out in linears:
            assert shapes[f"model.layers.0.{block_attr}.experts.{e}.{name}.weight"] == (size[dims[fan_out]],
                                                                                     size[dims[fan_in]])
    mine = quantized_weights(old.params, Q, model_type)
    every_linear = {n for n in shapes if n.endswith(".weight") and len(shapes[n]) == 2 and "norm" not in n
                    and "embed_tokens" not in n and n != "lm_head.weight"}
    assert set(mine) == every_linear
    assert f"model.layers.0.{block_attr}.gate.weight" in mine


def test_pre_5_adapters_on_separate_experts_are_one_line():
    from memfit.core.scenario.build import build_scenario
    from memfit.core.scenario.inputs import ScenarioInputs
    from memfit.errors import MemfitError

    with pytest.raises(MemfitError, match=r"adapters on transformers 4.x's separate experts \(model\.layers\.0\."
                                          r"block_sparse_moe\.experts\.0\.w1 and the others\)"):
        build_scenario(ScenarioInputs(model="mistralai/Mixtral-8x7B-v0.1", peft_method="lora",
                                      peft_options={"target_modules": "all-linear"}, transformers_version="4.48"))
    sc = build_scenario(ScenarioInputs(model="mistralai/Mixtral-8x7B-v0.1", peft_method="full",
                                       transformers_version="4.48"))  # every expert trains: no adapter, planned
    assert any(".block_sparse_moe.experts.7.w2.weight" in p.name and p.trainable for p in sc.model.params)
