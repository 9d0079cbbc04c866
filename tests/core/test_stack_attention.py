"""The default attention implementation follows the stack's transformers and torch releases
(``memfit.core.stack.attention``); the code it mirrors is checked in tests/exact/test_attention_against_sources.py."""

import pytest

from memfit.core.families import FAMILIES
from memfit.core.families.attention import resolve
from memfit.core.scenario.build import build_scenario
from memfit.core.scenario.inputs import ScenarioInputs
from memfit.core.stack.attention import default_attention, requested_sdpa
from memfit.errors import MemfitError


def test_the_default_release_gives_the_current_classes_choice():
    for model_type in FAMILIES:
        assert default_attention(model_type, "5.24", "2.13")[0] == resolve(model_type, None), model_type


@pytest.mark.parametrize(("model_type", "line", "torch", "expected"), [
    ("gpt2", "4.19", "1.12", "eager"),       # before the dispatch of 4.36
    ("llama", "4.35", "2.1.2", "eager"),
    ("falcon", "4.33", "2.0.1", "sdpa"),      # Falcon's own F.scaled_dot_product_attention
    ("falcon", "4.33", "1.13.1", "eager"),    # torch before 2.0 has no such function
    ("llama", "4.36", "2.1.0", "eager"),      # is_torch_sdpa_available: torch >= 2.1.1
    ("llama", "4.36", "2.1.1+cu118", "sdpa"),
    ("llama", "4.36", "2.1", "eager"),        # a line reads as its .0
    ("llama", "4.40", "2.1.1rc1", "sdpa"),    # a pre-release's patch is its leading digits (not 11)
    ("llama", "4.40", "2.1.0a0+git", "eager"),
    ("gpt2", "4.41", "2.3", "eager"),         # GPT-2's classes set _supports_sdpa from 4.42
    ("gpt2", "4.42", "2.3", "sdpa"),
    ("t5", "4.57", "2.8", "eager"),           # T5 only in 5.15+
    ("t5", "5.15", "2.8", "sdpa"),
    ("gemma2", "4.45", "2.4", "sdpa"),        # Gemma 2 dropped it in 5.21
    ("gemma2", "5.21", "2.9", "eager"),
])
def test_release_rules(model_type, line, torch, expected):
    assert default_attention(model_type, line, torch)[0] == expected


def test_a_requested_sdpa_the_release_refuses_is_one_line():
    for args, text in [(("gpt2", "4.30", "2.0"), "has no attn_implementation"),
                       (("llama", "4.40", "2.0.1"), "needs torch >= 2.1.1"),
                       (("gpt2", "4.41", "2.3"), "do not support attn_implementation='sdpa'")]:
        with pytest.raises(MemfitError, match=text) as e:
            requested_sdpa(*args)
        assert "\n" not in str(e.value)
    assert requested_sdpa("falcon", "4.33", "2.0") is False  # its own call: the current classes decide
    assert requested_sdpa("llama", "4.40", "2.1.2") is True


def test_the_scenario_plans_the_release_attention_and_says_why():
    old = build_scenario(ScenarioInputs(model="gpt2", transformers_version="4.19", torch_version="1.12"))
    assert old.train.attention == "eager"
    said = " ".join(str(a) for a in old.assumptions)
    assert "transformers 4.19 has no attn_implementation" in said
    new = build_scenario(ScenarioInputs(model="gpt2"))
    assert new.train.attention == "sdpa"
    with pytest.raises(MemfitError, match="has no attn_implementation"):
        build_scenario(ScenarioInputs(model="gpt2", transformers_version="4.19", torch_version="1.12", attention="sdpa"))
