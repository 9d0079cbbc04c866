"""A model_type only a later transformers release ships is planned only for a stack of that release
(``families.transformers_types``: 5.25.0 added nine types to 5.24.0's CONFIG_MAPPING)."""

from __future__ import annotations

import pytest

from memfit.core.catalog import source_from_config
from memfit.core.scenario.build import _model_shape
from memfit.core.scenario.inputs import ScenarioInputs
from memfit.errors import MemfitError


def test_a_type_the_stated_release_lacks_is_refused():
    source = source_from_config({"model_type": "ergo"})
    with pytest.raises(MemfitError, match=r"'ergo' is in transformers from 5\.25\.0; the stack's transformers 5\.24"):
        _model_shape(source, ScenarioInputs(transformers_version="5.24", torch_version="2.13"))


def test_a_type_no_release_ships_is_still_the_custom_code_error():
    from memfit.core.families import NoPureBuilder

    with pytest.raises(NoPureBuilder, match="transformers does not ship it either"):
        _model_shape(source_from_config({"model_type": "no_such_type"}), ScenarioInputs(torch_version="2.13"))
