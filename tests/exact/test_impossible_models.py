"""Model configs transformers cannot run are refused by memfit, checked against transformers itself.

Each config is built with transformers (tiny sizes, CPU) and run forward once: it must fail there,
and memfit must refuse it with one line naming the fields; the same config made consistent must
run in transformers and plan in memfit (so the refusal is about the fields named, nothing else).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from memfit.core.catalog import ModelConfigSource  # noqa: E402
from memfit.core.shapes import build_model_shape  # noqa: E402
from memfit.errors import MemfitError  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore")

LLAMA = dict(model_type="llama", vocab_size=64, hidden_size=48, intermediate_size=64, num_hidden_layers=1,
             num_attention_heads=4, num_key_value_heads=4, head_dim=12)
MIXTRAL = dict(model_type="mixtral", vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
               num_attention_heads=4, num_key_value_heads=2, num_local_experts=2, num_experts_per_tok=1)

CASES = {
    "kv heads do not divide heads": (LLAMA, {"num_key_value_heads": 3}, "not a multiple of num_key_value_heads 3"),
    "more kv heads than heads": (LLAMA, {"num_key_value_heads": 8}, "num_key_value_heads 8 is more than"),
    "top-k above the experts": (MIXTRAL, {"num_experts_per_tok": 3}, "num_experts_per_tok 3 is more than"),
}


def transformers_runs(config: dict) -> bool:
    cls = {"llama": transformers.LlamaConfig, "mixtral": transformers.MixtralConfig}[config["model_type"]]
    cfg = cls(**{k: v for k, v in config.items() if k != "model_type"})
    try:
        model = transformers.AutoModelForCausalLM.from_config(cfg)
        with torch.no_grad():
            model(torch.zeros(1, 5, dtype=torch.long))
    except Exception:  # noqa: BLE001 - any failure to build or run is the point
        return False
    return True


def memfit_plans(config: dict) -> bool:
    try:
        build_model_shape(ModelConfigSource(name="tiny", config=config, path=None, origin="local"))
    except MemfitError:
        return False
    return True


@pytest.mark.parametrize("name", sorted(CASES))
def test_refused_like_transformers(name):
    base, change, message = CASES[name]
    bad = {**base, **change}
    assert transformers_runs(base) and memfit_plans(base)
    assert not transformers_runs(bad)
    with pytest.raises(MemfitError, match=message) as err:
        build_model_shape(ModelConfigSource(name="tiny", config=bad, path=None, origin="local"))
    assert "\n" not in str(err.value)


def test_grouped_query_heads_that_divide_are_planned():
    ok = {**LLAMA, "num_key_value_heads": 2}
    assert transformers_runs(ok) and memfit_plans(ok)
