"""OSF (orthogonal subspace fine-tuning): each adapted weight's SVD split into a frozen top-``k`` part and
a trained rest, the trained part's gradients projected away from the frozen subspace (peft 0.21
``tuners/osf/``: ``OSFModel._create_and_replace`` resolves ``k``, ``OSFLayer.update_layer`` keeps the
tensors of ``utils.decompose_weight_matrix``; the base weight stays, frozen)."""

from __future__ import annotations

import re
from collections.abc import Sequence

from memfit.core.peft.inject import AdapterTensor
from memfit.core.peft.modules import ADAPTER_NAME
from memfit.core.peft.targets import Layer
from memfit.core.peft.tuners import defaults
from memfit.core.peft.tuners.base import MODULES_TO_SAVE, TARGETS, Settings, Tuner, free, keys, require, sized


def _resolve(value, min_dim: int) -> int:
    if value is None:
        return max(min_dim // 2, 0)
    r = int(min_dim * value) if isinstance(value, float) and 0 < value <= 1 else int(value)
    return max(min(min_dim, r), 0)


def frozen_rank(layer: Layer, s: Settings) -> int:
    """``k``: ``effective_rank`` (an int, or a fraction of ``min(out, in)``; default half of it), the first
    ``rank_pattern`` regex found in the module name (``re.search``) overriding it."""
    m = min(layer.in_features, layer.out_features)
    k = _resolve(s["effective_rank"], m)
    for pattern, rank in s["rank_pattern"] or ():
        if re.search(pattern, layer.module):
            k = _resolve(rank, m)
            break
    require(k > 0, f"OSF effective_rank must be positive ({layer.module}: {k})")
    return k


def osf_tensors(layer: Layer, s: Settings, layers: Sequence[Layer]) -> list[AdapterTensor]:
    """Trained ``osf_svd_params.default.{S,U,V}_low`` (sorted: ``nn.ParameterDict`` sorts a dict):
    ``S_low (m-k,)``, ``U_low (out, m-k)``, ``V_low (m-k, in)``; non-persistent buffers in the weight's
    dtype: the three ``_osf_*_low_init`` copies, and ``_osf_U_high (out, k)`` when out > in or
    ``_osf_V_high (k, in)`` when out < in."""
    k = frozen_rank(layer, s)
    o, i = layer.out_features, layer.in_features
    low = min(o, i) - k
    at = f"osf_svd_params.{ADAPTER_NAME}."
    out = [AdapterTensor(at + "S_low", (low,)), AdapterTensor(at + "U_low", (o, low)), AdapterTensor(at + "V_low", (low, i))]
    for name, shape in (("_osf_U_low_init", (o, low)), ("_osf_S_low_init", (low,)), ("_osf_V_low_init", (low, i))):
        out.append(AdapterTensor(f"{name}.{ADAPTER_NAME}", shape, buffer="fp32", persistent=False, follows_weight=True))
    if o > i:
        out.append(AdapterTensor(f"_osf_U_high.{ADAPTER_NAME}", (o, k), buffer="fp32", persistent=False,
                                 follows_weight=True))
    if o < i:
        out.append(AdapterTensor(f"_osf_V_high.{ADAPTER_NAME}", (k, i), buffer="fp32", persistent=False,
                                 follows_weight=True))
    return out


TUNER = Tuner(
    peft_type="OSF", method="osf", prefix="osf_", source="peft/tuners/osf/model.py, layer.py, utils.py",
    targets=defaults.OSF, kinds=frozenset({"linear"}),  # dispatch_default: nn.Linear (peft skips a Conv1D silently)
    keys=keys(
        effective_rank=sized("any", None, "frozen top-k singular directions (int or fraction; default half)"),
        target_modules=TARGETS,
        rank_pattern=sized("dict", None, "per-module effective_rank (re.search)"),
        init_weights=free("bool", True, "SVD or random init: same shapes"),
        modules_to_save=MODULES_TO_SAVE,
        target_svd_config=free("dict", None, "accepted and ignored by peft 0.21.2 (forward compatibility)"),
    ),
    tensors=osf_tensors,
)
