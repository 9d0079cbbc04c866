"""PEFT accounting in the pure core: option parsing, adapter_config.json reading, the seed case.

Name-by-name agreement with the real peft library lives in tests/exact/test_peft_against_library.py;
these tests need no torch.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from memfit.core.model import ArchSpec, ModelShape, ParamSpec
from memfit.core.peft.params import apply_peft, trained_under_freeze
from memfit.core.peft.parse import load_adapter_config, parse_peft_options
from memfit.core.peft.spec import PeftSpec
from memfit.errors import MemfitError

KOGPT_CONFIG = Path(__file__).parents[2] / "src/memfit/catalog/kakaobrain--kogpt.json"


def _gptj_arch(config: dict) -> ArchSpec:
    return ArchSpec(
        model_type=config["model_type"],
        num_layers=config["n_layer"],
        hidden_size=config["n_embd"],
        num_heads=config["n_head"],
        num_kv_heads=config["n_head"],
        head_dim=config["n_embd"] // config["n_head"],
        intermediate_size=4 * config["n_embd"],
        vocab_size=config["vocab_size"],
    )


def _tiny_shape() -> ModelShape:
    """A two-block GPT-J-like parameter list (names as transformers gives them)."""
    params = [ParamSpec("transformer.wte.weight", (96, 32))]
    for i in range(2):
        at = f"transformer.h.{i}."
        params += [
            ParamSpec(at + "ln_1.weight", (32,)),
            ParamSpec(at + "ln_1.bias", (32,)),
            *(
                ParamSpec(at + f"attn.{m}.weight", (32, 32))
                for m in ("k_proj", "v_proj", "q_proj", "out_proj")
            ),
            ParamSpec(at + "mlp.fc_in.weight", (128, 32)),
            ParamSpec(at + "mlp.fc_in.bias", (128,)),
        ]
    params += [ParamSpec("transformer.ln_f.weight", (32,)), ParamSpec("lm_head.weight", (96, 32))]
    arch = ArchSpec(
        model_type="gptj",
        num_layers=2,
        hidden_size=32,
        num_heads=4,
        num_kv_heads=4,
        head_dim=8,
        intermediate_size=128,
        vocab_size=96,
    )
    return ModelShape(name="tiny-gptj", architecture="GPTJForCausalLM", arch=arch, params=tuple(params))


def test_seed_case_prefix_encoder_size() -> None:
    """kakaobrain/kogpt with a 10-token prefix through a 4096-wide projection: the user's report
    (tests/fixtures/seed/deepspeed-prefix-tuning-oom.txt) counts 956,575,744 trainable parameters."""
    config = json.loads(KOGPT_CONFIG.read_text())
    base = ModelShape(
        name="kakaobrain/kogpt",
        architecture="GPTJForCausalLM",
        arch=_gptj_arch(config),
        params=(ParamSpec("transformer.wte.weight", (config["vocab_size"], config["n_embd"])),),
    )
    spec = parse_peft_options(
        "prefix", num_virtual_tokens=10, prefix_projection=True, encoder_hidden_size=4096
    )
    trained = apply_peft(base, spec)
    assert trained.trainable_params == 956_575_744
    assert trained.frozen_params == base.total_params


def test_seed_case_from_the_catalog_shape() -> None:
    """The same seed number through memfit's own pure shape of kakaobrain/kogpt."""
    catalog = pytest.importorskip("memfit.core.catalog")
    shapes = pytest.importorskip("memfit.core.shapes")
    base = shapes.build_model_shape(catalog.resolve_model_config("kakaobrain/kogpt", allow_download=False))
    spec = PeftSpec(method="prefix", num_virtual_tokens=10, prefix_projection=True, encoder_hidden_size=4096)
    trained = apply_peft(base, spec)
    assert trained.trainable_params == 956_575_744
    assert trained.frozen_params == base.total_params
    assert all(p.name.startswith("base_model.") for p in trained.params if not p.trainable)


