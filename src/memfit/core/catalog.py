"""Find a model's config.json: the shipped catalog, a local path, or (config.json only) the Hub.

The catalog ships the published config.json of the models memfit is tested on
(src/memfit/catalog/*.json), so ``memfit plan kogpt`` needs neither network nor transformers. A ref
is resolved in this order:

1. an existing local directory holding ``config.json``, or a path to a config file;
2. a catalog name or alias, case-insensitive (``kakaobrain/kogpt``, ``kogpt``, ``llama-3-8b``);
3. a Hugging Face repo id (``org/name``, optionally ``@revision``): only ``config.json`` is
   downloaded, through ``memfit.exact.hub`` which imports ``huggingface_hub`` when called.

The parsed config is checked once here (a JSON object with a ``model_type``) and frozen. A
``model_type`` transformers ships is accepted (memfit's pure builder or the exact path sizes it);
one only custom code (``auto_map``) builds is refused unless ``trust_remote_code`` is set, and then
only the exact path can build it.
"""

from __future__ import annotations

import difflib
import functools
import os
import re
from collections.abc import Mapping
from dataclasses import field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

from memfit.core.lean_dataclass import dataclass
from memfit.core.families.transformers_types import NEWEST_VERSION, TRANSFORMERS_MODEL_TYPES
from memfit.errors import MemfitError

