"""TinyLoRA: the base weight's truncated SVD kept as frozen buffers (``B @ R @ A``) with ``R = sum_i v[i] P[i]``,
``P`` fixed random ``(u, r, r)`` per layer and ``v`` a trained ``(u,)`` vector, one per group of layers
(``weight_tying``), held by the model (peft 0.21.2 ``tuners/tinylora/``: ``TinyLoraLayer.update_layer``,
``_init_svd``, ``_init_projection``; ``TinyLoraModel._create_and_replace``)."""

from __future__ import annotations

from collections.abc import Sequence

from memfit.core.peft.inject import AdapterTensor
from memfit.core.peft.modules import ADAPTER_NAME
from memfit.core.peft.targets import Layer
from memfit.core.peft.tuners import defaults
from memfit.core.peft.tuners.base import (
    FAN_IN_FAN_OUT,
    INIT,
    LAYERS,
    LAYERS_PATTERN,
    MODULES_TO_SAVE,
    TARGETS,
    Settings,
    Tuner,
    bias_key,
    free,
    keys,
    require,
    sized,
)


def groups(targets: int, weight_tying: float) -> int:
    """``num_groups = max(1, round(N * (1 - weight_tying)))`` (``TinyLoraModel._create_and_replace``; Python's
    ``round``, halves to even): the trained ``v`` vectors, every group used (``group_size = N // num_groups``)."""
    return max(1, round(targets * (1.0 - weight_tying)))


def _check(layer: Layer, s: Settings) -> None:
    require(layer.kind != "embedding", f"TINYLORA on the Embedding {layer.module!r} is not modelled by memfit "
            "(peft's tuners/tinylora/layer.py:Embedding; its saved tensors are not planned)")
    require(s["r"] > 0, f"`r` should be a positive integer value but the value passed is {s['r']}")
    require(s["u"] > 0, f"`u` should be a positive integer value but the value passed is {s['u']}")
    w = s["weight_tying"]
    require(0.0 <= w <= 1.0, f"`weight_tying` should be a float between 0.0 and 1.0 but the value passed is {w}")


def tinylora_tensors(layer: Layer, s: Settings, layers: Sequence[Layer]) -> list[AdapterTensor]:
    """The model-level ``tinylora_v`` ``ParameterDict`` of ``groups`` ``(u,)`` vectors
    (``nn.Parameter(torch.empty(config.u))``) is an attribute of every layer (``update_layer``:
    ``self.tinylora_v = tinylora_v``), so ``named_parameters()`` names it under the first target; per layer the
    buffers ``tinylora_A (r', in)`` and ``tinylora_B (out, r')`` (``_init_svd``: ``r' = min(r, in, out)``;
    persistent; made in the base weight's dtype, then fp32: ``cast_adapter_dtype`` upcasts a 16-bit
    ``BufferDict`` entry with the adapters) and ``tinylora_P (u, r', r')`` fp32 (``_init_projection``:
    ``torch.normal(...)``; persistent iff ``save_projection``)."""
    r = min(s["r"], layer.in_features, layer.out_features)
    u = s["u"]
    at = f".{ADAPTER_NAME}"
    out = []
    if layer.module == layers[0].module:
        out = [AdapterTensor(f"tinylora_v{at}.{g}", (u,)) for g in range(groups(len(layers), s["weight_tying"]))]
    return out + [
        AdapterTensor("tinylora_A" + at, (r, layer.in_features), buffer="fp32"),
        AdapterTensor("tinylora_B" + at, (layer.out_features, r), buffer="fp32"),
        AdapterTensor("tinylora_P" + at, (u, r, r), buffer="fp32", persistent=bool(s["save_projection"])),
    ]


TUNER = Tuner(
    peft_type="TINYLORA", method="tinylora", prefix="tinylora_", source="peft/tuners/tinylora/model.py, layer.py",
    targets=defaults.LORA, kinds=frozenset({"linear", "conv1d", "embedding"}), bias=True,
    keys=keys(
        r=sized("int", 2, "rank of the frozen SVD factors (at most min(in, out))"),
        u=sized("int", 64, "length of each trained vector v and of each layer's random projections"),
        weight_tying=sized("float", 0.0, "share of the layers that share a v: round(N * (1 - weight_tying)) vectors"),
        projection_seed=free("int", 42, "seed of the projections"),
        save_projection=sized("bool", True, "the projections are persistent buffers (in the state dict)"),
        init_v_bound=free("float", 0.02, "bound of v's uniform init"),
        target_modules=TARGETS,
        tinylora_dropout=sized("float", 0.0, "dropout on the adapter's input: a mask per layer"),
        fan_in_fan_out=FAN_IN_FAN_OUT, bias=bias_key("tinylora_"), modules_to_save=MODULES_TO_SAVE, init_weights=INIT,
        layers_to_transform=LAYERS, layers_pattern=LAYERS_PATTERN,
    ),
    tensors=tinylora_tensors,
    check=_check,
)
