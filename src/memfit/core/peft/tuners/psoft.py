"""PSOFT: the base weight's rank-``r`` SVD factors kept as frozen fp32 buffers ``A (r, in)``, ``B (out, r)``, and a
trained ``r x r`` orthogonal rotation between them (a skew-symmetric triangle by default, with two magnitude
vectors) (peft 0.21.2 ``tuners/psoft/layer.py``: ``OrthLayer.__init__``, ``PsoftLayer.__init__``,
``update_layer``, ``_build_psoft_ab_cache_buffers``; ``dispatch_default``: ``nn.Linear`` only)."""

from __future__ import annotations

from collections.abc import Sequence

from memfit.core.peft.inject import AdapterTensor
from memfit.core.peft.modules import ADAPTER_NAME
from memfit.core.peft.targets import Layer
from memfit.core.peft.tuners import defaults
from memfit.core.peft.tuners.base import (
    EXCLUDE,
    FAN_IN_FAN_OUT,
    INIT,
    LAYERS,
    LAYERS_PATTERN,
    MODULES_TO_SAVE,
    TARGETS,
    Settings,
    Tuner,
    free,
    keys,
    only,
    require,
    sized,
)


def _check(layer: Layer, s: Settings) -> None:
    """``PsoftConfig.__post_init__`` and ``update_layer``'s refusals of the sizes."""
    r = s["r"]
    require(r > 0, f"`r` must be a positive integer; got {r}.")
    require(r <= min(layer.in_features, layer.out_features), f"`r` ({r}) must be less than or equal to "
            f"min(in_features, out_features) ({layer.in_features}, {layer.out_features}) ({layer.module})")


def psoft_tensors(layer: Layer, s: Settings, layers: Sequence[Layer]) -> list[AdapterTensor]:
    """``psoft_R`` (an ``OrthLayer``): ``weight (r (r - 1) / 2,)`` with ``psoft_orth`` (and its non-persistent
    int64 ``rows``/``cols`` buffers, ``torch.triu_indices(r, r, 1)``), else ``(r, r)``; ``vector_b (r,)`` and
    ``vector_a (r,)`` with ``psoft_mag_b``/``psoft_mag_a``; the non-persistent fp32 buffers ``_psoft_A_cache (r, in)``
    and ``_psoft_B_cache (out, r)`` (``BufferDict(persistent=False)``, from ``weight.to(torch.float32)``'s SVD)."""
    r = s["r"]
    at = f"psoft_R.{ADAPTER_NAME}."
    tri = r * (r - 1) // 2
    out = [AdapterTensor(at + "weight", (tri,) if s["psoft_orth"] else (r, r))]
    if s["psoft_mag_b"]:
        out.append(AdapterTensor(at + "vector_b", (r,)))
    if s["psoft_mag_a"]:
        out.append(AdapterTensor(at + "vector_a", (r,)))
    if s["psoft_orth"]:
        out += [AdapterTensor(at + "rows", (tri,), buffer="int64", persistent=False),
                AdapterTensor(at + "cols", (tri,), buffer="int64", persistent=False)]
    return out + [
        AdapterTensor(f"_psoft_A_cache.{ADAPTER_NAME}", (r, layer.in_features), buffer="fp32", persistent=False),
        AdapterTensor(f"_psoft_B_cache.{ADAPTER_NAME}", (layer.out_features, r), buffer="fp32", persistent=False),
    ]


TUNER = Tuner(
    peft_type="PSOFT", method="psoft", prefix="psoft_", source="peft/tuners/psoft/layer.py:PsoftLayer.update_layer",
    targets=defaults.LORA, kinds=frozenset({"linear"}),
    keys=keys(
        r=sized("int", 32, "rank of the frozen SVD factors and size of the trained rotation"),
        target_modules=TARGETS, exclude_modules=EXCLUDE,
        psoft_alpha=free("int", 32, "scales the delta only"),
        psoft_dropout=sized("float", 0.0, "dropout on the adapter's input: a mask and a copy per layer"),
        fan_in_fan_out=FAN_IN_FAN_OUT,
        ab_svd_init=free("str", "psoft_init", "how the singular values are split between A and B: same shapes",
                         choices=("psoft_init", "pissa_init")),
        psoft_svd=free("str", "full", "the SVD routine at build time: same factor shapes",
                       choices=("full", "lowrank")),
        psoft_svd_lowrank_niter=free("int", 10, "iterations of the low-rank SVD at build time"),
        random_seed=free("int", 0, "seed of the low-rank SVD"),
        psoft_orth=sized("bool", True, "the rotation from a skew-symmetric triangle (Cayley) or a free r x r matrix"),
        psoft_mag_b=sized("bool", True, "a trained (r,) magnitude on the rotation's rows"),
        psoft_mag_a=sized("bool", True, "a trained (r,) magnitude on the rotation's columns"),
        use_cayley_neumann=sized("bool", False, "the Cayley transform by a Neumann series instead of linalg.solve"),
        num_cayley_neumann_terms=sized("int", 5, "terms of the Neumann series (r x r products kept)"),
        cayley_neumann_eps=only(None, "the skew matrix is rescaled or not by its norm's value at each step "
                                "(_project_Q: data-dependent saved tensors)", "float"),
        modules_to_save=MODULES_TO_SAVE, init_weights=INIT, layers_to_transform=LAYERS, layers_pattern=LAYERS_PATTERN,
    ),
    tensors=psoft_tensors,
    check=_check,
)
