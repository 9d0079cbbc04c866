"""``apply_peft`` against the real peft library: same parameter names, shapes and trainability.

Every case builds a tiny transformers model on the meta device, describes it as a ``ModelShape``
(names and shapes from ``named_parameters()``), and compares ``apply_peft`` with what
``get_peft_model`` (via ``build_peft_meta_model``) really produces; for ``freeze``, with what a
user's own ``requires_grad`` loop produces (``USER_FREEZE``), not memfit's pattern matching.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from memfit.core.catalog import source_from_config  # noqa: E402
from memfit.core.families.falcon import at_release  # noqa: E402
from memfit.core.model import ArchSpec, ModelShape  # noqa: E402
from memfit.core.peft.lora import LORA_DEFAULT_TARGET_MODULES  # noqa: E402
from memfit.core.peft.params import apply_peft  # noqa: E402
from memfit.core.peft.prompt_learning import MODEL_TYPES_WITHOUT_KV_HEADS_KEY, has_kv_heads_key  # noqa: E402
from memfit.core.peft.parse import load_adapter_config  # noqa: E402
from memfit.core.peft.spec import PeftSpec  # noqa: E402
from memfit.errors import MemfitError  # noqa: E402
from memfit.core.shapes import build_model_shape  # noqa: E402
from memfit.exact.peft_build import build_peft_meta_model, named_param_specs  # noqa: E402
from tests.installed_stack import TRANSFORMERS_LINE  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore")

# Tiny configs: (auto class, config class, kwargs). Small enough to build in milliseconds. t5 has
# d_kv * heads != d_model, gemma head_dim * heads != hidden, falcon and mistral fewer kv heads.
# fmt: off
FAMILIES = {
    "gptj": ("AutoModelForCausalLM", "GPTJConfig",
             dict(vocab_size=96, n_embd=32, n_layer=2, n_head=4, rotary_dim=4, n_positions=64)),
    "gpt2": ("AutoModelForCausalLM", "GPT2Config", dict(vocab_size=96, n_embd=32, n_layer=2, n_head=4, n_positions=64)),
    "llama": ("AutoModelForCausalLM", "LlamaConfig",
              dict(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=4, tie_word_embeddings=False)),
    "mistral": ("AutoModelForCausalLM", "MistralConfig",
                dict(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2)),
    "qwen2": ("AutoModelForCausalLM", "Qwen2Config",
              dict(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, tie_word_embeddings=True)),
    "gemma": ("AutoModelForCausalLM", "GemmaConfig",
              dict(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=4, head_dim=16)),
    "falcon": ("AutoModelForCausalLM", "FalconConfig",
               dict(vocab_size=96, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_kv_heads=2,
                    new_decoder_architecture=True)),
    "opt": ("AutoModelForCausalLM", "OPTConfig",
            dict(vocab_size=96, hidden_size=32, ffn_dim=48, num_hidden_layers=2, num_attention_heads=4,
                 word_embed_proj_dim=32, max_position_embeddings=64)),
    "bloom": ("AutoModelForCausalLM", "BloomConfig", dict(vocab_size=96, hidden_size=32, n_layer=2, n_head=4)),
    "t5": ("AutoModelForSeq2SeqLM", "T5Config",
           dict(vocab_size=96, d_model=32, d_kv=16, d_ff=48, num_layers=2, num_decoder_layers=3, num_heads=4)),
    "bert": ("AutoModelForSequenceClassification", "BertConfig",
             dict(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                  max_position_embeddings=64, num_labels=3)),
}
# fmt: on

METHODS = {
    "full": PeftSpec(method="full"),
    "freeze": PeftSpec(method="freeze", freeze_patterns=("*.0.*",)),
    "lora-default": PeftSpec(method="lora"),
    "prompt": PeftSpec(method="prompt", num_virtual_tokens=5),
    "prefix": PeftSpec(method="prefix", num_virtual_tokens=5),
    "prefix-projection": PeftSpec(method="prefix", num_virtual_tokens=5, prefix_projection=True),
    "prefix-projection-width": PeftSpec(
        method="prefix", num_virtual_tokens=3, prefix_projection=True, encoder_hidden_size=24
    ),
}

# Explicit LoRA targets per family (Linear layers, plus an Embedding where the family has one).
EXPLICIT_TARGETS = {
    "gptj": ("q_proj", "fc_in", "wte"),
    "gpt2": ("c_attn", "c_fc", "wte"),
    "llama": ("q_proj", "k_proj", "down_proj", "embed_tokens"),
    "mistral": ("k_proj", "o_proj", "up_proj"),
    "qwen2": ("q_proj", "k_proj", "v_proj"),
    "gemma": ("q_proj", "gate_proj", "embed_tokens"),
    "falcon": ("query_key_value", "dense_4h_to_h"),
    "opt": ("k_proj", "fc1", "embed_tokens"),
    "bloom": ("query_key_value", "dense_h_to_4h"),
    "t5": ("q", "k", "wo"),
    "bert": ("query", "key", "dense"),
}


def _build(family: str) -> torch.nn.Module:
    auto_name, config_name, kwargs = FAMILIES[family]
    config = getattr(transformers, config_name)(**kwargs)
    with torch.device("meta"):
        return getattr(transformers, auto_name).from_config(config)


def _shape_of(model: torch.nn.Module, name: str) -> ModelShape:
    """A ModelShape read from a real (meta) model: the test's stand-in for memfit's shape builders."""
    c = model.config
    heads = c.num_attention_heads
    encoder_layers = c.num_hidden_layers if c.is_encoder_decoder else 0
    decoder_layers = getattr(c, "num_decoder_layers", None) or c.num_hidden_layers
    arch = ArchSpec(
        model_type=c.model_type,
        num_layers=decoder_layers,
        hidden_size=c.hidden_size,
        num_heads=heads,
        num_kv_heads=getattr(c, "num_key_value_heads", None) or getattr(c, "num_kv_heads", None) or heads,
        head_dim=getattr(c, "head_dim", None) or getattr(c, "d_kv", None) or c.hidden_size // heads,
        intermediate_size=getattr(c, "intermediate_size", 0) or 0,
        vocab_size=c.vocab_size,
        num_encoder_layers=encoder_layers,
    )
    shape = ModelShape(
        name=name, architecture=type(model).__name__, arch=arch, params=named_param_specs(model)
    )
    # what the builder says of the installed release (build_model_shape applies it): peft reads its config
    return at_release(shape, TRANSFORMERS_LINE) if c.model_type == "falcon" else shape


USER_FREEZE = {
    ("*.0.*",): lambda name: ".0." not in name,
    ("model.layers.*", "*.mlp.*"): lambda name: name.startswith("model.layers.") and ".mlp." not in name,
}
"""``freeze``'s reference: ``requires_grad`` set as a user's script does it, by plain string tests
on ``named_parameters()`` (not memfit's glob matching), keyed by (train patterns + freeze patterns)."""


def _user_frozen(model: torch.nn.Module, spec: PeftSpec) -> torch.nn.Module:
    trains = USER_FREEZE[(*spec.train_patterns, *spec.freeze_patterns)]
    for name, param in model.named_parameters():
        param.requires_grad = trains(name)
    return model


def _compare(family: str, spec: PeftSpec) -> tuple[ModelShape, torch.nn.Module]:
    model = _build(family)
    shape = _shape_of(model, family)
    ours = apply_peft(shape, spec)
    real = _user_frozen(model, spec) if spec.method == "freeze" else build_peft_meta_model(model, spec)
    theirs = named_param_specs(real)
    assert ours.trainable_params == sum(p.numel() for p in real.parameters() if p.requires_grad)
    assert ours.total_params == sum(p.numel() for p in real.parameters())
    trainable = Counter((p.name, p.shape) for p in ours.params if p.trainable)
    assert trainable == Counter((p.name, p.shape) for p in theirs if p.trainable)
    # Stronger: the whole list, in named_parameters() order.
    assert ours.params == theirs
    return ours, real


@pytest.mark.parametrize("method", list(METHODS))
@pytest.mark.parametrize("family", list(FAMILIES))
def test_method_matches_library(family: str, method: str) -> None:
    if method == "lora-default" and family not in LORA_DEFAULT_TARGET_MODULES:
        pytest.skip("peft has no default LoRA targets for this model type")
    _compare(family, METHODS[method])


@pytest.mark.parametrize("family", list(FAMILIES))
def test_lora_explicit_targets_bias_all(family: str) -> None:
    spec = PeftSpec(method="lora", lora_r=3, target_modules=EXPLICIT_TARGETS[family], lora_bias="all")
    ours, _ = _compare(family, spec)
    assert any(".lora_A." in p.name or ".lora_embedding_A." in p.name for p in ours.params)


@pytest.mark.parametrize("family", ["gpt2", "llama", "bloom", "bert"])
def test_lora_only_bias_and_dora(family: str) -> None:
    _compare(
        family,
        PeftSpec(
            method="lora",
            lora_r=2,
            lora_bias="lora_only",
            use_dora=True,
            target_modules=EXPLICIT_TARGETS[family],
        ),
    )


@pytest.mark.parametrize("family", ["gptj", "gpt2", "llama", "opt", "t5", "bert"])
def test_lora_all_linear(family: str) -> None:
    _compare(family, PeftSpec(method="lora", target_modules_pattern="all-linear"))


def test_lora_regex_targets() -> None:
    _compare(
        "llama",
        PeftSpec(method="lora", target_modules_pattern=r".*layers\.1\.(mlp\.up_proj|self_attn\.v_proj)"),
    )


@pytest.mark.parametrize("method", ["lora", "prompt", "prefix"])
def test_modules_to_save(method: str) -> None:
    """peft matches modules_to_save with str.endswith: ``norm`` wraps model.norm and every *_layernorm."""
    spec = PeftSpec(method=method, modules_to_save=("lm_head", "norm"), num_virtual_tokens=4)
    ours, _ = _compare("llama", spec)
    copies = {
        p.name.split(".modules_to_save.")[0] for p in ours.params if ".modules_to_save.default." in p.name
    }
    assert len(copies) == 1 + 1 + 2 * 2  # lm_head, model.norm, two norms in each of two layers


def test_modules_to_save_on_tied_head_is_refused() -> None:
    """GPT-2 ties lm_head to wte, so lm_head owns no parameter in the shape; memfit refuses rather
    than undercount (peft would add a trainable copy of the tied matrix)."""
    model = _build("gpt2")
    with pytest.raises(MemfitError, match="lm_head"):
        apply_peft(_shape_of(model, "gpt2"), PeftSpec(method="lora", modules_to_save=("lm_head",)))
    real = build_peft_meta_model(model, PeftSpec(method="lora", modules_to_save=("lm_head",)))
    assert any("lm_head.modules_to_save" in name for name, _ in real.named_parameters())


def test_sequence_classifier_head_trains() -> None:
    ours, _ = _compare("bert", PeftSpec(method="lora"))
    assert [p.name for p in ours.params if "modules_to_save" in p.name] == [
        "base_model.model.classifier.modules_to_save.default.weight",
        "base_model.model.classifier.modules_to_save.default.bias",
    ]


def test_freeze_with_train_patterns() -> None:
    _compare(
        "llama", PeftSpec(method="freeze", train_patterns=("model.layers.*",), freeze_patterns=("*.mlp.*",))
    )


def test_gqa_prefix_uses_key_value_width() -> None:
    """Mistral's prefix holds num_key_value_heads * head_dim per layer, not hidden_size (peft #1901)."""
    ours, real = _compare("mistral", PeftSpec(method="prefix", num_virtual_tokens=5))
    (embedding,) = [p for p in ours.params if p.trainable]
    config = real.peft_config["default"]
    assert embedding.shape == (5, config.num_layers * 2 * config.token_dim)
    assert config.token_dim == 2 * 8 != real.base_model.config.hidden_size


def test_unsupported_lora_target_raises_like_peft() -> None:
    spec = PeftSpec(method="lora", target_modules=("input_layernorm",))
    model = _build("llama")
    with pytest.raises(MemfitError):
        apply_peft(_shape_of(model, "llama"), spec)
    with pytest.raises(ValueError):
        build_peft_meta_model(model, spec)


def test_lora_default_targets_are_peft_mapping() -> None:
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as theirs

    ours = {k: (v if isinstance(v, str) else list(v)) for k, v in LORA_DEFAULT_TARGET_MODULES.items()}
    assert ours == {k: (v if isinstance(v, str) else list(v)) for k, v in theirs.items()}


REMOTE_CODE_MODEL_TYPES = ("RefinedWeb", "RefinedWebModel")


@pytest.mark.parametrize("model_type", sorted(MODEL_TYPES_WITHOUT_KV_HEADS_KEY))
def test_model_types_without_kv_heads_key(model_type: str) -> None:
    from transformers import CONFIG_MAPPING

    if model_type in REMOTE_CODE_MODEL_TYPES:  # Falcon's remote-code names: no config class in transformers
        assert model_type not in CONFIG_MAPPING
        return
    has = "num_key_value_heads" in CONFIG_MAPPING[model_type]().to_dict()
    if model_type == "falcon":  # FalconConfig has the key from 5.25: the builder says so for the release
        shape = build_model_shape(source_from_config({"model_type": "falcon"}), transformers_line=TRANSFORMERS_LINE)
        assert has == has_kv_heads_key(shape.arch)
        return
    assert not has


@pytest.mark.parametrize(
    "model_type", ["llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "mixtral", "phi"]
)
def test_modern_model_types_have_kv_heads_key(model_type: str) -> None:
    from transformers import CONFIG_MAPPING

    assert model_type not in MODEL_TYPES_WITHOUT_KV_HEADS_KEY
    assert "num_key_value_heads" in CONFIG_MAPPING[model_type]().to_dict()


ADAPTER_CONFIGS = {
    "lora": lambda: peft.LoraConfig(
        task_type="CAUSAL_LM",
        r=4,
        lora_alpha=16,
        target_modules=["q_proj", "o_proj"],
        bias="lora_only",
        modules_to_save=["lm_head"],
    ),
    "lora-all-linear": lambda: peft.LoraConfig(
        task_type="CAUSAL_LM", target_modules="all-linear", use_dora=True
    ),
    "prefix": lambda: peft.PrefixTuningConfig(
        task_type="CAUSAL_LM", num_virtual_tokens=7, prefix_projection=True, encoder_hidden_size=20
    ),
    "prompt": lambda: peft.PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=6),
}


@pytest.mark.parametrize("kind", list(ADAPTER_CONFIGS))
def test_saved_adapter_config_round_trip(kind: str, tmp_path) -> None:
    """Write a real adapter_config.json with peft, read it, and compare with peft rebuilt from it."""
    config = ADAPTER_CONFIGS[kind]()
    with torch.device("meta"):
        peft.get_peft_model(_build("mistral"), config)  # fills token_dim, num_layers, ... as training does
    config.save_pretrained(str(tmp_path))
    assert json.loads((tmp_path / "adapter_config.json").read_text())["peft_type"] == config.peft_type.value

    spec = load_adapter_config(tmp_path)
    ours = apply_peft(_shape_of(_build("mistral"), "mistral"), spec)
    loaded = peft.PeftConfig.from_pretrained(str(tmp_path))
    loaded.inference_mode = False  # what from_pretrained(..., is_trainable=True) does
    with torch.device("meta"):
        real = peft.get_peft_model(_build("mistral"), loaded)
    assert ours.params == named_param_specs(real)


def test_kogpt_prefix_projection_seed_case() -> None:
    """The seed case: kakaobrain/kogpt (GPT-J 6B) prefix-tuned with a 4096-wide projection, 10 tokens.

    The user reported 956,575,744 trainable parameters; the real peft library and apply_peft agree.
    """
    config = transformers.GPTJConfig(
        vocab_size=64512, n_embd=4096, n_layer=28, n_head=16, rotary_dim=64, n_positions=2048
    )
    with torch.device("meta"):
        model = transformers.GPTJForCausalLM(config)
    spec = PeftSpec(method="prefix", num_virtual_tokens=10, prefix_projection=True, encoder_hidden_size=4096)
    shape = _shape_of(model, "kakaobrain/kogpt")
    real = build_peft_meta_model(model, spec)
    library_trainable = sum(p.numel() for p in real.parameters() if p.requires_grad)
    assert all(p.device.type == "meta" for p in real.parameters())
    assert library_trainable == 956_575_744
    ours = apply_peft(shape, spec)
    assert ours.trainable_params == library_trainable
    assert ours.total_params == sum(p.numel() for p in real.parameters())
    assert ours.params == named_param_specs(real)


@pytest.mark.parametrize(
    "auto_class", ["AutoModelForQuestionAnswering", "AutoModelForTokenClassification", "AutoModel"]
)
@pytest.mark.parametrize(
    "spec",
    [
        PeftSpec(method="lora"),
        PeftSpec(method="lora", target_modules=("query", "dense"), lora_bias="all"),
        PeftSpec(method="prompt", num_virtual_tokens=3),
        PeftSpec(method="prefix", num_virtual_tokens=3, prefix_projection=True),
    ],
    ids=["lora", "lora-dense-bias", "prompt", "prefix"],
)
def test_task_heads(auto_class: str, spec: PeftSpec) -> None:
    """Other task classes: QA adds qa_outputs, token classification classifier, a bare model none."""
    _, config_name, kwargs = FAMILIES["bert"]
    config = getattr(transformers, config_name)(**kwargs)
    with torch.device("meta"):
        model = getattr(transformers, auto_class).from_config(config)
    shape = _shape_of(model, "bert")
    assert apply_peft(shape, spec).params == named_param_specs(build_peft_meta_model(model, spec))


def test_t5_prompt_tuning_prompts_encoder_and_decoder() -> None:
    ours, real = _compare("t5", PeftSpec(method="prompt", num_virtual_tokens=5))
    assert real.peft_config["default"].num_transformer_submodules == 2
    assert [p.shape for p in ours.params if p.trainable] == [(10, 32)]


@pytest.mark.parametrize("spec", [PeftSpec(method="lora"), PeftSpec(method="prefix", num_virtual_tokens=2)])
def test_build_on_a_real_model_puts_adapters_on_its_device(spec: PeftSpec) -> None:
    _, config_name, kwargs = FAMILIES["llama"]
    model = transformers.AutoModelForCausalLM.from_config(getattr(transformers, config_name)(**kwargs))
    shape = _shape_of(model, "llama")
    real = build_peft_meta_model(model, spec)
    assert {p.device.type for p in real.parameters()} == {"cpu"}
    assert apply_peft(shape, spec).params == named_param_specs(real)
