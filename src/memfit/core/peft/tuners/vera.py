"""VeRA: frozen random projections shared by every adapted layer, and two trained scaling vectors per
layer (peft 0.21 ``tuners/vera/``: ``VeraModel._find_dim`` / ``_init_vera_A_vera_B``,
``VeraLayer.update_layer``); and PVeRA, its probabilistic variant (``tuners/pvera/``): the down
projection and ``lambda_d`` twice as tall, a mean and a log-variance sampled from in training."""

from __future__ import annotations

from collections.abc import Sequence

from memfit.core.peft.inject import AdapterTensor
from memfit.core.peft.modules import ADAPTER_NAME
from memfit.core.peft.targets import Layer
from memfit.core.peft.tuners import defaults
from memfit.core.peft.tuners.base import (FAN_IN_FAN_OUT, INIT, LAYERS, LAYERS_PATTERN, MODULES_TO_SAVE, TARGETS,
                                          Settings, Tuner, bias_key, free, keys, require, sized)


def vera_tensors(layer: Layer, s: Settings, layers: Sequence[Layer]) -> list[AdapterTensor]:
    """``vera_lambda_b (out,)``, ``vera_lambda_d (r,)``; the shared fp32 ``vera_A (r, max in)`` and
    ``vera_B (max out, r)`` over every target (persistent iff ``save_projection``)."""
    return _projection_tensors("vera", 1, layer, s, layers)


def _projection_tensors(prefix: str, down: int, layer: Layer, s: Settings,
                        layers: Sequence[Layer]) -> list[AdapterTensor]:
    """VeRA's and PVeRA's tensors: per layer ``<prefix>_lambda_b (out,)`` and ``<prefix>_lambda_d (down r,)``;
    the shared fp32 ``<prefix>_A (down r, max in)`` and ``<prefix>_B (max out, r)`` over every target
    (persistent iff ``save_projection``)."""
    r = s["r"]
    require(r > 0, f"`r` should be a positive integer value but the value passed is {r}")
    max_in = max(t.in_features for t in layers)
    max_out = max(t.out_features for t in layers)
    keep = bool(s["save_projection"])
    at = f".{ADAPTER_NAME}"
    return [AdapterTensor(f"{prefix}_lambda_b" + at, (layer.out_features,)),
            AdapterTensor(f"{prefix}_lambda_d" + at, (down * r,)),
            AdapterTensor(f"{prefix}_A" + at, (down * r, max_in), buffer="fp32", persistent=keep, shared=f"{prefix}_A"),
            AdapterTensor(f"{prefix}_B" + at, (max_out, r), buffer="fp32", persistent=keep, shared=f"{prefix}_B")]


TUNER = Tuner(
    peft_type="VERA", method="vera", prefix="vera_lambda_", source="peft/tuners/vera/model.py, layer.py",
    targets=defaults.VERA, bias=True,
    keys=keys(
        r=sized("int", 256, "rank of the shared projections"),
        target_modules=TARGETS,
        projection_prng_key=free("int", 0, "seed of the projections"),
        save_projection=sized("bool", True, "the projections are persistent buffers (in the state dict)"),
        vera_dropout=sized("float", 0.0, "dropout on the adapter's input: a mask and a copy per layer"),
        d_initial=free("float", 0.1, "initial value of lambda_d"),
        fan_in_fan_out=FAN_IN_FAN_OUT, bias=bias_key("vera_"), modules_to_save=MODULES_TO_SAVE, init_weights=INIT,
        layers_to_transform=LAYERS, layers_pattern=LAYERS_PATTERN,
    ),
    tensors=vera_tensors,
)


def pvera_tensors(layer: Layer, s: Settings, layers: Sequence[Layer]) -> list[AdapterTensor]:
    """``pvera_lambda_b (out,)`` (``torch.ones(self.out_features)``), ``pvera_lambda_d (2r,)``
    (``torch.randn(r * 2)``): peft 0.21.2 ``tuners/pvera/layer.py:PveraLayer.update_layer``; the shared fp32
    ``pvera_A (2r, max in)`` and ``pvera_B (max out, r)`` over every target (``model.py:PveraModel._find_dim``,
    ``_init_pvera_A_pvera_B``: ``torch.empty(config.r * 2, linear_in_dim)``, ``torch.empty(linear_out_dim,
    config.r)``; ``BufferDict(persistent=config.save_projection)``)."""
    return _projection_tensors("pvera", 2, layer, s, layers)


PVERA = Tuner(
    peft_type="PVERA", method="pvera", prefix="pvera_lambda_", source="peft/tuners/pvera/model.py, layer.py",
    targets=defaults.PVERA, bias=True,
    keys=keys(
        r=sized("int", 256, "rank of the shared projections (the down projection is 2r tall: mean and log-variance)"),
        target_modules=TARGETS,
        projection_prng_key=free("int", 0, "seed of the projections"),
        save_projection=sized("bool", True, "the projections are persistent buffers (in the state dict)"),
        pvera_dropout=sized("float", 0.0, "dropout on the adapter's input: a mask per layer"),
        d_initial=free("float", 0.1, "initial value of lambda_d"),
        fan_in_fan_out=FAN_IN_FAN_OUT, bias=bias_key("pvera_"), modules_to_save=MODULES_TO_SAVE, init_weights=INIT,
        layers_to_transform=LAYERS, layers_pattern=LAYERS_PATTERN,
        sample_at_inference=free("bool", False, "sampling outside training; training always samples (_reparametrize)"),
        generator_seed=free("int", None, "seed of the sampling noise (drawn on the CPU, then moved: same size)",
                            nullable=True),
    ),
    tensors=pvera_tensors,
)
