"""Hub refs: only config.json is fetched, through the real ``hf_hub_download``.

Success runs offline against a Hugging Face cache laid out in ``tmp_path`` exactly as
huggingface_hub writes it (blobs, refs, snapshot symlinks). Hub failures are answered by an
in-process HTTP transport that returns the status codes and ``X-Error-Code`` headers the Hub
sends, so huggingface_hub's own error mapping runs; memfit must turn each into one line.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

huggingface_hub = pytest.importorskip("huggingface_hub")
from huggingface_hub import constants as hub_constants  # noqa: E402

from memfit.core.catalog import resolve_model_config  # noqa: E402
from memfit.core.shapes import build_model_shape  # noqa: E402
from memfit.errors import MemfitError  # noqa: E402

try:  # the HTTP client huggingface_hub is built on (httpx2 in huggingface_hub 2.x)
    import httpx2 as httpx
except ImportError:  # pragma: no cover - older huggingface_hub
    import httpx  # type: ignore[no-redef]

COMMIT = "0123456789abcdef0123456789abcdef01234567"
TINY_QWEN = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "vocab_size": 100,
    "tie_word_embeddings": True,
}


def put_in_cache(cache: Path, repo_id: str, text: str, *, ref: str = "main") -> Path:
    """Lay a config.json out the way hf_hub_download caches it."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    blob = repo / "blobs" / "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    blob.parent.mkdir(parents=True, exist_ok=True)
    blob.write_text(text)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / ref).write_text(COMMIT)
    snapshot = repo / "snapshots" / COMMIT / "config.json"
    snapshot.parent.mkdir(parents=True, exist_ok=True)
    snapshot.symlink_to(Path("..", "..", "blobs", blob.name))
    return snapshot


@pytest.fixture
def hub_cache(tmp_path, monkeypatch) -> Path:
    """An empty Hugging Face cache in tmp_path (constants are read at import, so patch them too)."""
    cache = tmp_path / "hf" / "hub"
    cache.mkdir(parents=True)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_TOKEN", "")
    return cache


@pytest.fixture
def offline(hub_cache, monkeypatch) -> Path:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)
    return hub_cache


@pytest.fixture
def fake_hub(hub_cache, monkeypatch):
    """Route huggingface_hub's HTTP client to ``answer(request) -> httpx.Response``."""
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", False)
    state = {"answer": None, "requests": []}

    def handler(request):
        state["requests"].append(request)
        return state["answer"](request)

    huggingface_hub.close_session()
    huggingface_hub.set_client_factory(lambda: httpx.Client(transport=httpx.MockTransport(handler)))
    yield state
    huggingface_hub.close_session()
    from huggingface_hub.utils._http import default_client_factory

    huggingface_hub.set_client_factory(default_client_factory)


def test_hub_id_resolves_from_the_cache_offline(offline):
    snapshot = put_in_cache(offline, "acme/tiny-qwen", json.dumps(TINY_QWEN))
    source = resolve_model_config("acme/tiny-qwen")
    assert (source.origin, source.name) == ("hub", "acme/tiny-qwen")
    assert Path(source.path).resolve() == snapshot.resolve()
    assert source.config_dict() == TINY_QWEN
    assert build_model_shape(source).arch.num_kv_heads == 2


def test_hub_revision_suffix(offline):
    put_in_cache(offline, "acme/tiny-qwen", json.dumps(TINY_QWEN), ref="v1")
    assert resolve_model_config("acme/tiny-qwen@v1").config["hidden_size"] == 64
    assert resolve_model_config(f"acme/tiny-qwen@{COMMIT}").origin == "hub"


def test_not_cached_while_offline_is_one_line(offline):
    with pytest.raises(MemfitError, match="unreachable.*not in the local Hugging Face cache"):
        resolve_model_config("acme/not-cached")


def test_offline_miss_suggests_close_catalog_names(offline):
    with pytest.raises(MemfitError, match="close to it: meta-llama/meta-llama-3-8b"):
        resolve_model_config("meta-llama/Meta-Llama-3-8")


def test_malformed_config_from_the_hub(offline):
    put_in_cache(offline, "acme/broken", "{not json")
    with pytest.raises(MemfitError, match="not valid JSON"):
        resolve_model_config("acme/broken")


def test_remote_code_config_from_the_hub_needs_the_flag(offline):
    custom = {**TINY_QWEN, "model_type": "acme_lm", "auto_map": {"AutoConfig": "x.C"}}
    put_in_cache(offline, "acme/custom", json.dumps(custom))
    with pytest.raises(MemfitError, match="custom code|auto_map"):
        resolve_model_config("acme/custom")
    assert resolve_model_config("acme/custom", trust_remote_code=True).origin == "hub"
    # a model_type transformers ships is built by transformers' own class: no flag needed
    put_in_cache(offline, "acme/shipped", json.dumps({**TINY_QWEN, "auto_map": {"AutoConfig": "x.C"}}))
    assert resolve_model_config("acme/shipped").origin == "hub"


def test_downloads_off_never_reads_the_hub_cache(offline):
    put_in_cache(offline, "acme/tiny-qwen", json.dumps(TINY_QWEN))
    with pytest.raises(MemfitError, match="downloads are off"):
        resolve_model_config("acme/tiny-qwen", allow_download=False)


def test_download_fetches_only_config_json(fake_hub, hub_cache):
    body = json.dumps(TINY_QWEN).encode()

    def answer(request):
        assert request.url.path == "/acme/tiny-qwen/resolve/main/config.json"
        headers = {
            "X-Repo-Commit": COMMIT,
            "ETag": '"0a1b2c"',
            "Content-Length": str(len(body)),
            "Content-Type": "application/json",
        }
        content = b"" if request.method == "HEAD" else body
        return httpx.Response(200, headers=headers, content=content)

    fake_hub["answer"] = answer
    source = resolve_model_config("acme/tiny-qwen")
    assert source.origin == "hub" and source.config["vocab_size"] == 100
    assert Path(source.path).is_relative_to(hub_cache)
    paths = {r.url.path for r in fake_hub["requests"]}
    assert paths == {"/acme/tiny-qwen/resolve/main/config.json"}


@pytest.mark.parametrize(
    ("status", "code", "hub_error", "message"),
    [
        (401, "GatedRepo", "GatedRepoError", "gated on the Hugging Face Hub"),
        (401, "RepoNotFound", "RepositoryNotFoundError", "not found on the Hugging Face Hub"),
        (404, "RepoNotFound", "RepositoryNotFoundError", "not found on the Hugging Face Hub"),
        (404, "RevisionNotFound", "RevisionNotFoundError", "has no revision 'v9'"),
        (404, "EntryNotFound", "RemoteEntryNotFoundError", "has no config.json"),
    ],
)
def test_hub_errors_become_one_line(fake_hub, status, code, hub_error, message):
    fake_hub["answer"] = lambda request: httpx.Response(
        status, headers={"X-Error-Code": code, "X-Error-Message": f"{code} says the Hub"}
    )
    ref = "acme/thing@v9" if code == "RevisionNotFound" else "acme/thing"
    with pytest.raises(MemfitError, match=message) as raised:
        resolve_model_config(ref)
    assert "\n" not in str(raised.value)
    assert type(raised.value.__cause__).__name__ == hub_error  # huggingface_hub's own mapping ran
    assert fake_hub["requests"]
