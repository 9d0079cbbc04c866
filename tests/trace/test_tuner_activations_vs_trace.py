"""Every tuner memfit plans, the whole model: memfit's activation estimate (the base model's analytic
layout plus ``memfit.core.activations.adapters``) against a fake-tensor trace of the real model code
with the real peft tuner (``memfit.trace.step.trace_training_step``, CUDA kernel choices).

A Llama of hidden 384 (6 heads, 2 key/value heads, 3 layers), built with real tensors on the CPU and
traced by ``memfit.trace.step.trace_model`` (several tuners make data-dependent choices in their forward,
a module dropout's ``torch.rand(1) > p``, top-k, ``nonzero``, which fake tensors cannot take), bf16 as
DeepSpeed casts it (parameters, adapters included; buffers keep their dtype), eager attention (CUDA's
sdpa kernels have no CPU implementation to run real tensors through; eager attention is the same math
on both), 96 tokens, the tuners on every Linear of each block where they take a list of targets. VeRA
and DeLoRA are not in the list: with DeepSpeed's cast their fp32 buffers (VeRA's projections, DeLoRA's
w_norm) meet bf16 tensors and peft's forward raises (see tests/trace/test_adapter_layers_vs_trace.py). OSF is skipped for the same kind of
reason (its frozen factors and trained parts end up in different dtypes and peft's matmul raises;
its layer is traced in one dtype by that test). PVeRA, TinyLoRA, UniLoRA and AdaMSS raise the same way under the cast
(``NOT_MATCHED``): they are traced as fp32 models instead (``FP32_CASES``). Poly mixes its factors per sample:
it is traced at two sequences too.
Tolerance: 0.5%, what README.md states for the analytic model against the trace (the adapters' own
tensors are exact per layer: tests/trace/test_adapter_layers_vs_trace.py); worst seen below.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")

from memfit.core.activations.adapters import adapter_activations  # noqa: E402
from memfit.core.activations.analytic import estimate_activation_bytes  # noqa: E402
from memfit.core.catalog import ModelConfigSource  # noqa: E402
from memfit.core.peft.params import apply_peft  # noqa: E402
from memfit.core.peft.parse import adapter_config_spec  # noqa: E402
from memfit.core.shapes import build_model_shape  # noqa: E402
from tests.installed_stack import TRANSFORMERS_LINE  # noqa: E402
from memfit.trace.results import TraceOptions  # noqa: E402

from adapter_cases import cuda_only_copies  # noqa: E402

TOLERANCE = 0.005  # README.md: the analytic model is within 0.5% of the trace; worst seen +0.215% (adalora)
H, LAYERS = 384, 3
CONFIG = dict(model_type="llama", vocab_size=2000, hidden_size=H, intermediate_size=1024, num_hidden_layers=LAYERS,
              num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=1024, tie_word_embeddings=False,
              architectures=["LlamaForCausalLM"])
ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
SEQ = 96

CASES = {
    "lora": {"peft_type": "LORA", "r": 8, "target_modules": ALL},
    "lora-dropout": {"peft_type": "LORA", "r": 8, "lora_dropout": 0.1, "target_modules": ALL},
    "dora": {"peft_type": "LORA", "r": 8, "use_dora": True, "target_modules": ALL},
    "adalora": {"peft_type": "ADALORA", "total_step": 10, "target_modules": ALL},
    "ia3": {"peft_type": "IA3"},
    "loha": {"peft_type": "LOHA", "target_modules": ALL},
    "lokr": {"peft_type": "LOKR", "target_modules": ALL},
    "oft": {"peft_type": "OFT", "target_modules": ALL},
    # the rotation the einsum reads is kept for x's gradient only: without it, and with block_share's repeat
    "oft-solve": {"peft_type": "OFT", "target_modules": ALL, "use_cayley_neumann": False},
    "oft-share": {"peft_type": "OFT", "target_modules": ALL, "block_share": True},
    "boft": {"peft_type": "BOFT", "target_modules": ["q_proj", "v_proj"]},
    "hra": {"peft_type": "HRA", "target_modules": ALL},
    "fourierft": {"peft_type": "FOURIERFT", "target_modules": ALL},
    "waveft": {"peft_type": "WAVEFT", "target_modules": ["q_proj", "o_proj"]},
    # q adapted, v not: the first block's probs @ v keeps no probabilities (v needs no gradient)
    "lora-q-only": {"peft_type": "LORA", "r": 8, "target_modules": ["q_proj"]},
    "miss": {"peft_type": "MISS", "target_modules": ALL},
    "vblora": {"peft_type": "VBLORA", "target_modules": ALL, "vector_length": 64},
    "ln_tuning": {"peft_type": "LN_TUNING"},
    "osf": {"peft_type": "OSF"},
    "road": {"peft_type": "ROAD", "target_modules": ALL, "group_size": 64},
    "c3a": {"peft_type": "C3A", "target_modules": ALL, "block_size": 128},
    "shira": {"peft_type": "SHIRA", "target_modules": ALL},
    "gralora": {"peft_type": "GRALORA", "target_modules": ALL, "hybrid_r": 8},
    "randlora": {"peft_type": "RANDLORA", "target_modules": ALL},
    "beft": {"peft_type": "BEFT", "target_modules": ALL},
    "deft": {"peft_type": "DEFT", "target_modules": ALL},
    "frod": {"peft_type": "FROD", "target_modules": ALL},
    "hira": {"peft_type": "HIRA", "target_modules": ALL, "r": 8},
    "hira-embedding": {"peft_type": "HIRA", "target_modules": [*ALL, "embed_tokens"], "r": 8},
    # an adapted or trained input embedding: its output requires grad, so the first block keeps what the others keep
    "lora-embedding": {"peft_type": "LORA", "r": 8, "target_modules": [*ALL, "embed_tokens"]},
    "lora-save-embedding": {"peft_type": "LORA", "r": 8, "target_modules": ALL, "modules_to_save": ["embed_tokens"]},
    "trainable-tokens": {"peft_type": "TRAINABLE_TOKENS", "token_indices": [0, 1, 2]},
    "glora": {"peft_type": "GLORA", "target_modules": ALL},
    "lily": {"peft_type": "LILY", "target_modules": ALL, "r": 16, "stride_A": 2, "num_B": 3},
    "peanut": {"peft_type": "PEANUT", "target_modules": ALL, "r": 16, "depth": 1},
    "pvera": {"peft_type": "PVERA", "target_modules": ALL},
    "tinylora": {"peft_type": "TINYLORA", "target_modules": ALL},
    "unilora": {"peft_type": "UNILORA", "target_modules": ALL},
    "supertuning": {"peft_type": "SUPERTUNING", "target_modules": ALL},
    "supertuning-supra": {"peft_type": "SUPERTUNING", "target_modules": ALL, "sparsity": 0.95, "r": 8},
    "psoft": {"peft_type": "PSOFT", "target_modules": ALL},
    "psoft-neumann": {"peft_type": "PSOFT", "target_modules": ALL, "r": 16, "use_cayley_neumann": True},
    "poly": {"peft_type": "POLY", "target_modules": ALL, "n_splits": 2},
    "adamss": {"peft_type": "ADAMSS", "target_modules": ALL},
    "shadow": {"peft_type": "SHADOW"},
}
NOT_MATCHED = {  # measured, not yet explained: the plan is above the trace (issue 21 item 2, not done)
    "osf": "not traced: under DeepSpeed's params-only cast peft's OSF forward raises (bf16 vs fp32 matmul)",
    "frod": "-51.06% (20,152,328 B): the model is built in fp32 and DeepSpeed's cast leaves FRoD's frod_V/frod_U "
            "buffers fp32, so every forward copies them to bf16 and keeps the copies ((in^2 + out*in) * 2 B per layer, "
            "20,152,320 B here); the plan has them in the base's dtype, as peft builds them on a bf16 model: so built, "
            "the trace is matched to 8 B (test_frod_matches_with_its_buffers_as_built_on_bf16)",
    "pvera": "not traced: under DeepSpeed's params-only cast peft's PVeRA forward raises (bf16 input vs its fp32 "
             "projection buffers, as VeRA's; its layer is traced in the other contexts; the model in fp32: "
             "FP32_CASES)",
    "tinylora": "not traced: under DeepSpeed's params-only cast peft's TinyLoRA forward raises (its fp32 SVD buffers "
                "vs the bf16 R; its layer is traced in the other contexts; the model in fp32: FP32_CASES)",
    "unilora": "not traced: under DeepSpeed's params-only cast peft's UniLoRA forward raises (bf16 input vs its fp32 "
               "factors, theta_d times fp32 scale buffers; its layer is traced in the other contexts; the model in "
               "fp32: FP32_CASES)",
    "adamss": "not traced: under DeepSpeed's params-only cast peft's AdaMSS forward raises (AdamssLayer.dtype is the "
              "weight's dtype when peft built it, fp32, so base_layer(x.to(fp32)) meets the bf16 weight; its layer is "
              "traced in every context; the model in fp32: FP32_CASES)",
}
WORST: dict[str, float] = {}


def _plan(raw: dict, elem: int = 2, micro_batch: int = 1):
    source = ModelConfigSource(name="llama-384", config=CONFIG, path=None, origin="local")
    spec = adapter_config_spec({"task_type": "CAUSAL_LM", **raw})
    shape = apply_peft(build_model_shape(source, transformers_line=TRANSFORMERS_LINE), spec)
    acts = adapter_activations(shape, spec, adapter_bytes=elem, base_bytes=elem)
    est = estimate_activation_bytes(shape.arch, spec, seq_len=SEQ, micro_batch=micro_batch, dtype_bytes=elem,
                                    attention="eager", adapters=acts)
    return spec, est.total_bytes


def _traced(spec, dtype: str = "bf16", micro_batch: int = 1, bf16_buffers: tuple[str, ...] = (),
            config: dict = CONFIG) -> int:
    """``dtype`` bf16: DeepSpeed's params-only cast of an fp32 build; fp32: the build as it is.
    ``bf16_buffers``: name fragments of buffers cast to bf16 after peft built them (as they are when peft
    builds the adapters on a bf16 model)."""
    import torch
    import transformers

    from memfit.exact.peft_build import build_peft_meta_model
    from memfit.trace.step import causal_lm_inputs, quiet_libraries, trace_model

    options = TraceOptions(seq_len=SEQ, micro_batch=micro_batch, dtype=dtype, attention="eager", granularity_bytes=1)
    with quiet_libraries():
        torch.manual_seed(0)
        hf = transformers.LlamaConfig(**{k: v for k, v in config.items() if k not in ("model_type", "architectures")})
        model = transformers.AutoModelForCausalLM.from_config(hf, attn_implementation="eager", dtype=torch.float32)
        model = build_peft_meta_model(model, spec)
        if dtype == "bf16":
            for p in model.parameters():  # DeepSpeed's cast: parameters only
                p.data = p.data.to(torch.bfloat16)
        for name, b in list(model.named_buffers()):
            if any(f in name for f in bf16_buffers):
                owner, _, leaf = name.rpartition(".")
                model.get_submodule(owner)._buffers[leaf] = b.to(torch.bfloat16)
        if spec.method == "poly":  # PolyModel.forward(task_ids=...) sets them on every layer by these hooks
            model.base_model._register_pre_hooks(torch.zeros(micro_batch, dtype=torch.long))
        model.train()
        traced = trace_model(model, causal_lm_inputs(options), options, method=spec.method).activation_bytes
        return traced + cuda_only_copies(model)


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_tuner_activations_match_the_trace(case):
    if case in NOT_MATCHED:
        pytest.skip(f"not matched yet: plan {NOT_MATCHED[case]}")
    spec, planned = _plan(CASES[case])
    traced = _traced(spec)
    err = (planned - traced) / traced
    WORST[case] = err
    print(f"{case:12s} trace {traced:>12,} B  plan {planned:>12,} B  {err:+.3%}")
    assert abs(err) <= TOLERANCE, (case, traced, planned)


@pytest.mark.slow
def test_frod_matches_with_its_buffers_as_built_on_bf16():
    spec, planned = _plan(CASES["frod"])
    traced = _traced(spec, bf16_buffers=(".frod_U.", ".frod_V."))
    assert abs(planned - traced) / traced <= TOLERANCE, (traced, planned)
FP32_CASES = ("pvera", "tinylora", "unilora", "adamss")
"""Tuners whose forward raises under DeepSpeed's params-only cast (``NOT_MATCHED``): the same model traced in
fp32 instead (no cast: buffers and parameters in one dtype), which still pins the first block's inputs that need
no gradient and the whole-model sum."""


@pytest.mark.slow
@pytest.mark.parametrize("case", FP32_CASES)
def test_tuner_activations_match_the_trace_in_fp32(case):
    spec, planned = _plan(CASES[case], elem=4)
    traced = _traced(spec, dtype="fp32")
    err = (planned - traced) / traced
    print(f"{case:12s} fp32 trace {traced:>12,} B  plan {planned:>12,} B  {err:+.3%}")
    assert abs(err) <= TOLERANCE, (case, traced, planned)


@pytest.mark.slow
@pytest.mark.parametrize("case", ["poly"])
def test_per_sample_activations_match_the_trace_at_two_sequences(case):
    """Poly mixes its factors per sample (``Saved.per_sample``): the layer traces run one sequence, this one two."""
    spec, planned = _plan(CASES[case], micro_batch=2)
    traced = _traced(spec, micro_batch=2)
    err = (planned - traced) / traced
    print(f"{case:12s} 2 sequences: trace {traced:>12,} B  plan {planned:>12,} B  {err:+.3%}")
    assert abs(err) <= TOLERANCE, (case, traced, planned)


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(__import__("memfit.core.peft.cast_mismatch", fromlist=["x"])
                                        .RAISES_UNDER_PARAMS_ONLY_CAST))
def test_forward_raises_under_the_params_only_cast(case):
    """``memfit.core.peft.cast_mismatch``'s list (the ``tuner-dtype-mismatch`` finding) is what peft's forward
    does: each raises a two-dtype matmul under DeepSpeed's params-only cast of an fp32 build (the others
    of ``CASES`` trace in ``test_tuner_activations_match_the_trace``)."""
    from memfit.errors import MemfitError

    spec, _ = _plan(CASES[case])
    with pytest.raises((RuntimeError, MemfitError), match="same dtype"):
        _traced(spec)


XLORA_EXPERTS = ({"r": 8, "target_modules": ["q_proj", "v_proj"]},
                 {"r": 4, "target_modules": ALL, "lora_dropout": 0.1})
XLORA_CASES = {
    "xlora": {"hidden_size": H},
    "xlora-deep-layerwise": {"hidden_size": H, "xlora_depth": 2, "xlora_size": 64, "layerwise_scalings": True},
    "xlora-deep-no-dropout": {"hidden_size": H, "xlora_depth": 3, "xlora_size": 32, "xlora_dropout_p": 0.0,
                              "enable_softmax": False},
    "xlora-layerwise-no-softmax": {"hidden_size": H, "layerwise_scalings": True, "enable_softmax": False},
    "xlora-trained-experts": {"hidden_size": H, "use_trainable_adapters": True},
}


def _xlora_raw(tmp_path, settings: dict) -> dict:
    """An X-LoRA adapter config naming ``XLORA_EXPERTS``, each saved by peft into ``tmp_path`` first."""
    import torch
    import transformers
    from peft import LoraConfig, get_peft_model

    adapters = {}
    hf = transformers.LlamaConfig(**{k: v for k, v in CONFIG.items() if k not in ("model_type", "architectures")})
    for i, expert in enumerate(XLORA_EXPERTS):
        torch.manual_seed(0)
        base = transformers.AutoModelForCausalLM.from_config(hf)
        get_peft_model(base, LoraConfig(task_type="CAUSAL_LM", **expert)).save_pretrained(str(tmp_path / f"e{i}"))
        adapters[str(i)] = str(tmp_path / f"e{i}")
    return {"peft_type": "XLORA", "adapters": adapters, **settings}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(XLORA_CASES))
def test_xlora_activations_match_the_trace(case, tmp_path):
    """X-LoRA: two experts saved by peft (one on q and v, one on every Linear with dropout), the classifier's depth,
    width, dropout and layerwise scalings as the case says; peft loads the experts from those folders. The model
    does not cache (peft's XLoraModel refuses one that does). Its no-grad scaling pass keeps nothing: the trace's
    saved tensors are the second pass's and the classifier's. Traced in fp32: under DeepSpeed's params-only cast
    of an fp32 build peft's forward raises (the classifier makes its dummy scalings in the dtype it was built in,
    ``XLoraClassifier.dtype``, fp32, and ``x * scalings`` then meets the bf16 ``lora_A``). The model keeps no
    key/value cache (``AdapterActivations.kv_cache``): with it the plan was 294,912 B (k and v of 3 layers) over."""
    spec, planned = _plan(_xlora_raw(tmp_path, XLORA_CASES[case]), elem=4)
    traced = _traced(spec, dtype="fp32", config={**CONFIG, "use_cache": False})
    err = (planned - traced) / traced
    print(f"{case:12s} trace {traced:>12,} B  plan {planned:>12,} B  {err:+.3%}")
    assert abs(err) <= TOLERANCE, (case, traced, planned)


SHADOW_CASES = {
    # measured: +0.008% (trace 9,555,700 B), +0.008% (9,372,532 B), +0.008% (9,723,508 B): 766 B above each
    "resized": {"peft_type": "SHADOW", "shadow_hidden_size": 192, "shadow_num_attention_heads": 2,
                "shadow_num_hidden_layers": 2, "shadow_intermediate_size": 512},
    "unshared": {"peft_type": "SHADOW", "share_embeddings": False, "r": 16},
}
"""SHADOW's other backbones ("shadow" in ``CASES`` is the default one): resized to 192 wide and 2 deep behind a
projection (its heads not grouped), and with its own embeddings."""


@pytest.mark.slow
@pytest.mark.parametrize("case", list(SHADOW_CASES))
def test_shadow_backbones_match_the_trace(case):
    """The mirror backbone's blocks, cache and projection, every block's shadow tensors, the exit block's released
    ones and the shadow loss's log-softmax."""
    spec, planned = _plan(SHADOW_CASES[case])
    assert any("SHADOW activations:" in n for n in spec.notes)
    traced = _traced(spec)
    err = (planned - traced) / traced
    print(f"shadow {case:10s} trace {traced:>12,} B  plan {planned:>12,} B  {err:+.3%}")
    assert abs(err) <= TOLERANCE, (case, traced, planned)


