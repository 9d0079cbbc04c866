"""The model as a non-DeepSpeed training loop holds it: every parameter with its dtype after load,
quantization, ``prepare_model_for_kbit_training`` and the precision mode, its place in the forward
order (the layer it belongs to) and its Trainer param group.

Pure data for the recipes (``setup``, ``step``, ``ddp``, ``fsdp``) and the
recommender's estimator; see ``memfit.core.precision`` and ``memfit.core.quant`` for the rules.
"""

from __future__ import annotations

import re

from memfit.core.lean_dataclass import dataclass
from memfit.core.frameworks.pytorch import QuantSettings
from memfit.core.ledger.context import is_adapter_param
from memfit.core.peft.adapter_params import keeps_base_dtype
from memfit.core.peft.modules import layer_kind
from memfit.core.precision import DTYPE_BYTES, PrecisionModel, base_param_dtype, resolve_precision
from memfit.core.quant import QuantTensor, base_module, quant_notes, quantized_tensors, quantized_weights, shared_bytes
from memfit.core.scenario.types import Scenario

_LAYER = re.compile(r"^(.*?\.)(\d+)(\.|$)")
_FORBIDDEN = tuple(re.compile(p) for p in (r"bias", r"layernorm", r"rmsnorm", r"(?:^|\.)norm(?:$|\.)",
                                          r"_norm(?:$|\.)"))
"""transformers/trainer.py:get_decay_parameter_names (5.24): names that get no weight decay."""
_LAYERNORM_LEAF = re.compile(r"^ln(_|\d|$)|layer_?norm|^norm")
"""Module names of ``nn.LayerNorm`` instances in the supported families (GPT-2/GPT-J ``ln_*``,
OPT ``*_layer_norm``, BLOOM/Falcon ``*layernorm``): the Trainer excludes ``nn.LayerNorm`` by type."""


@dataclass(frozen=True, slots=True)
class TParam:
    name: str
    shape: tuple[int, ...]
    numel: int
    trainable: bool
    adapter: bool
    load_dtype: str
    """dtype as loaded: from_pretrained's for base params, fp32 for PEFT-created ones."""
    dtype: str
    """dtype it trains in (``fp32``/``fp16``/``bf16``); for a quantized weight, the dtype it had
    when it was quantized (its dequantized dtype)."""
    stage: int
    """Position in the forward: 0 before the first block, 1..L the blocks, L+1 after the last."""
    linear: bool
    """A Linear/Conv1D weight or bias (what autocast casts to 16 bits)."""
    decay: bool
    """In the Trainer's weight-decay param group."""
    quant: tuple[QuantTensor, ...] = ()
    """The stored tensors of a quantized weight (empty: an ordinary tensor)."""

    @property
    def quantized(self) -> bool:
        return bool(self.quant)

    @property
    def nbytes(self) -> int:
        if self.quant:
            return sum(t.nbytes for t in self.quant)
        return self.numel * DTYPE_BYTES[self.dtype]

    @property
    def elem_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def module(self) -> str:
        return self.name.rsplit(".", 1)[0] if "." in self.name else ""


@dataclass(frozen=True, slots=True)
class TorchModel:
    params: tuple[TParam, ...]
    precision: PrecisionModel
    stages: int
    """Number of stages (blocks + 2)."""
    quant: QuantSettings
    shared_quant_bytes: int
    notes: tuple[str, ...] = ()
    tied_embedding: str | None = None
    """Name of the input embedding the output head reuses (``tie_word_embeddings``): the head's
    matmul uses it too, so its gradient is first made by the head and then added to by the
    embedding."""

    @property
    def trainable(self) -> tuple[TParam, ...]:
        return tuple(p for p in self.params if p.trainable)


def _stage_keys(names: list[str]) -> dict[str, int]:
    """Block index of each param name: the distinct ``prefix.N`` groups in order of appearance
    (0 before the first block, and for prompt/prefix encoders, which run first; L+1 after the last)."""
    order: dict[str, int] = {}
    out: dict[str, int] = {}
    seen_block = False
    for name in names:
        m = _LAYER.match(base_module(name) + ".")
        if name.startswith("prompt_encoder.") or ".prompt_encoder." in name:
            out[name] = 0
        elif m:
            key = m.group(1) + m.group(2)
            if key not in order:
                order[key] = len(order) + 1
            out[name] = order[key]
            seen_block = True
        else:
            out[name] = -1 if seen_block else 0
    last = len(order) + 1
    return {n: (last if s == -1 else s) for n, s in out.items()}