def test_core_peft_does_not_import_torch() -> None:
    code = (
        "import sys, json\n"
        "from memfit.core.peft.params import apply_peft\n"
        "from memfit.core.peft.parse import parse_peft_options, load_adapter_config\n"
        "assert not {'torch', 'transformers', 'peft', 'deepspeed'} & set(sys.modules), sorted(sys.modules)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize(
    ("method", "options", "message"),
    [
        ("adapters", {}, "unknown PEFT method"),
        ("p_tuning", {"encoder_num_layer": 3}, "unknown P_TUNING option 'encoder_num_layer'"),
        ("lora", {"target_modules": "q_proj", "k_proj": None}, "unknown PEFT option 'k_proj' .a value-less key"),
        ("lora", {"r": 0}, "rank r must be positive"),
        ("lora", {"lora_r": -4}, "rank r must be positive"),
        ("lora", {"bias": "some"}, "unknown LoRA bias"),
        ("lora", {"r": "eight"}, "lora_r must be an integer"),
        ("lora", {"target_modules": "q_proj", "target_modules_pattern": ".*"}, "not both"),
        ("lora", {"target_modules_pattern": "(q_proj"}, "bad LoRA target pattern"),
        ("lora", {"num_virtual_tokens": 10}, "does not apply to method 'lora'"),
        ("prefix", {"num_virtual_tokens": -1}, "num_virtual_tokens must be positive"),
        ("prompt", {"num_virtual_tokens": 0}, "num_virtual_tokens must be positive"),
        ("prefix", {"encoder_hidden_size": 512}, "needs prefix_projection"),
        ("prefix", {"prefix_projection": "maybe"}, "must be true or false"),
        ("prefix", {"lora_r": 8}, "does not apply to method 'prefix'"),
        ("prefix", {"task_type": "CAUSAL"}, "unknown peft task_type"),
        ("freeze", {}, "needs freeze_patterns or train_patterns"),
        ("full", {"rank": 8}, "unknown PEFT option 'rank'"),
    ],
)
def test_parse_peft_options_rejects(method: str, options: dict, message: str) -> None:
    with pytest.raises(MemfitError, match=message):
        parse_peft_options(method, **options)


def test_parse_peft_options_reads_cli_values() -> None:
    spec = parse_peft_options(
        "lora", r="16", alpha=32, bias="lora_only", target_modules="q_proj, v_proj", modules_to_save=None
    )
    assert spec == PeftSpec(
        method="lora", lora_r=16, lora_alpha=32, lora_bias="lora_only", target_modules=("q_proj", "v_proj")
    )
    assert parse_peft_options("lora", target_modules="all-linear").target_modules_pattern == "all-linear"
    assert parse_peft_options("prefix", prefix_projection="true").prefix_projection is True
    assert parse_peft_options("full") == PeftSpec()


def test_freeze_patterns() -> None:
    spec = parse_peft_options("freeze", freeze_patterns="transformer.wte.*,*.h.0.*")
    trained = apply_peft(_tiny_shape(), spec)
    frozen = [p.name for p in trained.params if not p.trainable]
    assert frozen == ["transformer.wte.weight"] + [p.name for p in _tiny_shape().params if ".h.0." in p.name]
    only_mlp = PeftSpec(method="freeze", train_patterns=("*.mlp.*",), freeze_patterns=("*.bias",))
    assert [p.name for p in apply_peft(_tiny_shape(), only_mlp).params if p.trainable] == [
        "transformer.h.0.mlp.fc_in.weight",
        "transformer.h.1.mlp.fc_in.weight",
    ]
    assert trained_under_freeze("lm_head.weight", only_mlp) is False


def test_freeze_pattern_matching_nothing_is_an_error() -> None:
    with pytest.raises(MemfitError, match="matches no parameter"):
        apply_peft(_tiny_shape(), PeftSpec(method="freeze", freeze_patterns=("model.layers.*",)))


def test_lora_targets_matching_nothing_is_an_error() -> None:
    with pytest.raises(MemfitError, match="match no layer"):
        apply_peft(_tiny_shape(), PeftSpec(method="lora", target_modules=("query_key_value",)))


def test_lora_target_that_is_not_a_layer_is_an_error() -> None:
    with pytest.raises(MemfitError, match="not a Linear"):
        apply_peft(_tiny_shape(), PeftSpec(method="lora", target_modules=("ln_1",)))


def test_lora_without_default_targets_is_an_error() -> None:
    shape = _tiny_shape()
    unknown = ModelShape(
        name="x",
        architecture="XForCausalLM",
        arch=replace(shape.arch, model_type="xmodel"),
        params=shape.params,
    )
    with pytest.raises(MemfitError, match="no default LoRA target modules"):
        apply_peft(unknown, PeftSpec(method="lora"))


def test_full_trains_everything_and_keeps_names() -> None:
    shape = _tiny_shape()
    frozen = shape.with_params(tuple(ParamSpec(p.name, p.shape, False) for p in shape.params))
    trained = apply_peft(frozen, PeftSpec(method="full"))
    assert trained.trainable_params == shape.total_params
    assert [p.name for p in trained.params] == [p.name for p in shape.params]


# --- adapter_config.json -----------------------------------------------------------------------

