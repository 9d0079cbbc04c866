"""Catalog counts are exact: pure shapes against the real transformers classes on the meta device.

For every catalog model the multiset of ``(name, shape)`` from ``memfit.core.shapes`` must equal
the one ``named_parameters()`` yields for the transformers class built from the same config.json
(installed transformers version), and its buffers the ``(name, shape, dtype, persistent)`` of
``named_buffers()``. Tiny configs cover the options the catalog does not use; for buffers they are
also built for real on the CPU and loaded back at fp16 with ``from_pretrained``, which is where a
buffer's dtype could follow the load dtype.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from memfit.core.catalog import list_catalog, resolve_model_config  # noqa: E402
from memfit.core.model import BUFFER_DTYPE_BYTES, FLOATING_BUFFER_DTYPES  # noqa: E402
from memfit.core.shapes import build_model_shape, modelled_architecture  # noqa: E402
from memfit.errors import MemfitError  # noqa: E402
from memfit.exact.meta_build import (  # noqa: E402
    buffer_dtype_name,
    build_meta_model,
    named_buffer_specs,
    named_param_shapes,
)

KOGPT_PARAMS = 6_166_502_400
"""n_parameters of KoGPT6B-ryan1.5b as its model card publishes it."""


def multiset(params) -> Counter:
    return Counter((p.name, tuple(p.shape)) for p in params)


def assert_same_params(pure, reference) -> None:
    ours, theirs = multiset(pure), multiset(reference)
    assert ours == theirs, (
        f"only in memfit: {sorted(ours - theirs)[:5]}; "
        f"only in transformers: {sorted(theirs - ours)[:5]}"
    )


def buffer_rows(buffers) -> Counter:
    """What one build shows of each buffer (``follows_load_dtype`` needs a second, fp16 build)."""
    return Counter((b.name, b.shape, b.dtype, b.persistent) for b in buffers)


def assert_same_buffers(pure, reference) -> None:
    ours, theirs = buffer_rows(pure), buffer_rows(reference)
    assert ours == theirs, (
        f"only in memfit: {sorted(ours - theirs)}; only in torch: {sorted(theirs - ours)}"
    )


def torch_buffer_bytes(model) -> int:
    return sum(b.numel() * b.element_size() for b in model.buffers())


@pytest.mark.parametrize("entry", list_catalog(), ids=lambda e: e.name)
def test_catalog_shape_equals_meta_build(entry):
    source = resolve_model_config(entry.name, allow_download=False)
    shape = build_model_shape(source)
    model = build_meta_model(source)
    reference = named_param_shapes(model)
    assert type(model).__name__ == shape.architecture
    assert_same_params(shape.params, reference)
    assert shape.total_params == sum(p.numel() for p in model.parameters())
    assert_same_buffers(shape.buffers, named_buffer_specs(model))
    assert shape.buffer_bytes == torch_buffer_bytes(model)


@pytest.mark.parametrize("entry", list_catalog(), ids=lambda e: e.name)
def test_arch_numbers_match_the_transformers_config(entry):
    source = resolve_model_config(entry.name, allow_download=False)
    arch = build_model_shape(source).arch
    config = transformers.CONFIG_MAPPING[entry.model_type].from_dict(source.config_dict())
    assert arch.hidden_size == config.hidden_size
    assert arch.num_heads == config.num_attention_heads
    assert arch.vocab_size == config.vocab_size
    t5 = entry.model_type in ("t5", "mt5", "umt5")
    layers = config.num_decoder_layers if t5 else config.num_hidden_layers
    assert arch.num_layers == layers
    if entry.model_type == "falcon":  # multi_query: one key/value head
        assert arch.num_kv_heads == (1 if config.multi_query and not config.new_decoder_architecture else config.num_kv_heads)
    else:
        assert arch.num_kv_heads == getattr(config, "num_key_value_heads", config.num_attention_heads)
    if hasattr(config, "num_experts_per_tok"):
        assert arch.num_experts == getattr(config, "num_local_experts", getattr(config, "num_experts", None))
        assert arch.experts_per_token == config.num_experts_per_tok


def test_kogpt_total_is_the_published_count_in_memfit_and_in_transformers():
    source = resolve_model_config("kogpt", allow_download=False)
    model = build_meta_model(source)
    assert sum(p.numel() for p in model.parameters()) == KOGPT_PARAMS
    assert build_model_shape(source).total_params == KOGPT_PARAMS


from family_configs import TINY, VARIANTS  # noqa: E402


def tiny_source(tmp_path: Path, model_type: str, changes: dict):
    config = {"model_type": model_type, **TINY[model_type], **changes}
    config = {key: value for key, value in config.items() if value is not None}
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "config.json").write_text(json.dumps(config))
    return resolve_model_config(str(tmp_path))


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_config_options_match_meta_build(tmp_path, variant):
    model_type, changes = VARIANTS[variant]
    source = tiny_source(tmp_path, model_type, changes)
    model = build_meta_model(source)
    shape = build_model_shape(source)
    assert_same_params(shape.params, named_param_shapes(model))
    assert_same_buffers(shape.buffers, named_buffer_specs(model))


def build_on_cpu(source):
    """The family's class built for real (tensors with values) on the CPU at fp32."""
    config = transformers.CONFIG_MAPPING[source.model_type].from_dict(source.config_dict())
    return getattr(transformers, modelled_architecture(source))(config)


