"""FourierFT: a trained spectrum of ``n_frequency`` coefficients per layer at fixed random locations,
turned into the full delta weight by an inverse 2-D FFT in every forward (peft 0.21
``tuners/fourierft/layer.py``: ``FourierFTLayer.update_layer``, ``get_delta_weight``)."""

from __future__ import annotations

from collections.abc import Sequence

from memfit.core.peft.inject import AdapterTensor
from memfit.core.peft.modules import ADAPTER_NAME
from memfit.core.peft.targets import Layer
from memfit.core.peft.tuners import defaults
from memfit.core.peft.tuners.base import (EXCLUDE, FAN_IN_FAN_OUT, LAYERS, LAYERS_PATTERN, MODULES_TO_SAVE, TARGETS,
                                          Settings, Tuner, bias_key, free, keys, only, require, sized)
from memfit.core.peft.tuners.lycoris import pattern_value


def frequencies(layer: Layer, s: Settings) -> int:
    n = pattern_value(layer.module, s["n_frequency_pattern"], s["n_frequency"])
    require(n > 0, f"`n_frequency` should be a positive integer value but the value passed is {n}")
    require(n <= layer.in_features * layer.out_features,
            f"`n_frequency` should be less than or equal to the product of the input and output dimensions but the "
            f"value passed is {n} and the product is {layer.in_features * layer.out_features} ({layer.module})")
    return n


def fourierft_tensors(layer: Layer, s: Settings, layers: Sequence[Layer]) -> list[AdapterTensor]:
    """``fourierft_spectrum (n_frequency,)`` (its int64 ``indices`` live in a plain dict attribute, not a
    buffer: (2, n_frequency) per layer, moved to the device in every forward)."""
    return [AdapterTensor(f"fourierft_spectrum.{ADAPTER_NAME}", (frequencies(layer, s),))]


FOURIERFT = Tuner(
    peft_type="FOURIERFT", method="fourierft", prefix="fourierft_",
    source="peft/tuners/fourierft/layer.py:FourierFTLayer.update_layer", targets=defaults.FOURIERFT, bias=True,
    keys=keys(
        n_frequency=sized("int", 1000, "spectral coefficients trained per layer"),
        scaling=free("float", 150.0, "scales the delta only"),
        random_loc_seed=free("int", 777, "seed of the frequency locations"),
        fan_in_fan_out=FAN_IN_FAN_OUT, target_modules=TARGETS, exclude_modules=EXCLUDE, bias=bias_key("fourier_"),
        modules_to_save=MODULES_TO_SAVE, layers_to_transform=LAYERS, layers_pattern=LAYERS_PATTERN,
        n_frequency_pattern=sized("dict", {}, "per-module n_frequency"),
        init_weights=free("bool", False, "zeros or random: same shapes"),
    ),
    tensors=fourierft_tensors,
)


def waveft_tensors(layer: Layer, s: Settings, layers: Sequence[Layer]) -> list[AdapterTensor]:
    """``waveft_spectrum (n_frequency,)`` (its int64 ``waveft_indices`` in a plain dict, as FourierFT's);
    ``tuners/waveft/layer.py:WaveFTLayer.update_layer``."""
    n = pattern_value(layer.module, s["n_frequency_pattern"], s["n_frequency"])
    require(n > 0, f"`n_frequency` should be a positive integer value but the value passed is {n}")
    require(n <= layer.in_features * layer.out_features,
            f"`n_frequency` ({n}) must be at most in x out ({layer.in_features * layer.out_features}) ({layer.module})")
    return [AdapterTensor(f"waveft_spectrum.{ADAPTER_NAME}", (n,))]


WAVEFT = Tuner(
    peft_type="WAVEFT", method="waveft", prefix="waveft_", source="peft/tuners/waveft/model.py, layer.py",
    targets=defaults.WAVEFT, bias=True,
    keys=keys(
        n_frequency=sized("int", 2592, "wavelet coefficients trained per layer"),
        scaling=free("float", 25.0, "scales the delta only"),
        wavelet_family=sized("str", "db1", "the wavelet of the inverse transform (its padding of the delta)"),
        use_idwt=sized("bool", True, "rebuild the delta by an inverse wavelet transform (else the sparse matrix itself)"),
        random_loc_seed=free("int", 777, "seed of the coefficient locations"),
        fan_in_fan_out=FAN_IN_FAN_OUT, target_modules=TARGETS, exclude_modules=EXCLUDE, bias=bias_key("waveft_"),
        modules_to_save=MODULES_TO_SAVE, layers_to_transform=LAYERS, layers_pattern=LAYERS_PATTERN,
        n_frequency_pattern=sized("dict", {}, "per-module n_frequency"),
        proportional_parameters=only(False, "n_frequency spread over layers in proportion to their size"),
        init_weights=free("bool", True, "zeros or random: same shapes"),
    ),
    tensors=waveft_tensors,
)