@pytest.mark.slow
def test_xlora_forward_raises_on_a_cast_fp32_build(tmp_path):
    """X-LoRA's classifier keeps the dtype the model had when peft built it as a plain attribute
    (``XLoraClassifier.dtype``), so on an fp32 build cast to bf16 afterwards (DeepSpeed's cast, of the parameters
    or of the whole module: no cast reaches an attribute) the scaling pass's dummy scalings are fp32 and
    ``x * scalings`` meets the bf16 ``lora_A``: the plan's note says to load the model in its training dtype."""
    from memfit.errors import MemfitError

    spec, _ = _plan(_xlora_raw(tmp_path, XLORA_CASES["xlora"]))
    assert any("load the model in the dtype it trains in" in n for n in spec.notes)
    with pytest.raises((RuntimeError, MemfitError), match="same dtype"):
        _traced(spec, config={**CONFIG, "use_cache": False})


@pytest.mark.slow
def test_shadow_under_checkpointing_matches_the_trace():
    """Measured +0.014% (5,629,298 B planned, 5,628,532 B traced): the blocks' shadow tensors are outside the
    checkpointed block, transformers' ``enable_input_require_grads`` makes both embedding outputs (the base's and the
    one the backbone reads) leaves that require grad, held, the backbone's first block then keeps what a trained
    input keeps, and its cache stays on."""
    import torch
    import transformers

    from memfit.exact.peft_build import build_peft_meta_model
    from memfit.trace.step import causal_lm_inputs, checkpoint_kwargs, quiet_libraries, trace_model

    spec = adapter_config_spec({"task_type": "CAUSAL_LM", "peft_type": "SHADOW"})
    assert any("SHADOW activations:" in n for n in spec.notes)
    source = ModelConfigSource(name="llama-384", config=CONFIG, path=None, origin="local")
    shape = apply_peft(build_model_shape(source, transformers_line=TRANSFORMERS_LINE), spec)
    acts = adapter_activations(shape, spec, adapter_bytes=2, base_bytes=2)
    planned = estimate_activation_bytes(shape.arch, spec, seq_len=SEQ, micro_batch=1, dtype_bytes=2, attention="eager",
                                        adapters=acts, gradient_checkpointing=True).total_bytes
    options = TraceOptions(seq_len=SEQ, micro_batch=1, dtype="bf16", attention="eager", granularity_bytes=1,
                           gradient_checkpointing=True)
    with quiet_libraries():
        torch.manual_seed(0)
        hf = transformers.LlamaConfig(**{k: v for k, v in CONFIG.items() if k not in ("model_type", "architectures")})
        model = transformers.AutoModelForCausalLM.from_config(hf, attn_implementation="eager", dtype=torch.float32)
        model = build_peft_meta_model(model, spec)
        for p in model.parameters():
            p.data = p.data.to(torch.bfloat16)
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=checkpoint_kwargs(options))
        model.train()
        traced = trace_model(model, causal_lm_inputs(options), options, method=spec.method).activation_bytes
        traced += cuda_only_copies(model)
    err = (planned - traced) / traced
    print(f"shadow checkpointed trace {traced:>12,} B  plan {planned:>12,} B  {err:+.3%}")
    assert abs(err) <= TOLERANCE, (traced, planned)
