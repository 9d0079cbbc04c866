"""The saved-tensor formulas of the tuners in ``core/activations/adapters/recent.py`` under the ledger's symbolic
pass (``tensors.split_estimate`` evaluates them with the stream's dtype a ``Sym``): a weight-sized term must stay
one tensor. A term ``n * D`` reads as ``n`` tensors of ``D`` bytes: FRoD's ``(in, in)`` terms written that way made a
Llama-2-7B plan run for minutes (11008^2 list entries)."""

from __future__ import annotations

from types import MappingProxyType

from memfit.core.activations.adapters import AdaptedLayer, DtypeContext
from memfit.core.activations.adapters.recent import FORMULAS
from memfit.core.activations.tensors import DTYPE, Sym, tensors
from memfit.core.peft.spec import PeftSpec

IN, OUT, R = 4096, 11008, 8
LAYERS = {
    "frod": {"frod_lambda_l.default": (IN,), "frod_lambda_s_values.default": (167772,), "frod_U.default": (OUT, IN)},
    "hira": {"hira_A.default": (R, IN), "hira_B.default": (OUT, R)},
    "glora": {"glora_A.default.Xd": (OUT, R), "glora_A.default.Xu": (R, IN), "glora_B.default.Xd": (OUT, R),
              "glora_B.default.Xu": (R, IN), "glora_C.default.zeros": (IN, 1), "glora_D.default.zeros": (OUT,),
              "glora_E.default.zeros": (OUT,)},
    "deft": {"deft_P.default": (OUT, R), "deft_R.default": (R, IN)},
    "peanut": {"peanut_A.default.weight": (R, OUT), "peanut_B.default.weight": (OUT, R)},
    "lily": {"lily_A.default.weight": (R, IN), "lily_B.default.weight": (2 * R, OUT), "lily_router.default.weight": (2, R)},
    "beft": {"beft_bias.default": (1, OUT)},
}


def test_fixed_terms_stay_few_tensors_under_a_symbolic_stream():
    for method, tensors_of in LAYERS.items():
        layer = AdaptedLayer(module="model.layers.0.mlp.up_proj", block=0, in_features=IN, out_features=OUT,
                             tensors=MappingProxyType(tensors_of))
        for adapter, autocast in ((2, 0), (4, 0), (4, 2)):
            ctx = DtypeContext(stream=Sym.atom(DTYPE, 2), adapter=adapter, autocast=autocast, base=2)
            saved = FORMULAS[method](layer, PeftSpec(method=method), ctx)
            read = tensors(saved.fixed)
            assert read is None or len(read) <= 16, (method, adapter, autocast, len(read))
