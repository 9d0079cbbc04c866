"""Every peft tuner memfit plans besides LoRA and prompt/prefix tuning, one module per tuner (or per
family), each declaring a ``Tuner`` (``base.py``): its adapter_config.json keys, default targets and
the tensors it adds. ``apply_tuner`` builds the model as peft builds it.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from memfit.core.model import ModelShape
from memfit.core.peft.inject import inject
from memfit.core.peft.spec import PeftSpec
from memfit.core.peft.targets import find_targets
from memfit.core.peft.tuners.base import Tuner
from memfit.core.peft.tuners import (adalora, adamss, adaption_prompt, beft, c3a, deft, delora, fourier, frod, glora,
                                     gralora, hira, ia3, lily, ln_tuning, lycoris, miss, orthogonal, osf, peanut, poly,
                                     prompts, psoft, randlora, road, shira, supertuning, tinylora, trainable_tokens,
                                     unilora, vblora, vera)

_ALL: tuple[Tuner, ...] = (
    ia3.TUNER,
    adalora.TUNER,
    lycoris.LOHA,
    lycoris.LOKR,
    orthogonal.OFT,
    orthogonal.BOFT,
    orthogonal.HRA,
    vera.TUNER,
    fourier.FOURIERFT,
    miss.TUNER,
    vblora.TUNER,
    ln_tuning.TUNER,
    prompts.P_TUNING,
    prompts.MULTITASK_PROMPT_TUNING,
    prompts.CPT,
    prompts.CARTRIDGE,
    adaption_prompt.TUNER,
    osf.TUNER,
    fourier.WAVEFT,
    trainable_tokens.TUNER,
    road.TUNER,
    c3a.TUNER,
    shira.TUNER,
    delora.TUNER,
    gralora.TUNER,
    randlora.TUNER,
    beft.TUNER,
    peanut.TUNER,
    lily.TUNER,
    glora.TUNER,
    deft.TUNER,
    frod.TUNER,
    hira.TUNER,
    vera.PVERA,
    tinylora.TUNER,
    unilora.TUNER,
    supertuning.TUNER,
    psoft.TUNER,
    poly.TUNER,
    adamss.TUNER,
)

TUNERS: Mapping[str, Tuner] = MappingProxyType({t.method: t for t in _ALL})
"""memfit method name -> tuner."""
BY_PEFT_TYPE: Mapping[str, Tuner] = MappingProxyType({t.peft_type: t for t in _ALL})
"""peft ``PeftType`` value -> tuner."""


def apply_tuner(shape: ModelShape, spec: PeftSpec) -> ModelShape:
    """``shape`` as ``get_peft_model`` builds it with ``spec``'s tuner."""
    tuner = TUNERS[spec.method]
    s = tuner.settings(spec, shape.arch.model_type)
    if tuner.build is not None:
        return tuner.build(shape, spec, s)
    assert tuner.tensors is not None  # a tuner declares tensors or build
    layers = find_targets(shape, spec, what=tuner.peft_type, defaults=tuner.targets, kinds=tuner.kinds)
    if tuner.check is not None:
        for layer in layers:
            tuner.check(layer, s)
    tensors = tuner.tensors
    bias = s.get("bias", "none") if tuner.bias else "none"
    return inject(shape, spec, layers, lambda layer: tensors(layer, s, layers), what=tuner.peft_type, bias=bias)
