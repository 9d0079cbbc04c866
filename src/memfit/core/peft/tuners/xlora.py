"""X-LoRA, a mixture of LoRA experts (peft 0.21.2 ``tuners/xlora/``).

``XLoraConfig.adapters`` names saved LoRA adapters by folder (name -> path); ``XLoraModel.__init__``
builds an empty ``LoraModel`` (``DUMMY_TARGET_MODULES``) on the base, loads each expert into it with its
own ``LoraConfig`` under the adapter name ``str(i)`` (``_load_adapter_into_lora_model``: the expert's
``inject_adapter``), freezes every ``.lora_`` parameter unless ``use_trainable_adapters``
(``_maybe_freeze_all_adapters``) and adds a trained classifier (``classifier.py:XLoraClassifier``) that
reads the model's last hidden state and gives every adapted layer a per-token weight for each expert.
The experts' folders are read by ``memfit.core.peft.parse`` into ``PeftSpec.experts`` (their
``adapter_config.json`` only: never their weights, never code).

Names (``named_parameters()``): the base under ``base_model.lora_model.model.``, each expert's
``lora_A.<i>`` ... beside the other experts' in the layer's ``ModuleDict``s (``lora_A`` of every expert,
then ``lora_B``: ``LoraLayer`` registers them in that order), then the classifier under
``base_model.internal_xlora_classifier.layers.<k>``:

- ``xlora_depth`` 1: ``layers.0 = Linear(hidden_size, C)``;
- deeper: ``Linear(hidden_size, xlora_size)``, ``ReLU``, ``Dropout`` (when ``xlora_dropout_p > 0``), then
  ``xlora_depth - 2`` times ``Linear(xlora_size, xlora_size)``, ``ReLU``, ``Dropout``, and the last
  ``Linear(xlora_size, C)``, each Linear with a bias;

with ``C`` the experts' count, times the adapted layers' count with ``layerwise_scalings``
(``convert_layers_to_xlora`` swaps the forward of every ``lora.Linear``/``lora.Embedding``/
``lora.Conv2d``: the modules any expert adapts).
"""

from __future__ import annotations

from types import MappingProxyType

from memfit.core.model import ModelShape, ParamSpec
from memfit.core.peft.lora import LORA_KINDS, lora_layer_params, lora_rank, lora_target_layers
from memfit.core.peft.modules import ADAPTER_NAME, TASK_MODULES_TO_SAVE, layer_kind, own_params, task_type
from memfit.core.peft.spec import PeftSpec
from memfit.core.peft.tuners.base import Settings, Tuner, free, keys, only, require, sized

BASE = "base_model.lora_model.model."
"""``PeftModel.base_model`` (the ``XLoraModel``) -> ``.lora_model`` (the ``LoraModel``) -> ``.model``."""
CLASSIFIER = "base_model.internal_xlora_classifier.layers."
_ORDER = ("lora_A", "lora_B", "lora_embedding_A", "lora_embedding_B", "lora_magnitude_vector")
"""``LoraLayer.__init__``'s ``ModuleDict``/``ParameterDict`` registration order (``tuners/lora/layer.py``)."""
PEFT_DEFAULT_HIDDEN = 4096
"""``XLoraConfig.__post_init__``: no ``hidden_size`` -> 4096 (with a warning)."""


def _check_expert(i: int, name: str, e: PeftSpec) -> None:
    where = f"XLORA expert {name!r} (adapter {i})"
    require(e.method == "lora", f"{where} is a {e.method} adapter; X-LoRA's experts are LoRA adapters "
            "(XLoraModel loads each with LoraConfig.from_pretrained)")
    require(not e.use_dora, f"{where} uses DoRA: peft's X-LoRA layers raise on it ('X-LoRA currently does not "
            "support LoRA layers with DoRA', tuners/xlora/layer.py)")
    require(e.lora_bias == "none", f"{where} has bias={e.lora_bias!r}; memfit plans X-LoRA experts without "
            "trained biases only (not modelled)")
    require(not e.modules_to_save, f"{where} has modules_to_save {list(e.modules_to_save)}; memfit does not model "
            "an X-LoRA expert's modules_to_save")


