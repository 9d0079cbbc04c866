"""The activation model's bytes as tensors (``core/activations/tensors.py``): for every published config
memfit ships, every PEFT method and task setting the grid holds, the tensors of each layer, the
embeddings and the head add up to the model's own figures to the byte (so the ledger's peaks do not
move), and the split is not a fallback lump. The tensor sizes themselves are checked against the
replays' recorded forwards in tests/replay/test_sequence_vs_replay.py."""

from __future__ import annotations

import pytest

from memfit.core.activations.analytic import estimate_activation_bytes
from memfit.core.activations.tensors import Sym, lumps, split_estimate, tensors
from memfit.core.catalog import list_catalog, resolve_model_config
from memfit.core.peft.spec import PeftSpec
from memfit.core.shapes import build_model_shape

PEFTS = (PeftSpec(method="full"), PeftSpec(method="lora", lora_r=16), PeftSpec(method="prefix", num_virtual_tokens=8))
SETTINGS = (dict(dtype_bytes=2, gradient_checkpointing=False, attention="sdpa"),
            dict(dtype_bytes=4, gradient_checkpointing=True, attention="sdpa"),
            dict(dtype_bytes=2, gradient_checkpointing=False, attention="eager"))


def _archs():
    out = {}
    for e in list_catalog():
        arch = build_model_shape(resolve_model_config(e.name)).arch
        out.setdefault((arch.model_type, arch.layout.family if arch.layout else None), (e.name, arch))
    return sorted(out.values(), key=lambda x: x[0])


ARCHS = _archs()


@pytest.mark.parametrize("name, arch", ARCHS, ids=[n for n, _ in ARCHS])
def test_tensors_add_up_to_the_models_figures(name, arch):
    for peft in PEFTS:
        if peft.method == "prefix" and arch.task != "causal-lm":
            continue
        for s in SETTINGS:
            kw = dict(seq_len=257, micro_batch=3, **s)
            try:
                est = estimate_activation_bytes(arch, peft, **kw)
            except Exception:  # noqa: BLE001 - an attention this family refuses is refused before planning
                continue
            at = split_estimate(est, arch, peft, **kw)
            assert at.split, (name, peft.method, s, at.notes)
            assert [sum(x) for x in at.layers] == list(est.per_layer_bytes())
            assert [sum(x) for x in at.recompute] == list(est.recompute_per_layer())
            assert sum(at.embedding) == est.embedding_bytes
            assert sum(at.head_rest) == est.head_bytes - est.logits_kept_bytes - est.loss_saved_bytes
            assert all(n > 0 for part in (*at.layers, at.embedding, at.head_rest) for n in part)
            if not s["gradient_checkpointing"] and est.per_layer_bytes():
                assert len(at.layers[-1]) > 3, (name, "a layer is several tensors")


def test_reading_terms_as_tensors():
    D, t, h, i = Sym.atom("D", 2), Sym.atom("t", 10), Sym.atom("h", 8), Sym.atom("i", 30)
    n = 0
    n += D * t * h          # one dtype tensor
    n += 3 * D * t * i      # three
    n += 4 * t * h          # one fp32 tensor
    n -= D * t * h          # a removal
    assert tensors(n) == (600, 600, 600, 320) and int(n) == 2120
    assert tensors(7) == (7,)
    assert tensors(D * t - 3 * D * t) is None  # removing tensors never added: not a reading


def test_a_formula_that_does_not_evaluate_stays_one_tensor(monkeypatch):
    from memfit.core.activations import analytic

    arch = ARCHS[0][1]
    kw = dict(seq_len=64, micro_batch=1, dtype_bytes=2)
    est = estimate_activation_bytes(arch, PeftSpec(method="full"), **kw)

    def broken(*a, **k):
        raise TypeError("not symbolic")

    monkeypatch.setattr(analytic, "estimate_activation_bytes", broken)
    at = split_estimate(est, arch, PeftSpec(method="full"), **kw)
    assert not at.split and at.layers == lumps(est).layers and "did not evaluate" in at.notes[0]
