"""Which DeepSpeed config keys memfit refuses, warns about or reads, against DeepSpeed 0.19.8 itself.

For configs generated here (every known key misspelled in the usual ways, at the top level and
inside every section memfit has a key table for), DeepSpeed's ``DeepSpeedConfig`` decides:

- it raises: memfit must refuse the config (``MemfitError``);
- it accepts, and its parsed config is the same with and without the key (it ignores the key):
  memfit must accept the config and warn, naming the key;
- it accepts and the key changes what it parsed: memfit must not call the key ignored.

The key tables themselves (``STRICT_SECTIONS`` ...) are compared with DeepSpeed's pydantic models.
"""

from __future__ import annotations

import copy
import enum
import importlib
import os

import pytest

os.environ.setdefault("DS_ACCELERATOR", "cpu")
pytest.importorskip("deepspeed")

from deepspeed.runtime.config import DeepSpeedConfig  # noqa: E402
from test_dsconfig_against_deepspeed import deepspeed_config, ds_comm  # noqa: E402,F401 (the fixture)

from memfit.core.dsconfig import (  # noqa: E402
    KNOWN_TOP_LEVEL,
    LOOSE_SECTIONS,
    STRICT_SECTIONS,
    AutoContext,
    parse_deepspeed_config,
)
from memfit.errors import MemfitError  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore")]

BASE = {"train_micro_batch_size_per_gpu": 1}

MODELS = {
    "tensorboard": "deepspeed.monitor.config:TensorBoardConfig",
    "csv_monitor": "deepspeed.monitor.config:CSVConfig",
    "wandb": "deepspeed.monitor.config:WandbConfig",
    "comet": "deepspeed.monitor.config:CometConfig",
    "comms_logger": "deepspeed.comm.config:CommsLoggerConfig",
    "compile": "deepspeed.compile.config:CompileConfig",
    "hybrid_engine": "deepspeed.runtime.config:HybridEngineConfig",
    "tensor_parallel": "deepspeed.runtime.tensor_parallel.config:TPTrainingConfig",
    "weight_quantization": "deepspeed.inference.config:WeightQuantConfig",
}


@pytest.mark.parametrize("section", sorted(STRICT_SECTIONS))
def test_strict_section_tables_equal_deepspeeds_models(section):
    module, name = MODELS[section].split(":")
    model = getattr(importlib.import_module(module), name)
    keys = set(model.model_fields) | {f.alias for f in model.model_fields.values() if f.alias}
    assert STRICT_SECTIONS[section] == keys
    assert model.model_config.get("extra") == "forbid"


def typos(key: str) -> list[str]:
    """The usual misspellings: a letter dropped or doubled, two swapped, British -ise, a plural,
    a hyphen or a capital for an underscore, an underscore inserted after a prefix."""
    out = {key[:i] + key[i + 1:] for i in range(len(key))}
    out |= {key[:i] + key[i] + key[i:] for i in range(len(key))}
    out |= {key[:i] + key[i + 1] + key[i] + key[i + 2:] for i in range(len(key) - 1)}
    out |= {key.replace("iz", "is"), key + "s", key.replace("_", "-"), key.upper(), key.replace("16", "_16")}
    return sorted(k for k in out if k and k != key)


def _view(obj, depth=0):
    """DeepSpeedConfig's parsed state as plain data (pydantic models dumped, objects by their vars)."""
    if depth > 6:
        return repr(obj)
    if hasattr(obj, "model_dump"):
        return _view(obj.model_dump(), depth + 1)
    if isinstance(obj, dict):
        return {k: _view(v, depth + 1) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_view(v, depth + 1) for v in obj]
    if isinstance(obj, enum.Enum) or obj is None or isinstance(obj, (str, int, float, bool)):
        return obj
    if hasattr(obj, "__dict__"):
        return {k: _view(v, depth + 1) for k, v in vars(obj).items() if not k.startswith("_param_dict")}
    return repr(obj)


def deepspeed_verdict(config: dict, without: dict) -> str:
    """``refuses``, ``ignores`` (same parsed config without the key) or ``reads``."""
    try:
        got = _view(deepspeed_config(config, 1))
    except Exception:
        return "refuses"
    return "ignores" if got == _view(deepspeed_config(without, 1)) else "reads"


