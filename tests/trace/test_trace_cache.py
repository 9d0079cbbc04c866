"""The trace cache (``memfit.trace.cache``, issue 22 item 5): a repeated ``--exact`` reads the traced step
back instead of tracing again, equal field for field to the trace it kept, and its key changes with
everything the trace depends on. Each test has a cache folder of its own (``MEMFIT_CACHE_DIR`` under
tmp_path): nothing here depends on what an earlier run left.

One real fake-tensor trace (the shipped Qwen2.5-0.5B config, LoRA, 2 x 64 tokens) is made; the tests of
the cache's plumbing hand that result back from a stand-in tracer that counts its calls.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")


def _scenario(**extra):
    from memfit.core.scenario.build import build_scenario
    from memfit.core.scenario.inputs import ScenarioInputs

    kw = dict(model="Qwen/Qwen2.5-0.5B", framework="torch", precision="amp_bf16", gpus="1xa100-80gb", seq_len=64,
              micro_batch=2, load_dtype="bf16", peft_method="lora",
              peft_options={"lora_r": 8, "target_modules": "q_proj,v_proj"})
    kw.update(extra)
    return build_scenario(ScenarioInputs(**kw))


@pytest.fixture(scope="module")
def first(tmp_path_factory):
    """A real trace through ``trace_scenario`` with an empty cache, and the cache folder it filled."""
    from memfit.trace.ledger_step import trace_scenario

    root = tmp_path_factory.mktemp("cache")
    old = os.environ.get("MEMFIT_CACHE_DIR")
    os.environ["MEMFIT_CACHE_DIR"] = str(root)
    try:
        result = trace_scenario(_scenario())
    finally:
        if old is None:
            del os.environ["MEMFIT_CACHE_DIR"]
        else:
            os.environ["MEMFIT_CACHE_DIR"] = old
    return root, result


@pytest.fixture
def tracer(monkeypatch, first):
    """``trace_training_step`` replaced by one that returns the real trace and counts its calls."""
    import memfit.trace.step as step

    calls = []

    def fake(config, peft, options, progress=None):
        calls.append(options)
        return first[1]

    monkeypatch.setattr(step, "trace_training_step", fake)
    return calls


def test_a_repeated_trace_is_read_back_equal_and_not_traced_again(first, tracer, monkeypatch):
    from memfit.core.plan import make_plan
    from memfit.trace.ledger_step import ledger_step, trace_scenario

    root, traced = first
    files = list((root / "traces").iterdir())
    assert traced.cached == "" and traced.cache_note == "" and len(files) == 1
    monkeypatch.setenv("MEMFIT_CACHE_DIR", str(root))
    again = trace_scenario(_scenario())
    assert tracer == [], "the cached step was traced again"
    assert again.cached == str(files[0])
    assert replace(again, cached="") == traced  # every field, the events and module bytes included
    sc = _scenario()
    a, b = make_plan(sc, ledger_step(sc, traced)), make_plan(sc, ledger_step(sc, again))
    assert a.phases == b.phases and a.verdict == b.verdict
    assert any("read from the trace cache" in n for n in b.notes)
    assert not any("trace cache" in n for n in a.notes)


def test_the_key_follows_every_input_of_the_trace(first, monkeypatch):
    from memfit.core.catalog import resolve_model_config
    from memfit.trace import cache
    from memfit.trace.ledger_step import trace_options_for

    sc = _scenario()
    config = resolve_model_config(sc.model_ref, trust_remote_code=True).config_dict()
    opts = trace_options_for(sc)
    key = cache.trace_key(config, sc.peft, opts)
    assert key == cache.trace_key(dict(reversed(list(config.items()))), sc.peft, opts)  # key order is no input
    assert key != cache.trace_key(config, sc.peft, replace(opts, seq_len=65))
    assert key != cache.trace_key(config, _scenario(peft_options={"lora_r": 16}).peft, opts)
    assert key != cache.trace_key({**config, "num_hidden_layers": 3}, sc.peft, opts)
    monkeypatch.setattr(cache, "_versions", lambda: {"torch": "0", "transformers": "0", "peft": "0"})
    assert key != cache.trace_key(config, sc.peft, opts)
    assert cache.trace_key({**config, "auto_map": {"AutoModel": "x.Y"}}, sc.peft, opts) is None


def test_nothing_is_written_through_a_symbolic_link(first, tracer, tmp_path, monkeypatch):
    from memfit.trace.ledger_step import trace_scenario

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "root").mkdir()
    (tmp_path / "root" / "traces").symlink_to(elsewhere)
    monkeypatch.setenv("MEMFIT_CACHE_DIR", str(tmp_path / "root"))
    result = trace_scenario(_scenario())
    assert len(tracer) == 1 and list(elsewhere.iterdir()) == []
    assert "symbolic link" in result.cache_note


@pytest.mark.parametrize("spoil", ["garbage", "other-format", "too-large", "a-directory"])
def test_a_cache_file_that_cannot_be_used_is_traced_again_and_said(first, tracer, tmp_path, monkeypatch, spoil):
    from memfit.trace import cache
    from memfit.trace.ledger_step import trace_scenario

    root, _ = first
    name = next((root / "traces").iterdir()).name
    folder = tmp_path / "traces"
    folder.mkdir()
    target = folder / name
    if spoil == "garbage":
        target.write_text("{not json")
    elif spoil == "other-format":
        target.write_text(json.dumps({"format": cache.FORMAT + 1, "key": name[:-5], "trace": {}}))
    elif spoil == "too-large":
        target.write_bytes((root / "traces" / name).read_bytes())
        monkeypatch.setattr(cache, "MAX_BYTES", 1000)
    else:
        target.mkdir()
    monkeypatch.setenv("MEMFIT_CACHE_DIR", str(tmp_path))
    result = trace_scenario(_scenario())
    assert len(tracer) == 1 and result.cached == ""
    assert str(target) in result.cache_note
    if spoil != "a-directory" and spoil != "too-large":  # rewritten with the new trace: read back next time
        assert trace_scenario(_scenario()).cached == str(target) and len(tracer) == 1


def test_memfit_no_cache_traces_every_time_and_keeps_nothing(first, tracer, tmp_path, monkeypatch):
    from memfit.trace.ledger_step import trace_scenario

    monkeypatch.setenv("MEMFIT_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("MEMFIT_NO_CACHE", "1")
    trace_scenario(_scenario())
    trace_scenario(_scenario())
    assert len(tracer) == 2 and not (tmp_path / "traces").exists()


def test_the_oldest_entries_go_beyond_the_limit(first, monkeypatch, tmp_path):
    from memfit.trace import cache

    monkeypatch.setattr(cache, "MAX_ENTRIES", 2)
    folder = tmp_path / "traces"
    for i, key in enumerate("abc"):
        assert cache.write(key * 64, folder, first[1]) == ""
        os.utime(folder / f"{key * 64}.json", (1000 + i, 1000 + i))
    assert cache.write("d" * 64, folder, first[1]) == ""
    assert sorted(p.name[0] for p in folder.iterdir()) == ["c", "d"]