def is_decay(name: str) -> bool:
    low = name.lower()
    if any(p.search(low) for p in _FORBIDDEN):
        return False
    mod = base_module(name)
    leaf = mod.rsplit(".", 1)[-1]
    return not _LAYERNORM_LEAF.search(leaf)


def build_torch_model(sc: Scenario) -> TorchModel:
    """Every param of ``sc.model`` as the training loop holds it."""
    ts = sc.torch
    q = sc.quant
    pm = resolve_precision(ts.precision)
    params = sc.model.params
    model_type = sc.model.arch.model_type
    own: dict[str, dict] = {}
    for p in params:
        mod, _, leaf = p.name.rpartition(".")
        own.setdefault(mod, {})[leaf] = p
    kinds = {mod: layer_kind(model_type, mod.replace(".base_layer", ""), ps) for mod, ps in own.items()}
    to_quantize = quantized_weights(params, q, model_type)
    stage = _stage_keys([p.name for p in params])
    kbit = q.enabled and q.prepare_kbit
    notes: list[str] = []
    out = []
    for p in params:
        mod, _, leaf = p.name.rpartition(".")
        kind = kinds.get(mod)
        adapter = is_adapter_param(p.name)
        numel = p.numel
        quant: tuple[QuantTensor, ...] = ()
        if adapter and not keeps_base_dtype(p.name):
            load, dtype = "fp32", "fp32"
        elif adapter:  # built in the base's dtype (X-LoRA's classifier), trained as a base parameter
            load = sc.load.dtype
            dtype = base_param_dtype(pm, load_dtype=load, trainable=p.trainable, kbit_upcast=kbit and load != "fp32")
        else:
            load = sc.load.dtype
            if p.name in to_quantize:  # a Conv1D weight is (in, out); transformers quantizes its transpose
                quant = quantized_tensors(q, to_quantize[p.name])
                dtype = load
            else:
                dtype = base_param_dtype(pm, load_dtype=load, trainable=p.trainable,
                                         kbit_upcast=kbit and load != "fp32")
        out.append(TParam(name=p.name, shape=tuple(p.shape), numel=numel, trainable=p.trainable, adapter=adapter,
                          load_dtype=load, dtype=dtype, stage=stage[p.name], linear=kind in ("linear", "conv1d"),
                          decay=is_decay(p.name), quant=quant))
    if q.enabled and any(p.trainable and p.quantized for p in out):
        from memfit.errors import MemfitError

        raise MemfitError("a quantized base cannot be fully fine-tuned: bitsandbytes weights have no gradient "
                          "(use a PEFT method such as LoRA with quantization, i.e. QLoRA)")
    if pm.mode in ("amp_bf16", "fp32") and any(p.trainable and not p.adapter and p.load_dtype != "fp32"
                                               and p.dtype == p.load_dtype for p in out):
        notes.append(f"trained params loaded in {sc.load.dtype} stay {sc.load.dtype} under {pm.mode}: their gradients "
                     f"and optimizer states are {sc.load.dtype} too (pure {sc.load.dtype} for them)")
    notes.extend(quant_notes(sc))
    n_stages = max(p.stage for p in out) + 1 if out else 1
    return TorchModel(params=tuple(out), precision=pm, stages=n_stages, quant=q,
                      shared_quant_bytes=shared_bytes(q), notes=tuple(notes), tied_embedding=_tied(sc))


def _tied(sc: Scenario) -> str | None:
    """A causal LM without an ``lm_head.weight`` (or ``embed_out.weight``) ties its head to the input
    embedding (``tie_word_embeddings``): the first (vocab, hidden) parameter."""
    arch = sc.model.architecture
    if not (arch.endswith("ForCausalLM") or arch.endswith("LMHeadModel")):
        return None
    names = [p.name for p in sc.model.params]
    if any(base_module(n).rsplit(".", 1)[-1] in ("lm_head", "embed_out") and n.endswith(".weight") for n in names):
        return None
    vocab = sc.model.arch.vocab_size
    for p in sc.model.params:
        if len(p.shape) == 2 and p.shape[0] == vocab and not is_adapter_param(p.name):
            return p.name
    return None


def free_each(t, key: str, sizes) -> None:  # noqa: ANN001 (Timeline)
    """Free several tensors of one item, one ``free`` per tensor (BRIEF contract 2: the timeline and
    its allocator simulation free tensors, not lumps), the most recently allocated first."""
    for n in reversed([n for n in sizes if n]):
        t.free(key, n)
