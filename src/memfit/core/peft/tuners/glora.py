"""GLoRA: the adapted Linear runs ``F.linear(x, W + W * A + B, b + b * D + E + W @ C)``, each of A..E a
low-rank product, a vector, a scalar or a frozen zeros buffer (peft 0.21.2 ``tuners/glora/``:
``GloraLayer.update_layer``, the ``Glora*Path`` modules, ``GloraModel._create_new_module``)."""

from __future__ import annotations

from collections.abc import Sequence

from memfit.core.peft.inject import AdapterTensor
from memfit.core.peft.modules import ADAPTER_NAME
from memfit.core.peft.targets import Layer
from memfit.core.peft.tuners import defaults
from memfit.core.peft.tuners.base import INIT, MODULES_TO_SAVE, TARGETS, Settings, Tuner, bias_key, keys, sized


def _path(name: str, kind: str, out_f: int, in_f: int, r: int, column: bool = True) -> list[AdapterTensor]:
    """One ``Glora*Path`` of an ``(out_f, in_f)`` matrix (``in_f`` 0: a vector): ``lora`` ``Xd (out_f, r)``,
    ``Xu (r, in_f)`` (``GloraLoraPath``); ``vector`` ``X (out_f, 1)``, or ``(out_f,)`` for D and E
    (``GloraVectorPath(is_column=...)``); ``constant`` ``X (1,)`` (``GloraScalarPath``); ``none`` the persistent
    ``zeros`` buffer of the full shape (``GloraEmptyPath``: ``register_buffer``; in the base weight's dtype,
    ``_move_adapter_to_device_of_base_layer`` casts it)."""
    at = f"{name}.{ADAPTER_NAME}"
    if kind == "lora":
        return [AdapterTensor(f"{at}.Xd", (out_f, r)), AdapterTensor(f"{at}.Xu", (r, in_f))]
    if kind == "vector":
        return [AdapterTensor(f"{at}.X", (out_f, 1) if column else (out_f,))]
    if kind == "constant":
        return [AdapterTensor(f"{at}.X", (1,))]
    shape = (out_f, in_f) if in_f else (out_f,)
    return [AdapterTensor(f"{at}.zeros", shape, buffer="fp32", follows_weight=True)]


def glora_tensors(layer: Layer, s: Settings, layers: Sequence[Layer]) -> list[AdapterTensor]:
    """A and B ``(out, in)`` by ``config_A_B``; with a base bias, C ``(in, 1)`` by ``config_C`` (its low rank is
    ``GloraLoraPath(in, 1, r)``) and D, E ``(out,)`` by ``config_D_E``; without one, C, D and E are zeros buffers
    (``update_layer``: ``has_bias and ...`` else ``GloraEmptyPath``)."""
    r, ab, c, de = s["r"], s["config_A_B"], s["config_C"], s["config_D_E"]
    i, o = layer.in_features, layer.out_features
    bias = layer.has_bias
    return [*_path("glora_A", ab, o, i, r), *_path("glora_B", ab, o, i, r),
            *_path("glora_C", c if bias else "none", i, 1, r),
            *_path("glora_D", de if bias else "none", o, 0, r, column=False),
            *_path("glora_E", de if bias else "none", o, 0, r, column=False)]


TUNER = Tuner(
    peft_type="GLORA", method="glora", prefix="glora_", source="peft/tuners/glora/layer.py:GloraLayer.update_layer",
    targets=defaults.LORA, kinds=frozenset({"linear"}), bias=True,  # _create_new_module: a plain nn.Linear only
    keys=keys(
        r=sized("int", 8, "rank of the paths set to lora"),
        target_modules=TARGETS, bias=bias_key("glora_"), modules_to_save=MODULES_TO_SAVE,
        config_A_B=sized("str", "lora", "A and B: low rank, a column, a scalar or an (out, in) zeros buffer",
                         choices=("lora", "vector", "constant", "none")),
        config_C=sized("str", "lora", "C (with a base bias): low rank, a column or a zeros buffer",
                       choices=("lora", "vector", "none")),
        config_D_E=sized("str", "constant", "D and E (with a base bias): a vector, a scalar or a zeros buffer",
                         choices=("vector", "constant", "none")),
        init_weights=INIT,
    ),
    tensors=glora_tensors,
)