def classifier_widths(s: Settings, n_experts: int, n_layers: int) -> tuple[tuple[int, int], ...]:
    """(out, in) of each of the classifier's Linears, in order (``XLoraClassifier.__init__``)."""
    classes = n_experts * n_layers if s["layerwise_scalings"] else n_experts
    depth, size, h = s["xlora_depth"], s["xlora_size"], s["hidden_size"] or PEFT_DEFAULT_HIDDEN
    if depth == 1:
        return ((classes, h),)
    return ((size, h), *[(size, size)] * (depth - 2), (classes, size))


def classifier_params(s: Settings, n_experts: int, n_layers: int) -> tuple[ParamSpec, ...]:
    """The classifier's parameters, named as ``nn.Sequential`` numbers its modules (ReLU and Dropout hold
    none but take an index)."""
    per_hidden = 3 if s["xlora_dropout_p"] > 0.0 else 2  # Linear, ReLU (, Dropout)
    out: list[ParamSpec] = []
    widths = classifier_widths(s, n_experts, n_layers)
    for k, (o, i) in enumerate(widths):
        index = k * per_hidden
        out += [ParamSpec(f"{CLASSIFIER}{index}.weight", (o, i)), ParamSpec(f"{CLASSIFIER}{index}.bias", (o,))]
    return tuple(out)


def expert_layers(shape: ModelShape, spec: PeftSpec, trainable: bool) -> dict[str, list[ParamSpec]]:
    """Module -> the experts' tensors there, in ``named_parameters()`` order (every expert's ``lora_A``,
    then every expert's ``lora_B`` ...), each expert under its adapter name ``str(i)``."""
    own = own_params(shape.params)
    by_module: dict[str, list[tuple[int, int, ParamSpec]]] = {}
    for i, e in enumerate(spec.experts):
        for module in lora_target_layers(shape, e):
            kind = layer_kind(shape.arch.model_type, module, own[module])
            assert kind in LORA_KINDS  # lora_target_layers checked it
            for p in lora_layer_params(kind, module, own[module]["weight"].shape, e, lora_rank(module, e)):
                rest = p.name[len(module) + 1:]
                tensor, _, tail = rest.partition(f".{ADAPTER_NAME}")
                by_module.setdefault(module, []).append(
                    (_ORDER.index(tensor), i, ParamSpec(f"{module}.{tensor}.{i}{tail}", p.shape, trainable)))
    return {m: [p for _, _, p in sorted(entries, key=lambda x: (x[0], x[1]))] for m, entries in by_module.items()}


def loaded_key(saved: str) -> str:
    """``_load_adapter_into_lora_model``'s rework of a saved expert key: drop leading name parts until it starts
    with ``model.`` but not ``model.model.``, then prefix ``model.``."""
    key = saved
    while not (key.startswith("model.") and not key.startswith("model.model.")):
        if "." not in key:  # peft's loop would not end; no key of a transformers model gets here
            return "model." + key
        key = key[key.find(".") + 1:]
    return "model." + key


