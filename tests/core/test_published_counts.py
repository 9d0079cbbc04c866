"""Every shipped config.json reproduces the parameter count its model card or paper states.

tests/fixtures/catalog/published_params.csv lists, per catalog model, the published figure, what it
counts (``total``, ``non_embedding``: without the input embedding and an untied output embedding,
``embedding``, ``activated``: per token for mixtures of experts), the precision it is stated with and
how it was rounded, and where it is published. The tolerance is the stated precision:

- ``exact``: every digit published;
- ``round``: within half a unit of the last digit stated (``7.61B`` -> +-0.005B);
- ``cut``: the figure cut to its digits (``1.23B`` for 1.236B) -> [published, published + unit);
- ``either``: a source that rounds some figures and cuts others (Qwen's cards);
- ``approx``: the published figure is inconsistent (its own total, the checkpoint's tensors); the
  row says why and the tolerance is the discrepancy, rounded up.

A wrong shape field (layers, widths, vocabulary, experts) moves a count far beyond these.
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from memfit.core.catalog import list_catalog, resolve_model_config
from memfit.core.model import ModelShape
from memfit.core.shapes import build_model_shape

TABLE = Path(__file__).parents[1] / "fixtures" / "catalog" / "published_params.csv"
ROWS = list(csv.DictReader(TABLE.open(encoding="utf-8")))
_UNITS = {"B": 10**9, "M": 10**6}
_EMBEDDINGS = ("embed_tokens.weight", "wte.weight", "embed_in.weight", "word_embeddings.weight", "shared.weight")


def number(text: str) -> float:
    text = text.replace(",", "")
    return float(text[:-1]) * _UNITS[text[-1]] if text[-1] in _UNITS else float(text)


def counted(shape: ModelShape, what: str) -> int:
    total = shape.total_params
    embedding = sum(p.numel for p in shape.params if p.name.endswith(_EMBEDDINGS))
    if what == "total":
        return total
    if what == "embedding":
        return embedding
    if what == "non_embedding":
        return total - embedding - sum(p.numel for p in shape.params if p.name == "lm_head.weight")
    if what == "activated":  # every expert's share beyond the top-k a token uses drops out
        a = shape.arch
        idle = sum(p.numel for p in shape.params if ".experts." in p.name) * (a.num_experts - a.experts_per_token)
        return total - idle // a.num_experts
    raise AssertionError(what)


def within(value: int, published: float, precision: float, rounding: str) -> bool:
    return {
        "exact": value == published,
        "round": abs(value - published) <= precision / 2,
        "cut": published <= value < published + precision,
        "either": published - precision / 2 <= value < published + precision,
        "approx": abs(value - published) <= precision,
    }[rounding]


@pytest.mark.parametrize("row", ROWS, ids=lambda r: f"{r['name']}:{r['counted']}")
def test_shipped_config_reproduces_the_published_count(row):
    shape = build_model_shape(resolve_model_config(row["name"], allow_download=False))
    value = counted(shape, row["counted"])
    published = number(row["published"])
    assert within(value, published, number(row["precision"]), row["rounding"]), (
        f"{row['name']} {row['counted']}: memfit {value:,} vs published {row['published']} ({row['source']})"
    )


def test_every_catalog_model_has_a_published_count_with_a_source():
    named = {row["name"] for row in ROWS}
    assert named == {entry.name for entry in list_catalog()}
    assert all(row["source"] and row["rounding"] in ("exact", "round", "cut", "either", "approx") for row in ROWS)
    # the approximate rows are few, and each says what the publication got wrong
    assert sum(row["rounding"] == "approx" for row in ROWS) <= 7


def test_the_catalog_covers_the_sizes_people_pick():
    totals = sorted(build_model_shape(resolve_model_config(e.name)).total_params for e in list_catalog())
    assert len(totals) >= 40
    for low, high in ((4e8, 1e9), (1e9, 2e9), (2e9, 5e9), (6e9, 9e9), (1.2e10, 1.6e10), (3e10, 3.5e10), (6.5e10, 7.5e10)):
        assert any(low <= t < high for t in totals), (low, high)
