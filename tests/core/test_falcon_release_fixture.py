"""memfit's Falcon rules for a transformers release CI does not install, against that release's own
figures: tests/fixtures/releases/falcon-<version>.json, written by scripts/record_falcon_release.py
under that release (its ``produced_by``; 5.25.0: /tmp/v525, transformers 5.25.0, peft 0.21.2,
torch 2.13.0). Pure: memfit is told the fixture's release (``transformers_line``) and compared with
peft's counts and the traced activation bytes recorded there; the same comparisons run against the
installed release in tests/exact/test_peft_against_library.py and tests/trace.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memfit.core.activations.analytic import estimate_activation_bytes
from memfit.core.catalog import source_from_config
from memfit.core.peft.params import apply_peft
from memfit.core.peft.prompt_learning import prompt_learning_dims
from memfit.core.peft.spec import PeftSpec
from memfit.core.shapes import build_model_shape
from memfit.core.stack.releases import release_line

FIXTURES = sorted((Path(__file__).resolve().parents[1] / "fixtures" / "releases").glob("falcon-*.json"))
RECORDS = {f.stem: json.loads(f.read_text()) for f in FIXTURES}

TOLERANCE = 0.0015
"""Plan vs the recorded 5.25.0 trace. Worst observed +0.072% (falcon-7b-style token classification, bf16,
b=2, s=48: +380 B of 526,132 B; s=96 +0.069%): about 4 B per token, what the CPU fake LayerNorm keeps
less than CUDA's (test_family_activations.TOLERANCE); every other cell -0.001% to -0.003% (-8 B). 2x the
worst, well inside the grid's 0.5%."""

DTYPES = {"fp32": ("fp32", None), "amp-bf16": ("fp32", "bf16"), "amp-fp16": ("fp32", "fp16"), "bf16": ("bf16", None),
          "fp16": ("fp16", None)}


def _shape(record: dict, name: str, task: str | None = None):
    line = release_line("transformers", record["transformers"], where="the fixture")
    return build_model_shape(source_from_config(record["configs"][name]), task=task, transformers_line=line)


def test_a_release_after_the_default_is_recorded():
    assert "falcon-5.25.0" in RECORDS and RECORDS["falcon-5.25.0"]["transformers"] == "5.25.0"


PEFT_CASES = [(f, n, m) for f, r in RECORDS.items() for n, cases in r["peft"].items() for m in cases]


@pytest.mark.parametrize(("fixture", "name", "method"), PEFT_CASES)
def test_prompt_learning_counts_are_peft_s_for_the_release(fixture, name, method):
    """5.25's FalconConfig has num_key_value_heads: prefix tuning's token_dim is head_dim x key/value heads
    (falcon-7b-style 16, falcon-40b-style 32; the hidden size 64 under 5.24)."""
    record = RECORDS[fixture]
    case = record["peft"][name][method]
    shape = _shape(record, name)
    spec = PeftSpec(**case["spec"])
    planned = apply_peft(shape, spec)
    assert prompt_learning_dims(shape, spec).token_dim == case["token_dim"]
    assert (planned.trainable_params, planned.total_params) == (case["trainable"], case["total"])


TRACE_CASES = [pytest.param(f, row, id=f"{f}-{row['name']}-{row['prec']}-{row['method']}-{row['attention']}-"
                            f"b{row.get('b', 1)}-s{row['seq']}-gc{row.get('gc', False)}-{row.get('task')}")
               for f, r in RECORDS.items() for row in r["trace"]]


@pytest.mark.parametrize(("fixture", "row"), TRACE_CASES)
def test_activations_match_the_release_s_trace(fixture, row):
    record = RECORDS[fixture]
    shape = _shape(record, row["name"], row.get("task"))
    spec = PeftSpec(method=row["method"], **({"target_modules": tuple(row["target_modules"])} if row["method"] == "lora"
                                             else {}))
    dtype, autocast = DTYPES[row["prec"]]
    model = estimate_activation_bytes(shape.arch, spec, seq_len=row["seq"], micro_batch=row.get("b", 1),
                                      dtype_bytes=4 if dtype == "fp32" else 2, compute_bytes=2 if autocast else None,
                                      gradient_checkpointing=row.get("gc", False), attention=row["attention"],
                                      float16=dtype == "fp16")
    err = (model.total_bytes - row["trace_bytes"]) / row["trace_bytes"]
    print(f"{row['name']} {row['prec']} {row['method']} s={row['seq']}: trace {row['trace_bytes']:,} B "
          f"plan {model.total_bytes:,} B {err:+.3%}")
    assert abs(err) <= TOLERANCE
