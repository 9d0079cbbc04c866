"""Every family, every task head, every option: the pure builders against transformers' own classes.

- each family x each task class transformers ships for it: names and shapes of ``named_parameters``
  and ``named_buffers`` of a meta build of that class (tiny configs, tests/exact/family_configs.py);
- a bare ``{"model_type": ...}`` config: the pure builder falls back to the config class's defaults;
- the copies the pure core keeps of transformers' tables: task -> class (the auto mappings),
  attention support (``_supports_sdpa``/``_supports_flash_attn``/``_supports_flex_attn``), the list
  of ``model_type``s transformers ships;
- impossible configs are refused with one line by every family, as they are by the same rule.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from family_configs import TINY  # noqa: E402

from memfit.core.catalog import resolve_model_config  # noqa: E402
from memfit.core.families import FAMILIES, TRANSFORMERS_MODEL_TYPES  # noqa: E402
from memfit.core.families import attention as attention_table  # noqa: E402
from memfit.core.families.transformers_types import (  # noqa: E402
    ADDED_IN, DEFAULT_RELEASE_MODEL_TYPES, TRANSFORMERS_VERSION, model_type_release, model_types_of,
)
from memfit.core.shapes import build_model_shape  # noqa: E402
from memfit.errors import MemfitError  # noqa: E402
from memfit.exact.meta_build import build_meta_model, named_buffer_specs, named_param_shapes  # noqa: E402

TRANSFORMERS_LINE = ".".join(transformers.__version__.split(".")[:2])
"""The installed release line (``5.24``)."""

FAMILY_TASKS = [(mt, task) for mt, family in FAMILIES.items() for task in family.classes]


def source_for(tmp_path: Path, config: dict):
    config = {key: value for key, value in config.items() if value is not None}
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "config.json").write_text(json.dumps(config))
    return resolve_model_config(str(tmp_path))


def same(shape, model) -> None:
    ours = Counter((p.name, tuple(p.shape)) for p in shape.params)
    theirs = Counter((p.name, tuple(p.shape)) for p in named_param_shapes(model))
    assert ours == theirs, f"only memfit: {sorted(ours - theirs)[:4]}; only transformers: {sorted(theirs - ours)[:4]}"
    ours_b = Counter((b.name, b.shape, b.dtype, b.persistent) for b in shape.buffers)
    theirs_b = Counter((b.name, b.shape, b.dtype, b.persistent) for b in named_buffer_specs(model))
    assert ours_b == theirs_b, f"only memfit: {sorted(ours_b - theirs_b)}; only torch: {sorted(theirs_b - ours_b)}"
    assert type(model).__name__ == shape.architecture


@pytest.mark.parametrize(("model_type", "task"), FAMILY_TASKS, ids=lambda v: v)
def test_every_task_head_of_every_family_equals_the_meta_build(tmp_path, model_type, task):
    source = source_for(tmp_path, {"model_type": model_type, **TINY[model_type], "num_labels": 3})
    shape = build_model_shape(source, task=task)
    model = build_meta_model(source, task=task)
    same(shape, model)
    assert shape.arch.task == task
    logits = {"causal-lm": shape.arch.vocab_size, "masked-lm": shape.arch.vocab_size,
              "seq2seq-lm": shape.arch.vocab_size}
    if task in ("sequence-classification", "token-classification"):
        assert shape.arch.num_labels == 3
    elif task == "question-answering":  # start/end logits; encoders size it by num_labels
        assert shape.arch.num_labels == (3 if model_type in ("bert", "roberta", "deberta-v2", "t5", "mt5", "umt5") else 2)
    else:
        assert shape.arch.num_labels == 0 and logits[task] == shape.arch.vocab_size


@pytest.mark.parametrize("model_type", list(FAMILIES))
def test_bare_config_takes_the_config_class_defaults(tmp_path, model_type):
    source = source_for(tmp_path, {"model_type": model_type, **({"pad_token_id": 0} if model_type == "phi3" else {})})
    same(build_model_shape(source), build_meta_model(source))


def test_task_classes_are_transformers_auto_mappings():
    from transformers.models.auto import modeling_auto as auto

    mappings = {
        "causal-lm": auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        "masked-lm": auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES,
        "seq2seq-lm": auto.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES,
        "sequence-classification": auto.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES,
        "token-classification": auto.MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES,
        "question-answering": auto.MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES,
    }
    for model_type, family in FAMILIES.items():
        for task, name in family.classes.items():
            assert mappings[task].get(model_type) == name, (model_type, task)
        # every head transformers maps is one memfit sizes, except BERT/RoBERTa's causal LM (is_decoder)
        mapped = {task for task, m in mappings.items() if model_type in m}
        assert mapped - set(family.classes) <= {"causal-lm"} if model_type in ("bert", "roberta") else mapped <= set(
            family.classes), model_type


def test_attention_table_is_the_classes_own_flags():
    for model_type, family in FAMILIES.items():
        for name in family.classes.values():
            cls = getattr(transformers, name)
            expected = ["eager"]
            expected += ["sdpa"] if cls._supports_sdpa else []
            expected += ["flash_attention_2", "flash_attention_3"] if cls._supports_flash_attn else []
            expected += ["flex_attention"] if cls._supports_flex_attn else []
            assert attention_table.supported(model_type) == tuple(expected), name


@pytest.mark.parametrize("model_type", ["bloom", "gemma2", "deberta-v2"])
def test_unsupported_sdpa_is_refused_by_transformers_and_by_memfit_alike(tmp_path, model_type):
    source = source_for(tmp_path, {"model_type": model_type, **TINY[model_type]})
    config = transformers.CONFIG_MAPPING[model_type].from_dict(source.config_dict())
    cls = getattr(transformers, FAMILIES[model_type].architecture)
    with pytest.raises(ValueError, match="does not support an attention implementation through"):
        with torch.device("meta"):
            cls._from_config(config, attn_implementation="sdpa")
    with pytest.raises(MemfitError, match="do not support attn_implementation='sdpa'") as info:
        build_meta_model(source, attention="sdpa")
    assert "\n" not in str(info.value) and len(str(info.value)) < 300
    assert attention_table.resolve(model_type, None) == "eager"  # transformers' default for the class
    with pytest.raises(MemfitError, match="do not support attn_implementation='sdpa'"):
        attention_table.resolve(model_type, "sdpa")


def test_default_attention_is_what_transformers_builds(tmp_path):
    for model_type in ("llama", "bloom", "gemma2", "t5", "bert"):
        source = source_for(tmp_path / model_type, {"model_type": model_type, **TINY[model_type]})
        model = build_meta_model(source)
        assert model.config._attn_implementation == attention_table.resolve(model_type, None), model_type


def test_model_type_list_is_transformers_config_mapping():
    """The installed release's list is its CONFIG_MAPPING: memfit's default release (5.24.0, the pinned
    CI) the list itself, a later one (5.25.0) that list and its ``ADDED_IN`` entry, recorded for exactly
    that version (``scripts/make_model_types.py`` under each)."""
    installed = frozenset(transformers.CONFIG_MAPPING.keys())
    if transformers.__version__ != TRANSFORMERS_VERSION:
        assert transformers.__version__ in ADDED_IN, f"run scripts/make_model_types.py under {transformers.__version__}"
        assert model_types_of(TRANSFORMERS_LINE) == installed
        assert installed <= TRANSFORMERS_MODEL_TYPES
        return
    assert TRANSFORMERS_VERSION == transformers.__version__
    assert DEFAULT_RELEASE_MODEL_TYPES == installed == model_types_of(TRANSFORMERS_LINE)


def test_types_of_a_later_release_are_known_and_dated():
    """Pure: 5.25.0 added nine types (831 keys vs 5.24.0's 822); a type is dated by its first release."""
    assert TRANSFORMERS_MODEL_TYPES == DEFAULT_RELEASE_MODEL_TYPES | ADDED_IN["5.25.0"]
    assert len(ADDED_IN["5.25.0"]) == 9 and not ADDED_IN["5.25.0"] & DEFAULT_RELEASE_MODEL_TYPES
    assert model_type_release("ergo") == "5.25.0" and model_type_release("llama") is None
    assert "ergo" in model_types_of("5.25") and "ergo" not in model_types_of("5.24")


IMPOSSIBLE = [
    ("llama", {"num_key_value_heads": 8}, "num_key_value_heads 8 is more than num_attention_heads 4"),
    ("qwen3", {"num_attention_heads": 6, "num_key_value_heads": 4}, "not a multiple of num_key_value_heads 4"),
    ("mistral", {"num_key_value_heads": 3}, "not a multiple"),
    ("mixtral", {"num_local_experts": 2, "num_experts_per_tok": 3}, "num_experts_per_tok 3 is more than"),
    ("qwen3_moe", {"num_experts": 4, "num_experts_per_tok": 5}, "num_experts_per_tok 5 is more than"),
    ("deepseek_v3", {"n_routed_experts": 4, "num_experts_per_tok": 6}, "num_experts_per_tok 6 is more than"),
    ("llama4_text", {"num_local_experts": 2, "num_experts_per_tok": 4}, "num_experts_per_tok 4 is more than"),
    ("falcon", {"new_decoder_architecture": True, "num_kv_heads": 3}, "not a multiple"),
    ("llama", {"rope_theta": float("nan")}, "rope_theta must be a finite positive number"),
    ("qwen2", {"rope_theta": float("inf")}, "rope_theta must be a finite positive number"),
    ("gemma", {"rope_scaling": {"rope_type": "linear", "factor": float("nan")}}, "factor must be a finite"),
    ("gpt_neox", {"rotary_emb_base": float("-inf")}, "rope_theta must be a finite positive number"),
    ("phi3", {"rope_parameters": {"rope_type": "default", "rope_theta": 0}}, "rope_theta must be a finite positive"),
]


@pytest.mark.parametrize(("model_type", "changes", "message"), IMPOSSIBLE, ids=lambda v: str(v)[:40])
def test_impossible_configs_are_one_line_errors(tmp_path, model_type, changes, message):
    source = source_for(tmp_path, {"model_type": model_type, **TINY[model_type], **changes})
    with pytest.raises(MemfitError, match=message) as info:
        build_model_shape(source)
    assert "\n" not in str(info.value)
