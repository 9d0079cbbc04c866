"""The scenario's transformers release reaches Falcon's shape: ``stack: transformers:`` (here
``transformers_version``) -> ``scenario.build._model_shape`` -> ``build_model_shape(transformers_line=)``
-> ``families.falcon.at_release``. tiiuae/falcon-7b (hidden 4544, 71 heads of 64, one key/value head,
32 layers) under the seed's prefix tuning (10 virtual tokens, projection, encoder_hidden_size 4096):
peft's ``token_dim`` is the hidden size under 5.24 (FalconConfig has no ``num_key_value_heads``) and
64 x 1 under 5.25."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from memfit.core.scenario.build import build_scenario
from memfit.core.scenario.read import read_scenario_file

SEED = Path(__file__).resolve().parents[2] / "examples" / "kogpt-prefix-zero3-offload.yaml"


def _prefix(d: int, n: int = 10, h: int = 4096, layers: int = 32) -> int:
    """PrefixEncoder with projection: n d + (d + 1) h + (h + 1) 2 L d (prompt_learning.prefix_encoder_params)."""
    return n * d + (d + 1) * h + (h + 1) * 2 * layers * d


@pytest.mark.parametrize(("release", "token_dim", "shared"), [("5.24", 4544, False), ("5.25", 64, True)])
def test_the_stack_s_release_builds_falcon(release, token_dim, shared):
    sc = build_scenario(dataclasses.replace(read_scenario_file(SEED), model="tiiuae/falcon-7b",
                                            transformers_version=release))
    assert sc.model.trainable_params == _prefix(token_dim)  # 1,210,134,912 (5.24), 17,048,192 (5.25)
    assert sc.model.arch.layout.shared_attention is shared
