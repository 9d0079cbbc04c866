"""What each adapted layer's forward keeps for backward, per PEFT method: the adapter side of the
activation model (the base model's side is ``memfit.core.activations.analytic`` / ``layout``).

Read from the model as the method built it (``apply_peft``'s ``ModelShape``: the adapted modules hold
``.base_layer.`` params and the adapter's own tensors beside them), so ranks, patterns and excluded
layers are exactly the ones planned. Each method's module gives, per adapted layer, a ``Saved``:
bytes per token, bytes independent of the tokens, and whether the adapter keeps the layer's input
tensor itself (then it is shared with whatever else saves it: the base model's count of that input
decides, ``kept_inputs``). Every formula is checked against peft's own layer run on CPU tensors and
traced (``tests/trace/test_adapter_layers_vs_trace.py``).

The dtypes that matter (``DtypeContext``): the residual stream's (the layer's input ``x``), the
adapter parameters' (fp32 when peft upcasts the adapters of a 16-bit model, ``autocast_adapter_dtype``,
as in the torch loop; the model's dtype under DeepSpeed, which casts every parameter), and
autocast's (torch AMP: every matmul's inputs are cast to 16 bits; the casts of *weights* are the
ledger's ``amp.weight_casts``, not counted here). Most tuners cast ``x`` to the adapter's dtype
first (``BaseTunerLayer._cast_input_dtype``): a copy when the dtypes differ.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping
from types import MappingProxyType

from memfit.core.lean_dataclass import dataclass
from memfit.core.model import ArchSpec, ModelShape
from memfit.core.peft.modules import CONV1D_LAYER_NAMES, CONV1D_MODEL_TYPES, EMBEDDING_LAYER_NAMES
from memfit.core.peft.spec import PeftSpec
from memfit.core.quant_kernels import BnbRelease

_BLOCK = re.compile(r"^(.*?\.)(\d+)(\.|$)")
ROOT = "base_model.model."


@dataclass(frozen=True, slots=True)
class AdaptedLayer:
    """One module a tuner wrapped, with the tensors it added."""

    module: str
    """Name in the transformers model (``model.layers.3.mlp.down_proj``)."""
    block: int
    """Index of the transformer block it is in (encoder blocks first); -1 before the blocks, ``L``
    after the last."""
    in_features: int
    out_features: int
    tensors: Mapping[str, tuple[int, ...]]
    """The adapter's tensors by name relative to the module (``lora_A.default.weight``), shared ones
    (VeRA's projections) only where the model names them."""
    bias: bool = False
    quantized: bool = False
    """The base layer is a bitsandbytes layer (set by the ledger: DoRA then dequantizes it)."""

    @property
    def leaf(self) -> str:
        return self.module.rsplit(".", 1)[-1]

    def shape(self, name: str) -> tuple[int, ...]:
        """The shape of the adapter tensor whose name starts with ``name`` (``lora_A``)."""
        for key, shape in self.tensors.items():
            if key == name or key.startswith(name + "."):
                return shape
        raise KeyError(f"{self.module}: no adapter tensor {name!r}")  # a formula/builder mismatch

    def has(self, name: str) -> bool:
        return any(key == name or key.startswith(name + ".") for key in self.tensors)


@dataclass(frozen=True, slots=True)
class DtypeContext:
    """Element sizes in bytes."""

    stream: int
    """The layer input's (the residual stream's dtype)."""
    adapter: int
    """The adapter parameters'."""
    autocast: int = 0
    """torch.autocast's dtype (0: no autocast)."""
    base: int = 0
    """The base layer's weight (0: the stream's)."""
    upcast: bool = False
    """peft upcast the adapters of a 16-bit model to fp32 when it built them (``autocast_adapter_dtype``,
    ``_cast_adapter_dtype``): their parameters were re-created, and every one requires grad (AdaLoRA's
    ``ranknum`` too)."""


@dataclass(frozen=True, slots=True)
class Saved:
    """What one adapted layer keeps for backward beside the base layer's own tensors."""

    per_token: int = 0
    """Bytes per token (multiplied by the micro-batch's tokens)."""
    fixed: int = 0
    """Bytes independent of the tokens (weight-sized tensors rebuilt in the forward)."""
    keeps_input: bool = False
    """The adapter saves the layer's input tensor itself (shared, not counted here)."""
    grad_only: int = 0
    """Part of ``per_token`` kept only when the layer's input requires grad (a dropout's mask: no graph is
    recorded for a dropout of a tensor that needs no gradient)."""

    fixed_grad_only: int = 0
    """Part of ``fixed`` kept only when the layer's input requires grad (a rebuilt weight that a matmul keeps
    for the input's gradient)."""

    per_sample: int = 0
    """Bytes per sample of the micro-batch (weights mixed per sample: Poly's routed factors)."""
    sample_grad_only: int = 0
    """Part of ``per_sample`` kept only when the layer's input requires grad."""

    def __add__(self, other: "Saved") -> "Saved":
        return Saved(self.per_token + other.per_token, self.fixed + other.fixed, self.keeps_input or other.keeps_input,
                     self.grad_only + other.grad_only, self.fixed_grad_only + other.fixed_grad_only,
                     self.per_sample + other.per_sample, self.sample_grad_only + other.sample_grad_only)

    def bytes(self, tokens: int, samples: int) -> int:
        """The bytes kept for a micro-batch of ``samples`` sequences, ``tokens`` tokens in all."""
        return self.per_token * tokens + self.fixed + self.per_sample * samples

    def grad_only_bytes(self, tokens: int, samples: int) -> int:
        """The part of ``bytes`` kept only when the layer's input requires grad."""
        return self.grad_only * tokens + self.fixed_grad_only + self.sample_grad_only * samples


Formula = Callable[[AdaptedLayer, PeftSpec, DtypeContext], Saved]


def matmul_input(elem: int, is_input: bool, per_width: int, ctx: DtypeContext) -> Saved:
    """What a trainable matmul saves of the tensor it reads (``per_width`` elements per token, ``elem``
    bytes each; ``is_input``: it is the layer's input itself): the tensor, or under autocast its
    16-bit copy when it is not 16-bit already (``autocast_mode.cpp:cached_cast`` caches weights only)."""
    if ctx.autocast and elem != ctx.autocast:
        return Saved(per_token=per_width * ctx.autocast)
    if is_input:
        return Saved(keeps_input=True)
    return Saved(per_token=per_width * elem)


def adapter_input(ctx: DtypeContext) -> tuple[int, bool]:
    """``BaseTunerLayer._cast_input_dtype(x, adapter dtype)``: (element size, still the input itself)."""
    return ctx.adapter, ctx.adapter == ctx.stream


def out_elem(ctx: DtypeContext) -> int:
    """A matmul's output dtype: autocast's, else the adapter's."""
    return ctx.autocast or ctx.adapter


@functools.cache
def formulas() -> Mapping[str, Formula]:
    """memfit method -> the formula of one adapted layer. Its three modules are imported on the first
    adapted layer (a plan with none, full fine-tuning or prompt/prefix tuning, imports none of them)."""
    from memfit.core.activations.adapters import lora, others, recent, shadow, xlora

    return MappingProxyType({**lora.FORMULAS, **others.FORMULAS, **recent.FORMULAS, **shadow.FORMULAS, **xlora.FORMULAS})


@functools.cache
def no_cache_methods() -> frozenset[str]:
    """Methods whose peft model refuses a base whose config has ``use_cache`` true (X-LoRA: ``xlora.py``), so it
    is trained without a key/value cache."""
    from memfit.core.activations.adapters import xlora

    return xlora.NO_KV_CACHE


@functools.cache
def model_formulas() -> Mapping[str, Callable[["AdapterActivations", DtypeContext], Saved]]:
    """memfit method -> what the method keeps outside its adapted layers, before the blocks (X-LoRA's
    classifier and scalings: ``xlora.py``)."""
    from memfit.core.activations.adapters import xlora

    return MappingProxyType(dict(xlora.MODEL_FORMULAS))


SideBuilder = Callable[[ModelShape, PeftSpec, int], "SideModel | None"]


@functools.cache
def sides() -> Mapping[str, SideBuilder]:
    """memfit method -> the ``SideModel`` it runs (``side(shape, spec, dtype_bytes)``), for the tuners that run one."""
    from memfit.core.activations.adapters import shadow

    return MappingProxyType(dict(shadow.SIDES))


@dataclass(frozen=True, slots=True)
class QuantizedLayer:
    """One bitsandbytes layer of the base (quantized by transformers' ``replace_with_bnb_linear``)."""

    module: str
    block: int
    in_features: int
    out_features: int

    @property
    def leaf(self) -> str:
        return self.module.rsplit(".", 1)[-1]


@dataclass(frozen=True, slots=True)
class Quantization:
    """What the base's quantized matmuls keep (``memfit.core.quant_kernels``), per bitsandbytes release."""

    method: str
    """``4bit`` or ``8bit``."""
    compute_bytes: int
    """``bnb_4bit_compute_dtype``'s element size (``Linear4bit`` casts its input to it)."""
    release: BnbRelease
    layers: tuple[QuantizedLayer, ...]

    def saved(self, layer: QuantizedLayer, stream_bytes: int) -> Saved:
        r = self.release
        if self.method == "8bit":  # MatMul8bitLt keeps A (uncast), and up to 0.44 CAt (int8) and SCAt (fp32)
            return Saved(keeps_input=True, per_token=layer.in_features if r.int8_keeps_transposed else 0,
                         fixed=4 * layer.in_features if r.int8_keeps_transposed else 0)
        if not r.saves_4bit_input:
            return Saved()
        if self.compute_bytes == stream_bytes:  # x.to(compute_dtype) is x itself
            return Saved(keeps_input=True)
        return Saved(per_token=layer.in_features * self.compute_bytes)


@dataclass(frozen=True, slots=True)
class SideModel:
    """A second network a tuner runs in the forward beside the adapted model (SHADOW's shadow backbone): its
    blocks are planned by the same activation model as any model's (``analytic.estimate_activation_bytes``), its
    own embeddings and head are not (it has none of its own here, or they are in ``before``)."""

    arch: ArchSpec
    """Its architecture (``num_layers`` blocks), every weight trained."""
    input_trains: bool
    """Its first block's input requires grad (its own trained embeddings)."""
    before: Saved = Saved()
    """What it keeps beside its blocks, before the adapted model's blocks (a projection's input)."""
    after: Saved = Saved()
    """What its loss or the adapted model's use of its output keeps after them (a second loss's log-softmax)."""
    feeds_blocks: bool = True
    """Its output is added into the adapted model's first block's input: that input requires grad."""
    base_embedding_frozen: bool = True
    """The adapted model's input embedding trains nothing (``input_embedding_trains`` false): under checkpointing
    its output is a leaf that requires grad (``enable_input_require_grads``), held until backward."""
    wraps_blocks: bool = True
    """The adapted blocks' own tensors are outside the module checkpointing recomputes (a ``ShadowLayer`` wraps
    the ``GradientCheckpointingLayer``): they are kept under checkpointing too."""
    note: str = ""
    """What the plan says about it (where it is an estimate)."""


@dataclass(frozen=True, slots=True)
class AdapterActivations:
    """The adapted layers of a model and what each keeps, for a given dtype context; and what the
    base's quantized layers keep (``quantized``)."""

    method: str
    layers: tuple[AdaptedLayer, ...]
    spec: PeftSpec
    adapter_bytes: int
    autocast_bytes: int = 0
    base_bytes: int = 0
    upcast: bool = False
    blocks: int = 0
    """Transformer blocks of the model (encoder and decoder)."""
    quantized: Quantization | None = None
    embedding_trains: bool = False
    """A module before the first block trains (``input_embedding_trains``): the first block's input needs a
    gradient, so that block keeps what the later ones keep."""
    side: SideModel | None = None
    """A second network the tuner runs beside the model (``SideModel``; ``sides()``)."""

    @property
    def kv_cache(self) -> bool:
        """The model keeps its key/value cache in the outputs (unless checkpointing): not under a method whose
        peft model refuses a base that caches (``no_cache_methods``: X-LoRA)."""
        return self.method not in no_cache_methods()

    def _ctx(self, stream_bytes: int) -> DtypeContext:
        return DtypeContext(stream_bytes, self.adapter_bytes, self.autocast_bytes, self.base_bytes or stream_bytes,
                            self.upcast)

    def model_saved(self, stream_bytes: int) -> Saved:
        """What the method keeps outside its adapted layers, before the blocks (``model_formulas``)."""
        formula = model_formulas().get(self.method) if self.layers else None
        return formula(self, self._ctx(stream_bytes)) if formula is not None else Saved()

    def saved(self, layer: AdaptedLayer, stream_bytes: int) -> Saved:
        ctx = self._ctx(stream_bytes)
        formula = formulas().get(self.method)
        if formula is None:  # a tuner without a formula plans no adapted layers here (none reach this)
            raise AssertionError(f"no activation formula for {self.method}")
        return formula(layer, self.spec, ctx)

    def _all(self, stream_bytes: int):
        for layer in self.layers:
            yield layer.leaf, layer.block, self.saved(layer, stream_bytes)
        if self.quantized is not None:
            for q in self.quantized.layers:
                yield q.leaf, q.block, self.quantized.saved(q, stream_bytes)

    def kept_inputs(self, stream_bytes: int) -> frozenset[str]:
        """Leaf names of the layers whose input tensor the adapter (or the quantized matmul) keeps, for
        the base model's count of that shared input."""
        return frozenset(leaf for leaf, _, s in self._all(stream_bytes) if s.keeps_input)

    def first_block_adapted(self) -> frozenset[str]:
        """Leaf names of the first block's adapted layers (their output needs a gradient there even when the
        block's input does not)."""
        return frozenset(layer.leaf for layer in self.layers if layer.block == 0)

    def block_bytes(self, tokens: int, stream_bytes: int, *, samples: int,
                    first_input_frozen: frozenset[str] = frozenset()) -> tuple[int, ...]:
        """Bytes the adapters (and quantized matmuls) keep in each block, in order (``blocks`` entries), for a
        micro-batch of ``samples`` sequences of ``tokens`` tokens in all.
        ``first_input_frozen``: leaf names of the first block's layers whose input needs no gradient (they
        read the output of a frozen embedding): their ``grad_only`` and ``fixed_grad_only`` bytes are not kept there."""
        out = [0] * self.blocks
        for leaf, block, s in self._all(stream_bytes):
            if 0 <= block < self.blocks:
                out[block] += s.bytes(tokens, samples)
                if block == 0 and leaf in first_input_frozen:
                    out[block] -= s.grad_only_bytes(tokens, samples)
        return tuple(out)

    def outside_bytes(self, tokens: int, stream_bytes: int, *, samples: int) -> tuple[int, int]:
        """(before the blocks, after them): adapted or quantized embeddings and heads, and what the method keeps
        outside its layers (``model_saved``: X-LoRA's classifier)."""
        before, after = self.model_saved(stream_bytes).bytes(tokens, samples), 0
        for _, block, s in self._all(stream_bytes):
            if 0 <= block < self.blocks:
                continue
            n = s.bytes(tokens, samples)
            if block < 0:
                before += n
            else:
                after += n
        if self.side is not None:
            before += self.side.before.bytes(tokens, samples)
            after += self.side.after.bytes(tokens, samples)
        return before, after


BLOCK_INPUT_LAYERS = frozenset({"q_proj", "k_proj", "v_proj", "c_attn", "query_key_value", "qkv_proj", "Wqkv", "query",
                                "key", "value", "q", "k", "v"})
"""Layers that read a block's (normed) input directly: in the first block, with a frozen embedding and
no checkpointing, their input needs no gradient."""
PARALLEL_MLP_INPUT_LAYERS = frozenset({"fc_in", "dense_h_to_4h", "fc1", "gate_proj", "up_proj"})
"""The MLP's input layers, which read the block input too in parallel-residual families (GPT-J, NeoX)."""


def adapted_layers(shape: ModelShape) -> tuple[AdaptedLayer, int]:
    """Every module with ``.base_layer.`` params, with its adapter tensors; and the number of blocks."""
    order: dict[str, int] = {}
    for p in shape.params:
        m = _BLOCK.match(_plain(p.name) + ".")
        if m and not p.name.startswith("prompt_encoder.") and _in_model(p.name):
            order.setdefault(m.group(1) + m.group(2), len(order))
    blocks = len(order)
    mods: dict[str, dict] = {}
    for p in shape.params:
        if ".base_layer." not in p.name:
            continue
        module = p.name.split(".base_layer.", 1)[0]
        entry = mods.setdefault(module, {"weight": None, "bias": False})
        leaf = p.name.rsplit(".", 1)[-1]
        if leaf == "weight":
            entry["weight"] = p.shape
        elif leaf == "bias":
            entry["bias"] = True
    tensors: dict[str, dict[str, tuple[int, ...]]] = {m: {} for m in mods}
    for p in (*shape.params, *shape.buffers):
        if ".base_layer." in p.name:
            continue
        parts = p.name.split(".")
        for k in range(len(parts) - 1, 0, -1):  # the longest adapted module the name is under
            module = ".".join(parts[:k])
            if module in tensors:
                tensors[module][p.name[len(module) + 1:]] = tuple(p.shape)
                break
    layers = []
    seen_blocks = False
    for module, entry in mods.items():
        plain = _plain(module)
        m = _BLOCK.match(plain + ".")
        block = order.get(m.group(1) + m.group(2)) if m else None
        if block is None:
            block = blocks if seen_blocks else -1
        else:
            seen_blocks = True
        w = entry["weight"] or (0, 0)
        out_f, in_f = (w if len(w) == 2 else (w[0], w[0]))
        if shape.arch.model_type in CONV1D_MODEL_TYPES and plain.rsplit(".", 1)[-1] in CONV1D_LAYER_NAMES:
            out_f, in_f = in_f, out_f  # GPT-2's Conv1D stores (in, out)
        layers.append(AdaptedLayer(module=plain, block=block, in_features=in_f, out_features=out_f,
                                   tensors=MappingProxyType(tensors[module]), bias=entry["bias"]))
    return tuple(layers), blocks


def _plain(name: str) -> str:
    return name.removeprefix(ROOT).removeprefix("base_model.")


def _in_model(name: str) -> bool:
    """Not in a side network a tuner runs beside the model (``side_prefixes``: SHADOW's ``shadow_backbone``, whose
    own ``layers.<i>`` are not the model's blocks). X-LoRA's base, ``base_model.lora_model.model.``, is the model."""
    return not name.startswith(side_prefixes())


@functools.cache
def side_prefixes() -> tuple[str, ...]:
    """Where the side networks of ``sides()`` keep their parameters (each module's ``SIDE_PREFIXES``)."""
    from memfit.core.activations.adapters import shadow

    return tuple(shadow.SIDE_PREFIXES)


def adapter_activations(shape: ModelShape, spec: PeftSpec, *, adapter_bytes: int, autocast_bytes: int = 0,
                        base_bytes: int = 0, upcast: bool = False,
                        quantized: Quantization | None = None) -> AdapterActivations | None:
    """The adapter side of ``shape`` trained under ``spec`` (``None`` when nothing is adapted or
    quantized: full, freeze and the prompt-learning methods on an unquantized base). ``upcast``: the
    base model was 16-bit when peft built the adapters (``DtypeContext.upcast``); ``quantized``: the
    base's bitsandbytes layers (``quantized_layers``)."""
    layers, blocks = adapted_layers(shape)
    if not layers and quantized is None:
        return None
    build_side = sides().get(spec.method)
    side = build_side(shape, spec, base_bytes or adapter_bytes) if build_side is not None else None
    trains = input_embedding_trains(shape)
    if side is not None and trains:
        from dataclasses import replace

        side = replace(side, base_embedding_frozen=False)
    return AdapterActivations(method=spec.method, layers=layers, spec=spec, adapter_bytes=adapter_bytes,
                              autocast_bytes=autocast_bytes, base_bytes=base_bytes, upcast=upcast, blocks=blocks,
                              quantized=quantized, side=side,
                              embedding_trains=trains or (side is not None and side.feeds_blocks))


INPUT_EMBEDDING_MODULES = (EMBEDDING_LAYER_NAMES - {"relative_attention_bias", "shared"}) | {"embeddings"}
"""Modules before the first block whose output is the first block's input, or is added into it: the token,
position and token-type embeddings of every family memfit builds (``embed_tokens``, ``wte``/``wpe``,
``word_embeddings``/``position_embeddings``/``token_type_embeddings``, ``embed_in``), and BERT's/DeBERTa's
``embeddings`` container (its LayerNorm). Not T5's ``shared``: in transformers 5 the encoder and decoder look
tokens up in their own ``embed_tokens`` (tied to ``shared.weight``: ``T5ForConditionalGeneration._tied_weights_keys``,
``T5Stack.forward``), so a tuner's wrapper of ``shared`` never runs; nor ``relative_attention_bias``, which is in
block 0 and adds to the scores, not the stream."""


def input_embedding_trains(shape: ModelShape) -> bool:
    """A parameter of an input embedding (``INPUT_EMBEDDING_MODULES``, outside the blocks) requires grad: a
    tuner's adapter on it (peft's ``lora_embedding_A/B``, HiRA's, trainable tokens' delta), a
    ``modules_to_save`` copy, an LN-tuned embedding LayerNorm. Its output then requires grad (``F.embedding``
    of a weight that requires grad, or the adapter's sum with the frozen lookup), and so does every block's
    input: the first block keeps what the later ones keep (prompt encoders run before the embedding and
    prepend their own tokens: ``PeftSpec.prompt_tokens``)."""
    for p in shape.params:
        if not p.trainable or p.name.startswith("prompt_encoder.") or ".prompt_encoder." in p.name or \
                not _in_model(p.name):
            continue
        plain = _plain(p.name)
        if _BLOCK.match(plain + "."):
            continue
        if any(part in INPUT_EMBEDDING_MODULES for part in plain.split(".")[:-1]):
            return True
    return False


def first_block_input_trains(peft: PeftSpec, adapters: "AdapterActivations | None") -> bool:
    """The first block's input requires grad: full fine-tuning (and ``freeze``), prompt tuning's virtual tokens,
    or a trained input embedding (``AdapterActivations.embedding_trains``; without ``adapters``, an embedding
    among ``peft``'s ``modules_to_save``, or a LoRA target)."""
    if peft.method in ("full", "freeze") or peft.prompt_tokens > 0:
        return True
    if adapters is not None:
        return adapters.embedding_trains
    named = peft.modules_to_save + (peft.target_modules if peft.method == "lora" else ())
    return any(m.rsplit(".", 1)[-1] in INPUT_EMBEDDING_MODULES for m in named)


def quantized_layers(shape: ModelShape, modules: set[str]) -> tuple[QuantizedLayer, ...]:
    """The quantized ``modules`` (names as the transformers model has them) with their widths and blocks."""
    order: dict[str, int] = {}
    for p in shape.params:
        m = _BLOCK.match(_plain(p.name) + ".")
        if m and not p.name.startswith("prompt_encoder."):
            order.setdefault(m.group(1) + m.group(2), len(order))
    out = []
    seen = set()
    for p in shape.params:
        plain = _plain(p.name).replace(".base_layer", "")
        module, _, leaf = plain.rpartition(".")
        if module not in modules or leaf != "weight" or module in seen:
            continue
        seen.add(module)
        m = _BLOCK.match(module + ".")
        block = order.get(m.group(1) + m.group(2), -1) if m else (-1 if not out else len(order))
        out_f, in_f = p.shape
        if shape.arch.model_type in CONV1D_MODEL_TYPES and module.rsplit(".", 1)[-1] in CONV1D_LAYER_NAMES:
            out_f, in_f = in_f, out_f
        out.append(QuantizedLayer(module=module, block=block, in_features=in_f, out_features=out_f))
    return tuple(out)


def first_block_adapters(adapters: AdapterActivations, arch, tokens: int, stream_bytes: int,  # noqa: ANN001
                         grad_into_first: bool, *, samples: int) -> int:
    """The first block's adapter bytes: without a gradient into it (frozen embeddings, no checkpointing)
    the layers reading the block input keep no dropout mask (``BLOCK_INPUT_LAYERS``; with a parallel
    residual also the MLP's input layers)."""
    frozen: frozenset[str] = frozenset()
    if not grad_into_first:
        frozen = BLOCK_INPUT_LAYERS
        if arch.layout is not None and arch.layout.parallel or arch.model_type in ("gptj", "gpt_neox", "falcon", "phi"):
            frozen = frozen | PARALLEL_MLP_INPUT_LAYERS
    per = adapters.block_bytes(tokens, stream_bytes, samples=samples, first_input_frozen=frozen)
    return per[0] if per else 0


PRE_ATTENTION_NORMS = frozenset({"input_layernorm", "ln_1", "ln_attn", "attention_norm", "pre_attention_layernorm"})


def first_block_qk_grads(adapters: "AdapterActivations | None", targets, peft: PeftSpec) -> int:  # noqa: ANN001
    """How many of q and k need a gradient in the first block when its input does not (frozen
    embeddings): the adapted projections; both when the norm before attention is adapted (LN tuning);
    one (k, through the trainable prefix it is concatenated with) under prefix tuning."""
    if peft.prefix_tokens > 0:
        return 1
    adapted = adapters.first_block_adapted() if adapters is not None else frozenset(targets)
    if adapted & PRE_ATTENTION_NORMS:
        return 2
    return sum(1 for n in ("q_proj", "k_proj") if n in adapted)
