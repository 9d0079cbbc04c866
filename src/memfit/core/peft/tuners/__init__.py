"""Every peft tuner memfit plans besides LoRA and prompt/prefix tuning, one module per tuner (or per
family), each declaring a ``Tuner`` (``base.py``): its adapter_config.json keys, default targets and
the tensors it adds. ``apply_tuner`` builds the model as peft builds it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from importlib import import_module

from memfit.core.model import ModelShape
from memfit.core.peft.inject import inject
from memfit.core.peft.spec import PeftSpec
from memfit.core.peft.targets import find_targets
from memfit.core.peft.tuners.base import Tuner

_WHERE: tuple[tuple[str, str, str, str, str], ...] = (
    ("ia3", "IA3", "ia3_", "ia3", "TUNER"),
    ("adalora", "ADALORA", "lora_", "adalora", "TUNER"),
    ("loha", "LOHA", "hada_", "lycoris", "LOHA"),
    ("lokr", "LOKR", "lokr_", "lycoris", "LOKR"),
    ("oft", "OFT", "oft_", "orthogonal", "OFT"),
    ("boft", "BOFT", "boft_", "orthogonal", "BOFT"),
    ("hra", "HRA", "hra_", "orthogonal", "HRA"),
    ("vera", "VERA", "vera_lambda_", "vera", "TUNER"),
    ("fourierft", "FOURIERFT", "fourierft_", "fourier", "FOURIERFT"),
    ("miss", "MISS", "miss_", "miss", "TUNER"),
    ("vblora", "VBLORA", "vblora_", "vblora", "TUNER"),
    ("ln_tuning", "LN_TUNING", "ln_tuning_", "ln_tuning", "TUNER"),
    ("p_tuning", "P_TUNING", "", "prompts", "P_TUNING"),
    ("multitask_prompt_tuning", "MULTITASK_PROMPT_TUNING", "", "prompts", "MULTITASK_PROMPT_TUNING"),
    ("cpt", "CPT", "", "prompts", "CPT"),
    ("cartridge", "CARTRIDGE", "", "prompts", "CARTRIDGE"),
    ("adaption_prompt", "ADAPTION_PROMPT", "adaption_", "adaption_prompt", "TUNER"),
    ("osf", "OSF", "osf_", "osf", "TUNER"),
    ("waveft", "WAVEFT", "waveft_", "fourier", "WAVEFT"),
    ("trainable_tokens", "TRAINABLE_TOKENS", "trainable_tokens_", "trainable_tokens", "TUNER"),
    ("road", "ROAD", "road_", "road", "TUNER"),
    ("c3a", "C3A", "c3a_", "c3a", "TUNER"),
    ("shira", "SHIRA", "shira_", "shira", "TUNER"),
    ("delora", "DELORA", "delora_", "delora", "TUNER"),
    ("gralora", "GRALORA", "gralora_", "gralora", "TUNER"),
    ("randlora", "RANDLORA", "randlora_", "randlora", "TUNER"),
    ("beft", "BEFT", "beft_", "beft", "TUNER"),
    ("peanut", "PEANUT", "peanut_", "peanut", "TUNER"),
    ("lily", "LILY", "lily_", "lily", "TUNER"),
    ("glora", "GLORA", "glora_", "glora", "TUNER"),
    ("deft", "DEFT", "deft_", "deft", "TUNER"),
    ("frod", "FROD", "frod_", "frod", "TUNER"),
    ("hira", "HIRA", "hira_", "hira", "TUNER"),
    ("pvera", "PVERA", "pvera_lambda_", "vera", "PVERA"),
    ("tinylora", "TINYLORA", "tinylora_", "tinylora", "TUNER"),
    ("unilora", "UNILORA", "unilora_", "unilora", "TUNER"),
    ("supertuning", "SUPERTUNING", "supertuning_", "supertuning", "TUNER"),
    ("psoft", "PSOFT", "psoft_", "psoft", "TUNER"),
    ("poly", "POLY", "poly_", "poly", "TUNER"),
    ("adamss", "ADAMSS", "adamss_", "adamss", "TUNER"),
    ("xlora", "XLORA", "internal_xlora_classifier", "xlora", "TUNER"),
    ("shadow", "SHADOW", "shadow_", "shadow", "TUNER"),
)
"""Every tuner, in the order ``TUNERS`` lists them: its memfit method name, its peft ``PeftType`` value,
its ``prefix`` (``Tuner.prefix``: the name part of the parameters it adds, "" for none), its module under ``memfit.core.peft.tuners`` and the module's name for its ``Tuner``. Only the module of
a tuner that is looked up is imported (a plan imports its own method's, not 30 others';
``tests/core/test_tuner_registry.py`` holds this table to the modules' declarations)."""


class _Tuners(Mapping):
    """A name -> ``Tuner`` mapping over ``_WHERE`` that imports a tuner's module on its first lookup;
    its names, their order and membership need no import."""

    __slots__ = ("_where",)

    def __init__(self, where: dict[str, tuple[str, str]]) -> None:
        self._where = where

    def __getitem__(self, name: str) -> Tuner:
        module, attribute = self._where[name]
        return getattr(import_module(f"{__name__}.{module}"), attribute)

    def __contains__(self, name: object) -> bool:
        return name in self._where

    def __iter__(self) -> Iterator[str]:
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)


TUNERS: Mapping[str, Tuner] = _Tuners({method: (module, attr) for method, _, _, module, attr in _WHERE})
"""memfit method name -> tuner."""
BY_PEFT_TYPE: Mapping[str, Tuner] = _Tuners({peft_type: (module, attr) for _, peft_type, _, module, attr in _WHERE})
"""peft ``PeftType`` value -> tuner."""
PREFIXES: tuple[str, ...] = tuple(dict.fromkeys(prefix for _, _, prefix, _, _ in _WHERE if prefix))
"""Every tuner's ``prefix`` (once each, in ``_WHERE``'s order): ``memfit.core.peft.adapter_params``' markers."""


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