def xlora(shape: ModelShape, spec: PeftSpec, s: Settings) -> ModelShape:
    names = [k for k, _ in (s["adapters"] or ())]
    require(bool(spec.experts), "XLORA adapters is empty: X-LoRA has no LoRA expert to scale (give adapters: "
            "{name: folder of a saved LoRA adapter})")
    assert len(names) == len(spec.experts)  # parse.py read one spec per entry
    require(names == [str(i) for i in range(len(names))], f"XLORA adapters are named {names}: peft 0.21.2 loads "
            "expert i as adapter str(i) and then activates the names given (XLoraModel.__init__), so its first "
            "forward raises KeyError unless they are named '0', '1', ... in order (tuners_utils.py:"
            "disable_adapter_layers)")
    for i, (name, e) in enumerate(zip(names, spec.experts)):
        _check_expert(i, name, e)
    h = s["hidden_size"] or PEFT_DEFAULT_HIDDEN
    require(h == shape.arch.hidden_size, f"XLORA hidden_size {h} is not the model's hidden size "
            f"{shape.arch.hidden_size}: the classifier reads the last hidden state and peft's forward fails "
            + ("(peft's default when hidden_size is absent)" if not s["hidden_size"] else ""))
    depth = s["xlora_depth"]
    require(depth >= 1, f"X-LoRA depth must be strictly positive, got {depth}")
    require(depth == 1 or s["xlora_size"] > 0, f"xlora_size must be positive, got {s['xlora_size']}")
    task = task_type(shape, spec)
    require(not TASK_MODULES_TO_SAVE.get(task), f"XLORA with task_type {task}: memfit does not model the "
            "task's modules_to_save under X-LoRA")
    layers = expert_layers(shape, spec, s["use_trainable_adapters"])
    for module in layers:
        saved = f"base_model.model.{module}.lora_A.weight"  # the key save_pretrained wrote for the expert
        require(loaded_key(saved) == f"model.{module}.lora_A.weight", f"XLORA cannot load its experts into "
                f"{shape.architecture}: peft renames the saved key {saved!r} to {loaded_key(saved)!r}, which the "
                "model does not have, and raises 'Got unexpected keys' (tuners/xlora/model.py:"
                "_load_adapter_into_lora_model: only models whose layers are under 'model.' load)")
    last_of: dict[str, int] = {}
    for k, p in enumerate(shape.params):
        module = p.name.rpartition(".")[0]
        if module in layers:
            last_of[module] = k
    out: list[ParamSpec] = []
    for k, p in enumerate(shape.params):
        module, _, leaf = p.name.rpartition(".")
        if module not in layers:
            out.append(ParamSpec(BASE + p.name, p.shape, False))
            continue
        out.append(ParamSpec(f"{BASE}{module}.base_layer.{leaf}", p.shape, False))
        if last_of[module] == k:
            out += [ParamSpec(BASE + q.name, q.shape, q.trainable) for q in layers[module]]
    out += classifier_params(s, len(spec.experts), len(layers))
    return shape.with_params(tuple(out))


TUNER = Tuner(
    peft_type="XLORA", method="xlora", prefix="internal_xlora_classifier",
    source="peft/tuners/xlora/model.py (XLoraModel.__init__, _load_adapter_into_lora_model, convert_layers_to_xlora), "
           "classifier.py (XLoraClassifier), layer.py (XLoraLinearLayer.forward)",
    build=xlora, experts="adapters", model_config=MappingProxyType({"use_cache": False}),
    note="XLORA: peft refuses a base whose config has use_cache true (XLoraModel.__init__); memfit plans it with "
         "use_cache false (no key/value cache kept), as it must be trained. The no-grad scaling pass's transient "
         "peak (every hidden state and the logits, freed before the scaled pass) is not planned. On a model built in "
         "fp32 and cast to 16 bits afterwards (DeepSpeed's cast) peft's forward raises (the classifier keeps its build "
         "dtype as an attribute, XLoraClassifier.dtype, for the scaling pass's dummy scalings): load the model in the "
         "dtype it trains in",
    keys=keys(
        hidden_size=sized("int", None, "the classifier's input width; must be the model's hidden size (peft takes "
                                       "4096 when it is absent)"),
        adapters=sized("dict", None, "the LoRA experts: name -> folder of a saved LoRA adapter (read into "
                                     "PeftSpec.experts)"),
        enable_softmax=sized("bool", True, "a softmax over the experts' logits (its output is kept for backward)"),
        enable_softmax_topk=only(False, "a softmax over each layer's top-k scalings keeps more tensors per layer; "
                                        "not modelled", "bool"),
        layerwise_scalings=sized("bool", False, "the classifier's last Linear gives experts x adapted layers "
                                                "logits instead of experts"),
        xlora_depth=sized("int", 1, "the classifier's Linear layers"),
        xlora_size=sized("int", 2048, "the classifier's hidden width (depth >= 2)"),
        xlora_dropout_p=sized("float", 0.2, "a Dropout after each hidden layer of the classifier (depth >= 2)"),
        use_trainable_adapters=sized("bool", False, "the experts train too"),
        softmax_temperature=free("float", 1.0, "divides the logits by a number (no kept tensor)"),
        top_k_lora=only(None, "top-k selection of the experts keeps indices, a mask and the masked scalings per "
                              "layer; not modelled", "int"),
        scaling_pass_value=free("float", 0.0, "the value of the scaling pass's dummy scalings (same shapes)"),
        global_scaling_weight=free("float", 1.0, "a number multiplying each expert's output"),
    ),
)
