"""The LyCORIS family in peft: LoHa (Hadamard product of two low-rank pairs) and LoKr (Kronecker
product of two factors), peft 0.21 ``tuners/loha/layer.py`` and ``tuners/lokr/layer.py``
(``create_adapter_parameters`` / ``update_layer``). Both rebuild the full ``(out, in)`` delta weight
in every forward (``get_delta_weight``) and run ``F.linear(x, delta)`` beside the base layer.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from memfit.core.peft.inject import AdapterTensor
from memfit.core.peft.modules import ADAPTER_NAME
from memfit.core.peft.targets import Layer
from memfit.core.peft.tuners import defaults
from memfit.core.peft.tuners.base import (EXCLUDE, INIT, LAYERS, LAYERS_PATTERN, MODULES_TO_SAVE, TARGETS, Settings,
                                          Tuner, free, keys, require, sized)


def pattern_value(module: str, pattern: tuple[tuple[str, object], ...], default):
    """``utils/other.py:get_pattern_key``: the first key ``k`` with ``re.match(rf"(.*\\.)?({k})$", module)``."""
    for key, value in pattern or ():
        if re.match(rf"(.*\.)?({key})$", module):
            return value
    return default


def factorization(dimension: int, factor: int = -1) -> tuple[int, int]:
    """``tuners/lokr/layer.py:factorization``: ``dimension = m * n`` with ``m <= n``, ``m`` as close to
    ``sqrt(dimension)`` as the factors allow (or ``factor`` itself when it divides)."""
    if factor > 0 and dimension % factor == 0:
        return factor, dimension // factor
    if factor == -1:
        factor = dimension
    m, n = 1, dimension
    length = m + n
    while m < n:
        new_m = m + 1
        while dimension % new_m != 0:
            new_m += 1
        new_n = dimension // new_m
        if new_m + new_n > length or new_m > factor:
            break
        m, n = new_m, new_n
    if m > n:
        n, m = m, n
    return m, n


def _rank(layer: Layer, s: Settings) -> int:
    r = pattern_value(layer.module, s["rank_pattern"], s["r"])
    require(r > 0, f"`r` should be a positive integer value but the value passed is {r} ({layer.module})")
    return r


def loha_tensors(layer: Layer, s: Settings, layers: Sequence[Layer]) -> list[AdapterTensor]:
    """Linear ``(out, in)``: ``hada_w1_a (out, r)``, ``hada_w1_b (r, in)``, ``hada_w2_a (out, r)``,
    ``hada_w2_b (r, in)`` (``LoHaLayer.create_adapter_parameters``)."""
    r = _rank(layer, s)
    o, i = layer.out_features, layer.in_features
    at = f".{ADAPTER_NAME}"
    return [AdapterTensor("hada_w1_a" + at, (o, r)), AdapterTensor("hada_w1_b" + at, (r, i)),
            AdapterTensor("hada_w2_a" + at, (o, r)), AdapterTensor("hada_w2_b" + at, (r, i))]


def lokr_factors(layer: Layer, s: Settings) -> tuple[tuple[int, int], tuple[int, int], bool, bool]:
    """``LoKrLayer.update_layer`` for a Linear: ``out = a*b``, ``in = c*d`` (``factorization``), and
    whether ``w1``/``w2`` are full (``use_w1``/``use_w2``) or low-rank pairs."""
    r = _rank(layer, s)
    factor = s["decompose_factor"]
    in_m, in_n = factorization(layer.in_features, factor)
    out_l, out_k = factorization(layer.out_features, factor)
    use_w1 = not (s["decompose_both"] and r < max(out_l, in_m) / 2)
    use_w2 = not (r < max(out_k, in_n) / 2)
    return (out_l, out_k), (in_m, in_n), use_w1, use_w2


def lokr_tensors(layer: Layer, s: Settings, layers: Sequence[Layer]) -> list[AdapterTensor]:
    """``lokr_w1 (a, c)`` or ``lokr_w1_a (a, r)`` + ``lokr_w1_b (r, c)``; ``lokr_w2 (b, d)`` or
    ``lokr_w2_a (b, r)`` + ``lokr_w2_b (r, d)`` (``LoKrLayer.create_adapter_parameters``)."""
    r = _rank(layer, s)
    (a, b), (c, d), use_w1, use_w2 = lokr_factors(layer, s)
    at = f".{ADAPTER_NAME}"
    out = [AdapterTensor("lokr_w1" + at, (a, c))] if use_w1 else [
        AdapterTensor("lokr_w1_a" + at, (a, r)), AdapterTensor("lokr_w1_b" + at, (r, c))]
    out += [AdapterTensor("lokr_w2" + at, (b, d))] if use_w2 else [
        AdapterTensor("lokr_w2_a" + at, (b, r)), AdapterTensor("lokr_w2_b" + at, (r, d))]
    return out


_COMMON = dict(
    rank_pattern=sized("dict", {}, "per-module ranks (get_pattern_key)"),
    alpha_pattern=free("dict", {}, "per-module alphas: scales only"),
    r=sized("int", 8, "rank of each low-rank factor"),
    alpha=free("float", 8, "scales the delta (alpha / r) only"),
    rank_dropout=sized("float", 0.0, "drops rows of the delta weight in training (a row mask per forward)"),
    module_dropout=sized("float", 0.0, "skips the adapter for a whole forward with this probability"),
    use_effective_conv2d=free("bool", False, "Conv layers only (none in a transformer LM)"),
)

LOHA = Tuner(
    peft_type="LOHA", method="loha", prefix="hada_", source="peft/tuners/loha/layer.py:LoHaLayer.update_layer",
    targets=defaults.LORA, kinds=frozenset({"linear"}),
    keys=keys(
        **_COMMON,
        target_modules=TARGETS, exclude_modules=EXCLUDE, init_weights=INIT, layers_to_transform=LAYERS,
        layers_pattern=LAYERS_PATTERN, modules_to_save=MODULES_TO_SAVE,
    ),
    tensors=loha_tensors,
)

LOKR = Tuner(
    peft_type="LOKR", method="lokr", prefix="lokr_", source="peft/tuners/lokr/layer.py:LoKrLayer.update_layer",
    targets=defaults.LORA, kinds=frozenset({"linear"}),
    keys=keys(
        **_COMMON,
        decompose_both=sized("bool", False, "w1 is a low-rank pair too when r is small enough"),
        decompose_factor=sized("int", -1, "the factor factorization() aims for"),
        rank_dropout_scale=free("bool", False, "rescales the rank-dropout mask"),
        target_modules=TARGETS, exclude_modules=EXCLUDE, init_weights=INIT, layers_to_transform=LAYERS,
        layers_pattern=LAYERS_PATTERN, modules_to_save=MODULES_TO_SAVE,
    ),
    tensors=lokr_tensors,
)
