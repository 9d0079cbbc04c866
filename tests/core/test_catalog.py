"""resolve_model_config and the shipped catalog: names, aliases, local paths, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memfit.core.catalog import (
    ModelConfigSource,
    catalog_config_path,
    list_catalog,
    resolve_model_config,
)
from memfit.core.families import FAMILIES, SUPPORTED_MODEL_TYPES, TRANSFORMERS_MODEL_TYPES
from memfit.core.shapes import NoPureBuilder, build_model_shape
from memfit.errors import MemfitError

CATALOG_DIR = Path(catalog_config_path(list_catalog()[0])).parent
ENTRIES = list_catalog()

TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "vocab_size": 100,
}


def write_config(directory: Path, config: dict, name: str = "config.json") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    file = directory / name
    file.write_text(json.dumps(config))
    return file


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e.name)
def test_every_entry_resolves_by_name_short_name_and_alias(entry):
    short = entry.name.rsplit("/", 1)[-1]
    for ref in (entry.name, entry.name.upper(), entry.name.lower(), short, *entry.aliases):
        source = resolve_model_config(ref, allow_download=False)
        assert source.origin == "catalog"
        assert source.name == entry.name
        assert source.path is not None and Path(source.path).is_file()


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e.name)
def test_entry_metadata_matches_its_shipped_file(entry):
    raw = json.loads(Path(catalog_config_path(entry)).read_text())
    assert raw["model_type"] == entry.model_type
    if "architectures" in raw:
        assert raw["architectures"][0] == entry.architecture
    else:  # deberta-v3-base ships none: memfit plans the family's default head, and says so
        assert entry.architecture == FAMILIES[entry.model_type].architecture and entry.note
    assert entry.model_type in SUPPORTED_MODEL_TYPES
    # custom code is named only for types transformers ships (it builds its own class then)
    assert "auto_map" not in raw or ("custom code" in entry.note and entry.model_type in TRANSFORMERS_MODEL_TYPES)


def test_catalog_lists_every_shipped_file_once_and_keys_do_not_collide():
    shipped = sorted(p.name for p in CATALOG_DIR.glob("*.json"))
    assert sorted(e.filename for e in ENTRIES) == shipped
    keys = [
        key
        for e in ENTRIES
        for key in {x.lower() for x in (e.name, e.name.rsplit("/", 1)[-1], *e.aliases)}
    ]
    assert len(keys) == len(set(keys))


def test_the_seed_model_is_in_the_catalog():
    source = resolve_model_config("kogpt", allow_download=False)
    assert source.name == "kakaobrain/kogpt"
    assert source.config["model_type"] == "gptj"
    assert source.config["vocab_size"] == 64512


def test_config_is_read_only_all_the_way_down_and_thaws_to_the_file():
    source = resolve_model_config("EleutherAI/gpt-j-6b", allow_download=False)
    with pytest.raises(TypeError):
        source.config["n_layer"] = 1  # type: ignore[index]
    nested = source.config["task_specific_params"]["text-generation"]
    with pytest.raises(TypeError):
        nested["max_length"] = 1  # type: ignore[index]
    assert isinstance(source.config["architectures"], tuple)
    assert source.config_dict() == json.loads(Path(source.path).read_text())
    thawed = source.config_dict()
    thawed["n_layer"] = 1  # a mutable copy, the source is unchanged
    assert source.config["n_layer"] == 28


def test_local_directory_and_local_file(tmp_path):
    file = write_config(tmp_path / "tiny", TINY_LLAMA)
    by_dir = resolve_model_config(str(tmp_path / "tiny"), allow_download=False)
    assert (by_dir.origin, by_dir.path, by_dir.name) == ("local", str(file), str(tmp_path / "tiny"))
    other = write_config(tmp_path, TINY_LLAMA, name="my-model.json")
    by_file = resolve_model_config(str(other), allow_download=False)
    assert by_file.origin == "local" and by_file.config["hidden_size"] == 64
    assert by_file == ModelConfigSource(
        name=str(other), config=by_file.config, path=str(other), origin="local"
    )


def test_local_directory_beats_a_catalog_name(tmp_path, monkeypatch):
    write_config(tmp_path / "gpt2", TINY_LLAMA)
    monkeypatch.chdir(tmp_path)
    assert resolve_model_config("gpt2").origin == "local"


def test_directory_without_config_json_named_like_a_catalog_entry(tmp_path, monkeypatch):
    (tmp_path / "gpt2").mkdir()
    monkeypatch.chdir(tmp_path)
    assert resolve_model_config("gpt2").origin == "catalog"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"model_type": "llama",', "not valid JSON"),
        ("[1, 2]", "not a JSON object"),
        ('{"hidden_size": 8}', "no model_type"),
        (b"\xff\xfe\x00bad", "cannot read"),
    ],
)
def test_malformed_config_files(tmp_path, content, message):
    file = tmp_path / "config.json"
    if isinstance(content, bytes):
        file.write_bytes(content)
    else:
        file.write_text(content)
    with pytest.raises(MemfitError, match=message):
        resolve_model_config(str(tmp_path))


def test_missing_paths(tmp_path):
    with pytest.raises(MemfitError, match="no such file"):
        resolve_model_config(str(tmp_path / "nope" / "config.json"))
    with pytest.raises(MemfitError, match="no such file"):
        resolve_model_config("./not-here")
    (tmp_path / "empty").mkdir()
    with pytest.raises(MemfitError, match="has no config.json"):
        resolve_model_config(str(tmp_path / "empty"))


@pytest.mark.parametrize("ref", ["", "   ", "has space/model", "a/b/c d"])
def test_refs_that_are_nothing(ref):
    with pytest.raises(MemfitError):
        resolve_model_config(ref, allow_download=False)


def test_unknown_model_without_downloads_suggests_catalog_names():
    with pytest.raises(MemfitError, match="downloads are off.*llama-3-8b"):
        resolve_model_config("llama-3-8", allow_download=False)
    with pytest.raises(MemfitError, match="not in memfit's catalog"):
        resolve_model_config("acme/never-heard-of-it", allow_download=False)


def test_custom_code_of_an_unknown_type_needs_trust_remote_code(tmp_path):
    config = {**TINY_LLAMA, "model_type": "acme_lm", "auto_map": {"AutoModelForCausalLM": "modeling_x.XForCausalLM"}}
    write_config(tmp_path, config)
    with pytest.raises(MemfitError, match="does not ship.*--trust-remote-code") as info:
        resolve_model_config(str(tmp_path))
    assert "\n" not in str(info.value)
    source = resolve_model_config(str(tmp_path), trust_remote_code=True)
    with pytest.raises(MemfitError, match="pure path models only"):
        build_model_shape(source)


def test_custom_code_of_a_shipped_type_plans_the_stock_class_and_says_so(tmp_path):
    """transformers builds its own class when remote code is not trusted: never ask for it."""
    config = {**TINY_LLAMA, "auto_map": {"AutoModelForCausalLM": "modeling_x.XForCausalLM"}}
    write_config(tmp_path, config)
    shape = build_model_shape(resolve_model_config(str(tmp_path)))
    assert shape.architecture == "LlamaForCausalLM"
    assert any("auto_map" in note and "LlamaForCausalLM" in note for note in shape.notes)
    trusted = resolve_model_config(str(tmp_path), trust_remote_code=True)
    with pytest.raises(MemfitError, match="pure path models only"):
        build_model_shape(trusted, trust_remote_code=True)


def test_shipped_type_without_pure_builder_is_accepted_and_routed_to_the_exact_path(tmp_path):
    write_config(tmp_path, {**TINY_LLAMA, "model_type": "phi", "architectures": ["PhiForCausalLM"]})
    source = resolve_model_config(str(tmp_path))  # no --trust-remote-code needed
    with pytest.raises(NoPureBuilder, match="'phi' has no pure-Python shape builder; transformers ships it"):
        build_model_shape(source)


def test_unknown_model_type_is_one_line_without_remote_code_advice(tmp_path):
    write_config(tmp_path, {**TINY_LLAMA, "model_type": "acme_lm"})
    with pytest.raises(MemfitError) as info:
        resolve_model_config(str(tmp_path))
    message = str(info.value)
    assert "does not know" in message and "trust-remote-code" not in message and "\n" not in message