# Written as peft 0.21's LoraConfig.save_pretrained writes them (fields trimmed to the relevant ones).
LORA_ADAPTER = {
    "peft_type": "LORA",
    "task_type": "CAUSAL_LM",
    "r": 16,
    "lora_alpha": 32,
    "lora_dropout": 0.05,
    "target_modules": ["v_proj", "q_proj"],
    "bias": "none",
    "modules_to_save": None,
    "use_dora": False,
    "layers_to_transform": None,
    "rank_pattern": {},
    "alpha_pattern": {},
    "exclude_modules": None,
    "lora_bias": False,
    "target_parameters": None,
    "trainable_token_indices": None,
    "inference_mode": True,
}
PREFIX_ADAPTER = {
    "peft_type": "PREFIX_TUNING",
    "task_type": "CAUSAL_LM",
    "num_virtual_tokens": 10,
    "token_dim": 4096,
    "num_transformer_submodules": 1,
    "num_attention_heads": 16,
    "num_layers": 28,
    "encoder_hidden_size": 4096,
    "prefix_projection": True,
    "inference_mode": True,
}


def _write(tmp_path: Path, content: object, *, raw: bool = False) -> Path:
    file = tmp_path / "adapter_config.json"
    file.write_text(content if raw else json.dumps(content))  # type: ignore[arg-type]
    return file


def test_load_lora_adapter_config(tmp_path: Path) -> None:
    spec = load_adapter_config(_write(tmp_path, LORA_ADAPTER))
    assert spec == PeftSpec(
        method="lora", lora_r=16, lora_alpha=32, target_modules=("v_proj", "q_proj"), task_type="CAUSAL_LM",
        lora_dropout=0.05,  # read, not ignored: it keeps a mask and a copy of each adapted layer's input
    )
    assert load_adapter_config(tmp_path) == spec  # a directory holding adapter_config.json


def test_load_string_target_modules(tmp_path: Path) -> None:
    spec = load_adapter_config(_write(tmp_path, {**LORA_ADAPTER, "target_modules": "all-linear"}))
    assert (spec.target_modules, spec.target_modules_pattern) == ((), "all-linear")
    spec = load_adapter_config(_write(tmp_path, {**LORA_ADAPTER, "target_modules": r".*\.q_proj"}))
    assert spec.target_modules_pattern == r".*\.q_proj"


def test_load_prefix_adapter_config_is_the_seed_case(tmp_path: Path) -> None:
    spec = load_adapter_config(_write(tmp_path, PREFIX_ADAPTER))
    config = json.loads(KOGPT_CONFIG.read_text())
    base = ModelShape(
        name="kakaobrain/kogpt", architecture="GPTJForCausalLM", arch=_gptj_arch(config), params=()
    )
    assert apply_peft(base, spec).trainable_params == 956_575_744


def test_load_prompt_adapter_config(tmp_path: Path) -> None:
    spec = load_adapter_config(
        _write(
            tmp_path,
            {
                "peft_type": "PROMPT_TUNING",
                "task_type": "SEQ_2_SEQ_LM",
                "num_virtual_tokens": 20,
                "num_transformer_submodules": 2,
                "token_dim": 512,
                "prompt_tuning_init": "TEXT",
            },
        )
    )
    assert spec == PeftSpec(
        method="prompt",
        num_virtual_tokens=20,
        task_type="SEQ_2_SEQ_LM",
        token_dim=512,
        num_transformer_submodules=2,
    )


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"peft_type": "LORA", "r": 8,', "not valid JSON"),
        ("[1, 2]", "must hold a JSON object"),
        ('{"peft_type": "NOT_A_TUNER", "num_virtual_tokens": 20}', "'NOT_A_TUNER' is not supported"),
        ('{"peft_type": "IA3", "feedforward_modules": 3}', "feedforward_modules must be a string or a list"),
        ('{"r": 8}', "peft_type None is not supported"),
        (json.dumps({**LORA_ADAPTER, "target_modules": "q_proj", "layers_to_transform": [0, 1]}),
         "layers_to_transform"),
        (json.dumps({**LORA_ADAPTER, "rank_pattern": {"q_proj": 0}}), "rank_pattern ranks must be positive"),
        (json.dumps({**LORA_ADAPTER, "use_qalora": True}), "use_qalora=True is not modelled"),
        (json.dumps({**LORA_ADAPTER, "r": 0}), "rank r must be positive"),
        (json.dumps({**PREFIX_ADAPTER, "num_virtual_tokens": -3}), "num_virtual_tokens must be positive"),
    ],
    ids=["truncated", "list", "unknown-type", "ia3-bad-key", "no-type", "layers", "rank-pattern", "qalora", "r0",
         "tokens"],
)
def test_load_adapter_config_rejects(tmp_path: Path, content: str, message: str) -> None:
    with pytest.raises(MemfitError, match=message):
        load_adapter_config(_write(tmp_path, content, raw=True))


def test_load_adapter_config_missing_file(tmp_path: Path) -> None:
    with pytest.raises(MemfitError, match="no adapter config at"):
        load_adapter_config(tmp_path / "nowhere" / "adapter_config.json")
    with pytest.raises(MemfitError, match="no adapter config at"):
        load_adapter_config(tmp_path)  # a directory without adapter_config.json
