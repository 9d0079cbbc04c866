"""Orthogonal fine-tuning in peft: OFT (block-diagonal rotations of each adapted layer's input), BOFT
(butterfly products of such blocks) and HRA (a chain of Householder reflections), peft 0.21
``tuners/oft/layer.py`` (``OFTLayer.update_layer``, ``OFTRotationModule``), ``tuners/boft/layer.py``
(``BOFTLayer.update_layer``) and ``tuners/hra/layer.py`` (``HRALayer.update_layer``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from memfit.core.peft.inject import AdapterTensor
from memfit.core.peft.modules import ADAPTER_NAME
from memfit.core.peft.targets import Layer
from memfit.core.peft.tuners import defaults
from memfit.core.peft.tuners.base import (EXCLUDE, FAN_IN_FAN_OUT, INIT, LAYERS, LAYERS_PATTERN, MODULES_TO_SAVE,
                                          TARGETS, Settings, Tuner, bias_key, free, keys, note, require, sized)


def adjust_oft_parameters(in_features: int, params: int) -> int:
    """``OFTLayer.adjust_oft_parameters``: the divisor of ``in_features`` nearest to ``params``."""
    if params >= in_features:
        return in_features
    higher = params
    while higher <= in_features and in_features % higher != 0:
        higher += 1
    lower = params
    while lower > 1 and in_features % lower != 0:
        lower -= 1
    return lower if params - lower <= higher - params else higher


def oft_blocks(layer: Layer, s: Settings) -> tuple[int, int]:
    """(number of blocks r, block size) as ``OFTLayer.update_layer`` resolves them."""
    r, size = s["r"], s["oft_block_size"]
    n = layer.in_features
    if r == 0 and size != 0:
        if n % size != 0 or size > n:
            size = adjust_oft_parameters(n, size)
        return n // size, size
    if r != 0 and size == 0:
        if n % r != 0 or r > n:
            r = adjust_oft_parameters(n, r)
        return r, n // r
    raise_message = (f"OFT: give exactly one of r and oft_block_size (got r={r}, oft_block_size={size}); "
                     "OFTLayer.update_layer raises otherwise")
    require(False, raise_message)
    raise AssertionError  # unreachable


def oft_tensors(layer: Layer, s: Settings, layers: Sequence[Layer]) -> list[AdapterTensor]:
    """``OFTRotationModule``: ``weight (r, b(b-1)/2)`` (one row when ``block_share``) and the non-persistent
    int64 ``rows``/``cols`` of ``torch.triu_indices(b, b, 1)``."""
    r, b = oft_blocks(layer, s)
    n = b * (b - 1) // 2
    at = f"oft_R.{ADAPTER_NAME}."
    return [AdapterTensor(at + "weight", (1 if s["block_share"] else r, n)),
            AdapterTensor(at + "rows", (n,), buffer="int64", persistent=False),
            AdapterTensor(at + "cols", (n,), buffer="int64", persistent=False)]


def boft_blocks(layer: Layer, s: Settings) -> tuple[int, int, int]:
    """(butterfly factors, block count, block size) as ``BOFTLayer.update_layer`` resolves them (with
    the fbd_cuda extension: without it peft forces one factor; see ``BOFT``'s note)."""
    factor = s["boft_n_butterfly_factor"] - 1
    require(factor >= 0, f"You can only specify boft_n_butterfly_factor {factor + 1} to be a positive integer number.")
    size, num = s["boft_block_size"], s["boft_block_num"]
    n = layer.in_features
    if size == 0 and num != 0:
        require(n % num == 0, f"in_features ({n}) must be divisible by boft_block_num ({num}) ({layer.module})")
        if factor:
            require(factor <= int(math.log2(num)) and num % (2 ** factor) == 0,
                    f"invalid boft_n_butterfly_factor for boft_block_num {num} ({layer.module})")
        size = n // num
    elif size != 0 and num == 0:
        require(n % size == 0, f"in_features ({n}) must be divisible by boft_block_size ({size}) ({layer.module})")
        if factor:
            require(n >= size * 2 ** factor and n % (size * 2 ** factor) == 0,
                    f"invalid boft_n_butterfly_factor for boft_block_size {size} ({layer.module})")
        num = n // size
    else:
        require(False, "BOFT: give exactly one of boft_block_size and boft_block_num (BOFTLayer.update_layer raises)")
    if factor:
        require(num % 2 == 0 and size % 2 == 0, f"boft_block_num ({num}) and boft_block_size ({size}) must be even")
        for i in range(factor + 1):  # block_butterfly_perm: b * r * 2 <= n
            require((num // 2 ** i) * (size // 2) * 2 <= n, "Invalid number of blocks!")
    return factor + 1, num, size


def boft_tensors(layer: Layer, s: Settings, layers: Sequence[Layer]) -> list[AdapterTensor]:
    """``boft_R (factors, blocks, size, size)``, ``boft_s (out, 1)`` and the non-persistent fp32
    permutation matrices ``boft_P (factors, in, in)`` (``register_buffer`` on the layer)."""
    f, num, size = boft_blocks(layer, s)
    return [AdapterTensor(f"boft_R.{ADAPTER_NAME}", (f, num, size, size)),
            AdapterTensor(f"boft_s.{ADAPTER_NAME}", (layer.out_features, 1)),
            AdapterTensor("boft_P", (f, layer.in_features, layer.in_features), buffer="fp32", persistent=False)]


def hra_tensors(layer: Layer, s: Settings, layers: Sequence[Layer]) -> list[AdapterTensor]:
    """``hra_u (in, r)``."""
    r = s["r"]
    require(r > 0, f"`r` should be a positive integer value but the value passed is {r}")
    return [AdapterTensor(f"hra_u.{ADAPTER_NAME}", (layer.in_features, r))]


_DROPOUT = "drops whole rotation blocks (MultiplicativeDropoutLayer: a block mask per forward)"

OFT = Tuner(
    peft_type="OFT", method="oft", prefix="oft_", source="peft/tuners/oft/layer.py:OFTLayer.update_layer",
    targets=defaults.LORA, bias=True,
    keys=keys(
        r=sized("int", 0, "number of rotation blocks (0: from oft_block_size)"),
        oft_block_size=sized("int", 32, "rotation block size (0: from r)"),
        module_dropout=sized("float", 0.0, _DROPOUT),
        target_modules=TARGETS, fan_in_fan_out=FAN_IN_FAN_OUT, bias=bias_key("oft_"), exclude_modules=EXCLUDE,
        init_weights=INIT, layers_to_transform=LAYERS, layers_pattern=LAYERS_PATTERN, modules_to_save=MODULES_TO_SAVE,
        coft=free("bool", False, "projects the rotation in place under no_grad"),
        eps=free("float", 6e-05, "COFT's radius"),
        block_share=sized("bool", False, "one rotation block shared by all blocks: weight (1, n)"),
        use_cayley_neumann=sized("bool", True, "the rotation by a Neumann series (else a linalg.solve)"),
        num_cayley_neumann_terms=sized("int", 5, "terms of the Neumann series (matrix powers kept for backward)"),
    ),
    tensors=oft_tensors,
)

BOFT = Tuner(
    peft_type="BOFT", method="boft", prefix="boft_", source="peft/tuners/boft/layer.py:BOFTLayer.update_layer",
    targets=defaults.LORA, bias=True,
    keys=keys(
        boft_block_size=sized("int", 4, "butterfly block size (0: from boft_block_num)"),
        boft_block_num=sized("int", 0, "butterfly blocks (0: from boft_block_size)"),
        boft_n_butterfly_factor=note("int", 1, "butterfly factors: peft uses them only where its fbd_cuda extension "
                                     "builds (nvcc at hand); elsewhere it silently takes 1 (BOFTLayer.update_layer). "
                                     "memfit plans the value given"),
        target_modules=TARGETS, exclude_modules=EXCLUDE,
        boft_dropout=sized("float", 0.0, _DROPOUT),
        fan_in_fan_out=FAN_IN_FAN_OUT, bias=bias_key("boft_"), modules_to_save=MODULES_TO_SAVE, init_weights=INIT,
        layers_to_transform=LAYERS, layers_pattern=LAYERS_PATTERN,
    ),
    tensors=boft_tensors,
)

HRA = Tuner(
    peft_type="HRA", method="hra", prefix="hra_", source="peft/tuners/hra/layer.py:HRALayer.update_layer",
    targets=defaults.LORA, bias=True,
    keys=keys(
        r=sized("int", 8, "Householder reflections per layer: hra_u (in, r)"),
        apply_GS=sized("bool", False, "Gram-Schmidt orthogonalization of the reflections in every forward"),
        target_modules=TARGETS, exclude_modules=EXCLUDE, init_weights=INIT, layers_to_transform=LAYERS,
        layers_pattern=LAYERS_PATTERN, bias=bias_key("hra_"), modules_to_save=MODULES_TO_SAVE,
    ),
    tensors=hra_tensors,
)