Origin = Literal["catalog", "local", "hub"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelConfigSource:
    """A parsed config.json and where it came from."""

    name: str
    """Catalog name (``kakaobrain/kogpt``), the local path or the Hub id the user gave."""
    config: Mapping[str, Any] = field(hash=False)
    """config.json, read-only all the way down (objects are mappings, arrays are tuples)."""
    path: str | None
    """File the config was read from (shipped file, local file or Hub cache file)."""
    origin: Origin

    @property
    def model_type(self) -> str:
        return self.config["model_type"]

    def config_dict(self) -> dict[str, Any]:
        """A mutable deep copy in plain JSON types, e.g. for ``PreTrainedConfig.from_dict``."""
        return _thaw(self.config)


@dataclass(frozen=True, slots=True, kw_only=True)
class CatalogEntry:
    """One shipped config.json."""

    name: str
    """Hugging Face repo id the file was published under."""
    filename: str
    """File under src/memfit/catalog/."""
    model_type: str
    architecture: str
    """``architectures[0]`` of the file."""
    aliases: tuple[str, ...] = ()
    """Short names that resolve to this entry (the part after ``org/`` always does)."""
    note: str = ""


def _entry(
    name: str, model_type: str, architecture: str, *aliases: str, note: str = ""
) -> CatalogEntry:
    return CatalogEntry(
        name=name,
        filename=name.replace("/", "--") + ".json",
        model_type=model_type,
        architecture=architecture,
        aliases=aliases,
        note=note,
    )


_CATALOG: tuple[CatalogEntry, ...] = (
    _entry(
        "kakaobrain/kogpt", "gptj", "GPTJForCausalLM", "kogpt", "kogpt-6b", "kogpt6b",
        note="KoGPT6B-ryan1.5b; Hub files are on revision KoGPT6B-ryan1.5b(-float16)",
    ),
    _entry("EleutherAI/gpt-j-6b", "gptj", "GPTJForCausalLM", "gpt-j", "gptj-6b"),
    _entry("gpt2", "gpt2", "GPT2LMHeadModel", "openai-community/gpt2", "gpt2-small"),
    _entry("gpt2-medium", "gpt2", "GPT2LMHeadModel", "openai-community/gpt2-medium"),
    _entry("gpt2-large", "gpt2", "GPT2LMHeadModel", "openai-community/gpt2-large"),
    _entry("gpt2-xl", "gpt2", "GPT2LMHeadModel", "openai-community/gpt2-xl"),
    _entry("meta-llama/Llama-2-7b-hf", "llama", "LlamaForCausalLM", "llama-2-7b", "llama2-7b"),
    _entry("meta-llama/Llama-2-13b-hf", "llama", "LlamaForCausalLM", "llama-2-13b", "llama2-13b"),
    _entry("meta-llama/Llama-2-70b-hf", "llama", "LlamaForCausalLM", "llama-2-70b", "llama2-70b"),
    _entry("meta-llama/Meta-Llama-3-8B", "llama", "LlamaForCausalLM", "llama-3-8b", "llama3-8b"),
    _entry("meta-llama/Meta-Llama-3-70B", "llama", "LlamaForCausalLM", "llama-3-70b", "llama3-70b"),
    _entry("mistralai/Mistral-7B-v0.1", "mistral", "MistralForCausalLM", "mistral-7b"),
    _entry("mistralai/Mixtral-8x7B-v0.1", "mixtral", "MixtralForCausalLM", "mixtral-8x7b"),
    _entry("Qwen/Qwen2.5-7B", "qwen2", "Qwen2ForCausalLM", "qwen-2.5-7b"),
    _entry("facebook/opt-1.3b", "opt", "OPTForCausalLM"),
    _entry("facebook/opt-6.7b", "opt", "OPTForCausalLM"),
    _entry("bigscience/bloom-7b1", "bloom", "BloomForCausalLM", "bloom-7b"),
    _entry("bigscience/T0_3B", "t5", "T5ForConditionalGeneration", "t0-3b", "t0"),
    _entry(
        "bert-large-uncased", "bert", "BertForMaskedLM", "google-bert/bert-large-uncased",
        "bert-large",
    ),
    _entry("EleutherAI/pythia-410m", "gpt_neox", "GPTNeoXForCausalLM"),
    _entry("EleutherAI/pythia-1b", "gpt_neox", "GPTNeoXForCausalLM"),
    _entry("EleutherAI/pythia-1.4b", "gpt_neox", "GPTNeoXForCausalLM"),
    _entry("EleutherAI/pythia-6.9b", "gpt_neox", "GPTNeoXForCausalLM"),
    _entry("Qwen/Qwen2.5-0.5B", "qwen2", "Qwen2ForCausalLM", "qwen-2.5-0.5b"),
    _entry("Qwen/Qwen2.5-1.5B", "qwen2", "Qwen2ForCausalLM", "qwen-2.5-1.5b"),
    _entry("Qwen/Qwen2.5-3B", "qwen2", "Qwen2ForCausalLM", "qwen-2.5-3b"),
    _entry("Qwen/Qwen2.5-14B", "qwen2", "Qwen2ForCausalLM", "qwen-2.5-14b"),
    _entry("Qwen/Qwen2.5-32B", "qwen2", "Qwen2ForCausalLM", "qwen-2.5-32b"),
    _entry("Qwen/Qwen2.5-72B", "qwen2", "Qwen2ForCausalLM", "qwen-2.5-72b"),
    _entry("Qwen/Qwen3-0.6B", "qwen3", "Qwen3ForCausalLM", "qwen-3-0.6b"),
    _entry("Qwen/Qwen3-1.7B", "qwen3", "Qwen3ForCausalLM", "qwen-3-1.7b"),
    _entry("Qwen/Qwen3-4B", "qwen3", "Qwen3ForCausalLM", "qwen-3-4b"),
    _entry("Qwen/Qwen3-8B", "qwen3", "Qwen3ForCausalLM", "qwen-3-8b"),
    _entry("Qwen/Qwen3-14B", "qwen3", "Qwen3ForCausalLM", "qwen-3-14b"),
    _entry("Qwen/Qwen3-32B", "qwen3", "Qwen3ForCausalLM", "qwen-3-32b"),
    _entry("Qwen/Qwen3-30B-A3B", "qwen3_moe", "Qwen3MoeForCausalLM", "qwen-3-30b-a3b"),
    _entry("Qwen/Qwen1.5-MoE-A2.7B", "qwen2_moe", "Qwen2MoeForCausalLM", "qwen1.5-moe"),
    _entry("meta-llama/Llama-3.2-1B", "llama", "LlamaForCausalLM", "llama-3.2-1b"),
    _entry("meta-llama/Llama-3.2-3B", "llama", "LlamaForCausalLM", "llama-3.2-3b"),
    _entry("meta-llama/Llama-3.1-8B", "llama", "LlamaForCausalLM", "llama-3.1-8b", "meta-llama/Meta-Llama-3.1-8B"),
    _entry("mistralai/Mistral-Nemo-Base-2407", "mistral", "MistralForCausalLM", "mistral-nemo"),
    _entry("google/gemma-2b", "gemma", "GemmaForCausalLM"),
    _entry("google/gemma-7b", "gemma", "GemmaForCausalLM"),
    _entry("google/gemma-2-2b", "gemma2", "Gemma2ForCausalLM"),
    _entry("google/gemma-2-9b", "gemma2", "Gemma2ForCausalLM"),
    _entry("google/gemma-2-27b", "gemma2", "Gemma2ForCausalLM"),
    _entry("google/gemma-3-1b-pt", "gemma3_text", "Gemma3ForCausalLM", "gemma-3-1b"),
    _entry(
        "microsoft/Phi-3-mini-4k-instruct", "phi3", "Phi3ForCausalLM", "phi-3-mini",
        note="config.json names custom code (auto_map); transformers ships phi3, memfit plans its own class",
    ),
    _entry("tiiuae/falcon-7b", "falcon", "FalconForCausalLM"),
    _entry("allenai/OLMo-2-1124-7B", "olmo2", "Olmo2ForCausalLM", "olmo-2-7b"),
    _entry(
        "deepseek-ai/DeepSeek-V3", "deepseek_v3", "DeepseekV3ForCausalLM", "deepseek-v3",
        note=("config.json names custom code (auto_map), which transformers' own deepseek_v3 class replaces; "
              "published with fp8 weights (quantization_config): memfit plans the load dtype you give"),
    ),
    _entry("bert-base-uncased", "bert", "BertForMaskedLM", "google-bert/bert-base-uncased", "bert-base"),
    _entry("roberta-base", "roberta", "RobertaForMaskedLM", "FacebookAI/roberta-base"),
    _entry("roberta-large", "roberta", "RobertaForMaskedLM", "FacebookAI/roberta-large"),
    _entry(
        "microsoft/deberta-v3-base", "deberta-v2", "DebertaV2ForMaskedLM", "deberta-v3-base",
        note="config.json names no architectures; memfit plans the masked-LM head",
    ),
    _entry("t5-base", "t5", "T5ForConditionalGeneration", "google-t5/t5-base"),
    _entry("google/flan-t5-large", "t5", "T5ForConditionalGeneration", "flan-t5-large"),
    _entry("google/mt5-base", "mt5", "MT5ForConditionalGeneration", "mt5-base"),
)


def source_from_config(config: Mapping[str, Any], *, name: str = "config") -> ModelConfigSource:
    """A ``ModelConfigSource`` for a config.json mapping already in memory (traces, tests)."""
    if not isinstance(config.get("model_type"), str):
        raise MemfitError(f"{name}: the config has no model_type, so it is not a transformers config.json")
    return ModelConfigSource(name=name, config=_freeze(_thaw(config)), path=None, origin="local")


def list_catalog() -> tuple[CatalogEntry, ...]:
    """Every shipped model, in display order (for ``memfit models``)."""
    return _CATALOG


@functools.cache
def _catalog_index() -> Mapping[str, CatalogEntry]:
    """Lower-cased name, short name (after ``org/``) and aliases -> entry."""
    index: dict[str, CatalogEntry] = {}
    for entry in _CATALOG:
        for key in (entry.name, entry.name.rsplit("/", 1)[-1], *entry.aliases):
            index.setdefault(key.lower(), entry)
    return MappingProxyType(index)


CATALOG_DIR = Path(__file__).resolve().parent.parent / "catalog"
"""src/memfit/catalog/: shipped as package data (pyproject: ``catalog/**/*.json``)."""


def catalog_config_path(entry: CatalogEntry) -> str:
    """Path of a shipped config.json."""
    return str(CATALOG_DIR / entry.filename)


def resolve_model_config(
    ref: str, *, allow_download: bool = True, trust_remote_code: bool = False
) -> ModelConfigSource:
    """Parse the config.json that ``ref`` names (see the module docstring for the order)."""
    if not isinstance(ref, str) or not ref.strip():
        raise MemfitError("model reference is empty: give a catalog name, a path or a Hub id")
    ref = ref.strip()
    local = Path(os.path.expanduser(ref))
    entry = _catalog_index().get(ref.lower())
    try:
        os.stat(local)
    except FileNotFoundError:
        pass
    except (OSError, ValueError) as exc:  # a name too long, a NUL byte, a loop of links
        raise MemfitError(f"cannot use model {ref[:80]!r}{'...' if len(ref) > 80 else ''}: "
                          f"{getattr(exc, 'strerror', None) or exc}") from None
    if local.is_dir() and (local / "config.json").is_file():
        source = _local_source(ref, local / "config.json")
    elif local.is_file():
        source = _local_source(ref, local)
    elif local.is_dir() and entry is None:
        raise MemfitError(f"directory {ref} has no config.json")
    elif _looks_like_path(ref) and entry is None:
        raise MemfitError(f"no such file or directory: {ref}")
    elif entry is not None:
        path = catalog_config_path(entry)
        source = ModelConfigSource(
            name=entry.name, config=_read_config(Path(path)), path=path, origin="catalog"
        )
    else:
        source = _resolve_hub(ref, allow_download=allow_download)
    _check_supported(source, trust_remote_code=trust_remote_code)
    return source


def _local_source(ref: str, file: Path) -> ModelConfigSource:
    return ModelConfigSource(name=ref, config=_read_config(file), path=str(file), origin="local")


_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*(/[A-Za-z0-9][\w.\-]*)?(@[\w.\-/]+)?$")


def _looks_like_path(ref: str) -> bool:
    """A ref the user meant as a file path (so a missing file is not sent to the Hub)."""
    base = ref.partition("@")[0]  # a Hub revision may hold slashes (refs/pr/1)
    return (
        ref.startswith((".", "/", "~", "\\"))
        or ref.endswith(".json")
        or base.count("/") > 1
        or os.sep != "/" and os.sep in ref
    )


def _resolve_hub(ref: str, *, allow_download: bool) -> ModelConfigSource:
    if not _HUB_ID.match(ref):
        raise MemfitError(f"{ref!r} is not a catalog name, a local path or a Hugging Face repo id")
    hint = _did_you_mean(ref)
    if not allow_download:
        raise MemfitError(
            f"{ref!r} is not in memfit's catalog or a local path, and downloads are off{hint}"
        )
    repo_id, _, revision = ref.partition("@")
    from memfit.exact.hub import download_config_json  # lazy: imports huggingface_hub

    try:
        path = download_config_json(repo_id, revision=revision or None)
    except MemfitError as exc:
        if not hint:
            raise
        raise MemfitError(f"{exc}{hint}") from exc.__cause__ or exc
    return ModelConfigSource(name=ref, config=_read_config(Path(path)), path=path, origin="hub")


def _did_you_mean(ref: str) -> str:
    close = difflib.get_close_matches(ref.lower(), list(_catalog_index()), n=3, cutoff=0.75)
    return f" (catalog names close to it: {', '.join(close)})" if close else ""


def _read_config(file: Path) -> Mapping[str, Any]:
    """Parse and freeze a config.json; ``MemfitError`` for unreadable or malformed files."""
    from memfit.core.reading import parse_json, read_text  # sizes, UTF-8, JSON types, depth

    data = parse_json(read_text(file, what="model config"), what=str(file), allow_non_finite=True)
    if not isinstance(data, dict):
        raise MemfitError(f"{file} is not a JSON object (a config.json maps field names to values)")
    if not isinstance(data.get("model_type"), str):
        raise MemfitError(f"{file} has no model_type, so it is not a transformers config.json")
    return _freeze(data)


def _check_supported(source: ModelConfigSource, *, trust_remote_code: bool) -> None:
    """Refuse what neither memfit nor transformers can build without running the repo's own code.

    A ``model_type`` transformers ships is always accepted (memfit sizes it with its pure builder or,
    without one, from a meta-device build of the class): ``--trust-remote-code`` is never needed for
    it. A ``model_type`` transformers does not know needs custom code (``auto_map``) and
    ``trust_remote_code``; without ``auto_map`` nothing can build it.
    """
    if source.model_type in TRANSFORMERS_MODEL_TYPES or trust_remote_code:
        return
    if "auto_map" in source.config:
        raise MemfitError(
            f"{source.name} has model_type {source.model_type!r}, which transformers {NEWEST_VERSION} does not "
            "ship: only its own code (auto_map) builds it; pass --trust-remote-code to let the exact path run it"
        )
    raise MemfitError(
        f"{source.name} has model_type {source.model_type!r}, which transformers {NEWEST_VERSION} does not "
        "know (and config.json names no custom code): check the model_type, or upgrade transformers"
    )


def _freeze(value: Any) -> Any:
    if isinstance(value, dict):
        return MappingProxyType({key: _freeze(item) for key, item in value.items()})
    if isinstance(value, list):
        return tuple(_freeze(item) for item in value)
    return value


def _thaw(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {key: _thaw(item) for key, item in value.items()}
    if isinstance(value, tuple):
        return [_thaw(item) for item in value]
    return value