@pytest.mark.parametrize("model_type", list(TINY))
def test_buffers_equal_a_real_cpu_build_and_its_fp16_from_pretrained(tmp_path, model_type):
    """Names, shapes, dtypes, persistence of a real CPU build; load-dtype behaviour of a reload."""
    source = tiny_source(tmp_path / "src", model_type, {})
    shape = build_model_shape(source)
    model = build_on_cpu(source)
    assert {b.device.type for b in model.buffers()} <= {"cpu"}
    model.save_pretrained(tmp_path / "ckpt")
    loaded = type(model).from_pretrained(tmp_path / "ckpt", dtype=torch.float16)
    assert torch.float16 in {p.dtype for p in loaded.parameters()}  # T5 keeps ``wo`` in fp32
    assert named_buffer_specs(model, fp16_model=loaded) == shape.buffers
    assert shape.buffer_bytes == torch_buffer_bytes(model)
    # The meta build at fp16 (what memfit's exact path uses) holds the buffers the fp16 load holds.
    meta16 = build_meta_model(source, dtype="fp16")
    assert [(n, b.shape, b.dtype) for n, b in meta16.named_buffers()] == [
        (n, b.shape, b.dtype) for n, b in loaded.named_buffers()
    ]
    assert named_buffer_specs(build_meta_model(source), fp16_model=meta16) == shape.buffers


def test_tiny_gptj_of_the_replays_has_the_measured_buffer_bytes(tmp_path):
    """n_embd 128, 2 layers, rotary_dim 16, n_positions 512: the replay fixtures' GPT-J."""
    changes = {"n_embd": 128, "n_layer": 2, "rotary_dim": 16, "n_positions": 512}
    source = tiny_source(tmp_path, "gptj", changes)
    model = build_on_cpu(source)
    assert build_model_shape(source).buffer_bytes == torch_buffer_bytes(model)
    assert torch_buffer_bytes(model) == 32_768  # what the replays measured (tests/fixtures/replay)


def test_buffer_dtype_table_matches_torch_and_deepspeed():
    deepspeed_engine = pytest.importorskip("deepspeed.runtime.engine")
    dtypes = [
        torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32,
        torch.int16, torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128,
    ]
    names = {buffer_dtype_name(dtype): dtype for dtype in dtypes}
    assert set(names) == set(BUFFER_DTYPE_BYTES)
    for name, dtype in names.items():
        assert BUFFER_DTYPE_BYTES[name] == dtype.itemsize, name
    assert {names[n] for n in FLOATING_BUFFER_DTYPES} == set(deepspeed_engine.CASTABLE_DTYPES)
    assert {n for n, d in names.items() if d.is_floating_point} == FLOATING_BUFFER_DTYPES
    with pytest.raises(MemfitError, match="float8"):
        buffer_dtype_name(torch.float8_e4m3fn)


def test_unknown_rope_type_is_refused_like_transformers(tmp_path):
    source = tiny_source(tmp_path, "llama", {"rope_scaling": {"rope_type": "fancy"}})
    with pytest.raises(KeyError, match="fancy"):
        build_on_cpu(source)
    with pytest.raises(MemfitError, match="rope_type 'fancy'"):
        build_model_shape(source)


def test_t5_untied_head_matches_from_pretrained_of_a_real_checkpoint(tmp_path):
    """A T5 v1.1-style checkpoint keeps its own lm_head through from_pretrained (tie_weights)."""
    changes = {"feed_forward_proj": "gated-gelu", "tie_word_embeddings": False}
    source = tiny_source(tmp_path / "src", "t5", changes)
    config = transformers.T5Config.from_dict(source.config_dict())
    model = transformers.T5ForConditionalGeneration(config)
    model.lm_head.weight = torch.nn.Parameter(torch.randn_like(model.shared.weight))
    model.all_tied_weights_keys.pop("lm_head.weight", None)
    model.save_pretrained(tmp_path / "ckpt")
    loaded = transformers.T5ForConditionalGeneration.from_pretrained(tmp_path / "ckpt")
    assert loaded.lm_head.weight is not loaded.shared.weight
    assert_same_params(build_model_shape(source).params, named_param_shapes(loaded))


def test_bert_cross_attention_without_decoder_is_refused_like_transformers(tmp_path):
    (tmp_path / "config.json").write_text(
        json.dumps({"model_type": "bert", **TINY["bert"], "add_cross_attention": True})
    )
    source = resolve_model_config(str(tmp_path))
    with pytest.raises(ValueError, match="decoder"):
        transformers.BertForMaskedLM(transformers.BertConfig.from_dict(source.config_dict()))
    with pytest.raises(MemfitError, match="without is_decoder"):
        build_model_shape(source)


def test_dtype_and_bad_dtype():
    source = resolve_model_config("gpt2", allow_download=False)
    model = build_meta_model(source, dtype="bf16")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert {p.device.type for p in model.parameters()} == {"meta"}
    assert torch.get_default_dtype() == torch.float32  # restored after the build
    with pytest.raises(MemfitError, match="dtype 'int3'"):
        build_meta_model(source, dtype="int3")


def test_model_type_outside_the_families_builds_through_auto_class(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "phi", "hidden_size": 32, "intermediate_size": 48,
        "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 97,
    }))
    source = resolve_model_config(str(tmp_path))  # transformers ships phi: no remote code
    model = build_meta_model(source)
    assert type(model).__name__ == "PhiForCausalLM"
    with pytest.raises(MemfitError, match="no pure-Python shape builder"):
        build_model_shape(source)
