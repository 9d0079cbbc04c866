"""The model after a tuner injected its layers: ``BaseTuner.inject_adapter`` + ``_create_and_replace``
reduced to parameter and buffer names, shapes and trainability.

Every layer-injecting tuner (LoRA and its relatives, IA3, the LyCORIS family, OFT/BOFT, VeRA ...) wraps
each target module in a ``BaseTunerLayer`` that holds the original as ``base_layer`` (its params
become ``<module>.base_layer.<leaf>``) and registers its own ``ParameterDict``/``ModuleDict``/
``BufferDict`` entries after it, keyed by the adapter name. Then ``_mark_only_adapters_as_trainable``
(peft 0.21.2 ``tuners/tuners_utils.py``) freezes every parameter outside the tuner layers' adapter
entries (found structurally, not by name; adapter entries keep their own ``requires_grad``) and
applies ``bias``: ``all`` trains every parameter named ``bias`` or ``*.bias``, ``<prefix>only`` the
biases of the adapted layers; finally ``modules_to_save`` wrap their modules
(frozen ``.original_module.``, trainable ``.modules_to_save.default.``). The whole model is named
under ``base_model.model.`` (``PeftModel`` -> ``<Tuner>Model`` -> the transformers model).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from memfit.core.lean_dataclass import dataclass
from memfit.core.model import BufferSpec, ModelShape, ParamSpec
from memfit.core.peft.modules import (
    TASK_MODULES_TO_SAVE,
    flatten,
    module_names,
    modules_to_save,
    task_type,
    under_any,
    with_modules_to_save,
)
from memfit.core.peft.spec import PeftSpec
from memfit.core.peft.targets import Layer
from memfit.errors import MemfitError

ROOT = "base_model.model."
"""``PeftModel.base_model`` (the tuner's model) -> ``.model`` (the transformers model)."""


@dataclass(frozen=True, slots=True)
class AdapterTensor:
    """One tensor a tuner adds to an adapted layer, named ``<module>.<suffix>``."""

    suffix: str
    """e.g. ``hada_w1_a.default`` or ``lora_A.default.weight``."""
    shape: tuple[int, ...]
    trainable: bool = True
    """A parameter's ``requires_grad`` after ``_mark_only_adapters_as_trainable``."""
    buffer: str | None = None
    """A buffer's dtype (``fp32``, ``int64`` ...); ``None``: a parameter."""
    persistent: bool = True
    follows_weight: bool = False
    """Buffers only: created in the base weight's dtype (``BufferSpec.follows_load_dtype``)."""
    shared: str = ""
    """One tensor for the whole model under this key (VeRA's projections, VB-LoRA's vector bank),
    named where ``named_parameters()``/``named_buffers()`` meets it first."""


LayerTensors = Callable[[Layer], Sequence[AdapterTensor]]


def inject(
    shape: ModelShape,
    spec: PeftSpec,
    layers: Sequence[Layer],
    tensors: LayerTensors,
    *,
    what: str,
    bias: str = "none",
    root: str = ROOT,
) -> ModelShape:
    """``shape`` with ``layers`` wrapped as the tuner wraps them (see module doc).

    ``tensors(layer)`` lists the tensors the tuner adds to one layer, in registration order;
    ``bias`` is the config's ``bias`` (``none``, ``all`` or ``<prefix>only``).
    """
    targets = {layer.module: layer for layer in layers}
    wrapped = checked_modules_to_save(shape, spec, targets, what)
    last_of: dict[str, int] = {}
    for i, p in enumerate(shape.params):
        module = p.name.rpartition(".")[0]
        if module in targets:
            last_of[module] = i
    only_bias = bias.endswith("_only")
    paired: list[tuple[ParamSpec, list[ParamSpec]]] = []
    buffers: list[BufferSpec] = []
    shared: set[str] = set()
    for i, p in enumerate(shape.params):
        module, _, leaf = p.name.rpartition(".")
        if module in targets:
            name = f"{module}.base_layer.{leaf}"
            trains = leaf == "bias" and (bias == "all" or only_bias)
            extra: list[ParamSpec] = []
            if last_of[module] == i:
                for t in tensors(targets[module]):
                    full = f"{module}.{t.suffix}"
                    if t.shared:
                        if t.shared in shared:
                            continue
                        shared.add(t.shared)
                    if t.buffer is None:
                        extra.append(ParamSpec(full, t.shape, t.trainable))
                    else:
                        buffers.append(BufferSpec(root + full, t.shape, t.buffer, t.persistent, t.follows_weight))
            paired.append((ParamSpec(name, p.shape, trains), extra))
        else:
            trains = bias == "all" and leaf == "bias"
            paired.append((ParamSpec(p.name, p.shape, trains), []))
    params = flatten(with_modules_to_save(paired, wrapped), root)
    return shape.with_params(params).with_buffers((*shape.buffers, *buffers))


def checked_modules_to_save(shape: ModelShape, spec: PeftSpec, targets: Sequence[str] | dict, what: str) -> list[str]:
    """The modules ``modules_to_save`` wraps (the config's and the task's, ``TASK_MODULES_TO_SAVE``); one that
    overlaps a target of tuner ``what`` is refused in one line."""
    user_saved = spec.modules_to_save
    wrapped = modules_to_save(module_names(shape.params),
                              (*user_saved, *TASK_MODULES_TO_SAVE.get(task_type(shape, spec), ())), required=user_saved)
    for module in wrapped:
        inside = [t for t in targets if under_any(t, [module]) or under_any(module, [t])]
        if inside:
            raise MemfitError(f"modules_to_save {module!r} overlaps {what} target {inside[0]!r}; memfit does not "
                              "model that")
    return wrapped