def memfit_verdict(config: dict, key: str) -> str:
    try:
        ds = parse_deepspeed_config(copy.deepcopy(config), context=AutoContext(world_size=1))
    except MemfitError:
        return "refuses"
    return "warns" if any(repr(key) in w or f".{key}:" in w for w in ds.warnings) else "reads"


def _cases() -> list[tuple[str, dict, dict, str]]:
    cases = []
    for key in sorted(KNOWN_TOP_LEVEL):
        for typo in typos(key):
            if typo not in KNOWN_TOP_LEVEL:
                cases.append((f"top:{typo}", {**BASE, typo: {"enabled": True}}, dict(BASE), typo))
    for section, table in sorted({**STRICT_SECTIONS, **LOOSE_SECTIONS}.items()):
        base = {**BASE, section: {}}
        for key in sorted(table):
            for typo in typos(key)[:6]:
                if typo not in table:
                    cases.append((f"{section}:{typo}", {**BASE, section: {typo: 1}}, base, typo))
    return cases


CASES = _cases()


def test_the_generated_cases_cover_every_section():
    assert len(CASES) > 1500
    assert {c[0].split(":")[0] for c in CASES} >= {"top", *STRICT_SECTIONS, *LOOSE_SECTIONS}


def test_memfit_refuses_what_deepspeed_refuses_and_warns_about_what_it_ignores(ds_comm):
    wrong = []
    counts = {"refuses": 0, "ignores": 0, "reads": 0}
    for name, config, without, key in CASES:
        theirs = deepspeed_verdict(config, without)
        ours = memfit_verdict(config, key)
        counts[theirs] += 1
        ok = {"refuses": ours == "refuses", "ignores": ours == "warns", "reads": ours != "warns"}[theirs]
        if not ok:
            wrong.append(f"{name}: DeepSpeed {theirs}, memfit {ours}")
    assert not wrong, f"{len(wrong)} of {len(CASES)} disagree: " + "; ".join(wrong[:20])
    assert counts["refuses"] > 100 and counts["ignores"] > 1000, counts  # both kinds really exercised


@pytest.mark.parametrize("section", sorted(STRICT_SECTIONS) + sorted(LOOSE_SECTIONS))
def test_a_section_that_is_not_an_object(ds_comm, section):
    config = {**BASE, section: "yes"}
    assert deepspeed_verdict(config, dict(BASE)) == "refuses"
    with pytest.raises(MemfitError, match=section):
        parse_deepspeed_config(config, context=AutoContext(world_size=1))


def test_the_misspelled_sections_of_the_issue(ds_comm):
    """zero_optimisation, optimiser, bf_16, gradient_accumulation_step: DeepSpeed plans ZeRO-0 and
    fp32 as if they were not there; memfit says so, with the key meant."""
    config = {**BASE, "zero_optimisation": {"stage": 3}, "optimiser": {"type": "AdamW"}, "bf_16": {"enabled": True},
              "gradient_accumulation_step": 4}
    c = deepspeed_config(config, 1)
    assert (c.zero_optimization_stage, c.bfloat16_config.enabled, c.gradient_accumulation_steps) == (0, False, 1)
    ds = parse_deepspeed_config(config, context=AutoContext(world_size=1))
    assert (ds.zero.stage, ds.precision, ds.gradient_accumulation_steps) == (0, "fp32", 1)
    said = " ".join(ds.warnings)
    for typo, meant in (("zero_optimisation", "zero_optimization"), ("optimiser", "optimizer"), ("bf_16", "bf16"),
                        ("gradient_accumulation_step", "gradient_accumulation_steps")):
        assert f"'{typo}' is not a DeepSpeed key (did you mean '{meant}'?)" in said


def test_offload_param_below_stage_3_is_a_warning(ds_comm):
    config = {**BASE, "zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}}
    c = deepspeed_config(config, 1)
    assert c.zero_optimization_stage == 2  # DeepSpeed accepts it; only stage 3 uses offload_param
    ds = parse_deepspeed_config(config, context=AutoContext(world_size=1))
    assert any("offload_param is used by ZeRO stage 3 only" in w for w in ds.warnings)


def test_deepspeed_config_keeps_no_state_between_cases(ds_comm):
    """The equality above compares two fresh DeepSpeedConfig objects: the same input twice is equal."""
    assert _view(DeepSpeedConfig(copy.deepcopy(BASE))) == _view(DeepSpeedConfig(copy.deepcopy(BASE)))
