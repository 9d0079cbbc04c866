"""bitsandbytes quantization of a model's Linear weights, reduced to the tensors it stores.

Which layers: ``transformers/integrations/bitsandbytes.py:replace_with_bnb_linear`` (5.24) replaces
every ``nn.Linear`` (exactly that type) and GPT-2's ``Conv1D`` whose name ``should_convert_module``
does not skip; the default skips (``quantizers/base.py:get_keys_to_not_convert``) are the output
embeddings (``lm_head``), tied weights and the module of the model's last parameter. Biases and every
other parameter stay in the load dtype, a mixture-of-experts block's fused 3-D expert params
(``gate_up_proj``, ``down_proj``) and its router (``MOE_ROUTERS``) too. Releases before 5.0 built each
expert as ``nn.Linear`` (Mixtral's ``block_sparse_moe.experts.N.w1/w2/w3`` and ``gate``), which they
quantized: the model shape of such a release has that layout (``families.moe.per_expert_params``), and
every one of those Linears, the router included, is quantized here like any other.

4-bit (``Linear4bit``/``Params4bit``; ``bitsandbytes/functional.py:quantize_4bit``, CUDA kernel
``backends/cuda/ops.py``, bitsandbytes 0.50.2), for a weight of ``n`` elements:

- packed weight: ``torch.empty(((n + 1) // (s * 2), 1), dtype=quant_storage)`` with ``s`` the
  storage dtype's size: two 4-bit codes per byte, ``(n + 1) // 2`` bytes for any storage dtype
  when ``n`` is even;
- ``absmax``: fp32, one per block of ``blocksize`` = 64 elements (``ceil(n/64)``);
- ``code``: the 16-entry fp32 NF4/FP4 table (``get_4bit_type``), one per weight (64 B);
- double quantization (``compress_statistics``): ``offset = absmax.mean()`` (a 0-d fp32), the
  absmax quantized by ``quantize_blockwise(absmax - offset, blocksize=256)`` to uint8 (``ceil(n/64)``
  bytes) with its own fp32 absmax per 256 (``ceil(ceil(n/64)/256) x 4`` B) and its own copy of the
  256-entry dynamic map (``QuantState(code=code.to(A.device, copy=True))``, 1 KiB per weight); the
  map itself stays cached once per device (``name2qmap["dynamic"]``).

8-bit (LLM.int8(): ``Int8Params._quantize`` -> ``int8_vectorwise_quant``): ``CB`` int8 (``n`` B)
and ``SCB`` fp32 per output row.

In training, ``MatMul4Bit`` (``autograd/_functions.py``) computes the forward with
``bitsandbytes::gemm_4bit``: for more than 1536 rows (tokens of a micro-batch) always by
dequantizing the weight into a compute-dtype tensor the size of the full weight and calling
``F.linear`` (``_dequant_linear_fallback``; with double quantization the fp32 absmax is rebuilt
first); below that a fused kernel may be chosen per GPU architecture. The backward dequantizes the
weight again (``F.dequantize_4bit(B, state)``, in the dtype the weight had when it was quantized)
for the input gradient. The dequantized weight is a transient of one layer at a time.
"""

from __future__ import annotations

import re
from functools import lru_cache

from memfit.core.lean_dataclass import dataclass
from memfit.core.frameworks.pytorch import QuantSettings

BLOCKSIZE_4BIT = 64
"""bitsandbytes/functional.py:quantize_4bit: ``blocksize=64`` (also what Params4bit uses)."""
NESTED_BLOCKSIZE = 256
"""functional.py:quantize_4bit: ``quantize_blockwise(_absmax - offset, blocksize=256)``."""
CODE_4BIT_BYTES = 16 * 4
DYNAMIC_MAP_BYTES = 256 * 4
GEMM_4BIT_CUSTOM_MAX_M = 1536
"""backends/cuda/ops.py: ``_gemm_4bit_custom_max_m``: above it, always dequantize + F.linear."""
STORAGE_BYTES = {"uint8": 1, "fp16": 2, "bf16": 2, "fp32": 4}
SRC = "bitsandbytes 0.50.2"


@dataclass(frozen=True, slots=True)
class QuantTensor:
    """One stored tensor of a quantized weight."""

    name: str
    nbytes: int
    shared: bool = False
    """One per device for the whole model (the double-quantization dynamic map)."""


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def quantized_tensors(q: QuantSettings, shape: tuple[int, ...]) -> tuple[QuantTensor, ...]:
    """What one quantized Linear weight of ``shape`` is stored as, in allocation order."""
    n = 1
    for d in shape:
        n *= d
    if q.method == "8bit":
        return (QuantTensor("CB", n), QuantTensor("SCB", shape[0] * 4))
    s = STORAGE_BYTES[q.quant_storage]
    blocks = _ceil(n, BLOCKSIZE_4BIT)
    out = [QuantTensor("weight", ((n + 1) // (s * 2)) * s)]
    if q.double_quant:
        out += [QuantTensor("absmax(uint8)", blocks), QuantTensor("offset", 4),
                QuantTensor("nested_absmax", _ceil(blocks, NESTED_BLOCKSIZE) * 4),
                QuantTensor("nested_code", DYNAMIC_MAP_BYTES)]
    else:
        out.append(QuantTensor("absmax", blocks * 4))
    out.append(QuantTensor("code", CODE_4BIT_BYTES))
    return tuple(out)


def quantized_bytes(q: QuantSettings, shape: tuple[int, ...]) -> int:
    return sum(t.nbytes for t in quantized_tensors(q, shape))


def shared_bytes(q: QuantSettings) -> int:
    """Per device, once: the dynamic map of double quantization cached in ``name2qmap``."""
    return DYNAMIC_MAP_BYTES if q.method == "4bit" and q.double_quant else 0


def storage_elements(q: QuantSettings, shape: tuple[int, ...]) -> int:
    """Elements of the packed weight tensor (what FSDP/ZeRO-3 flatten and shard): bytes / storage size."""
    n = 1
    for d in shape:
        n *= d
    if q.method == "8bit":
        return n
    s = STORAGE_BYTES[q.quant_storage]
    return (n + 1) // (s * 2)


def base_module(name: str) -> str:
    """The module path of a param in the model transformers built (before PEFT wrapped it)."""
    mod = name.rsplit(".", 1)[0]
    mod = mod.removeprefix("base_model.model.").replace(".base_layer", "")
    return mod


def default_skips(module_names: list[str], last_param: str) -> tuple[str, ...]:
    """``get_keys_to_not_convert``: the output embeddings (``lm_head``-like modules) and the module
    of the last parameter (tied weights are embeddings, which are never converted anyway)."""
    skips = {base_module(last_param)}
    for m in module_names:
        leaf = m.rsplit(".", 1)[-1]
        if leaf in ("lm_head", "embed_out", "output_projection"):
            skips.add(m)
    return tuple(sorted(skips))


def should_convert(module: str, patterns: tuple[str, ...]) -> bool:
    """``quantizers_utils.should_convert_module`` (transformers 5.24)."""
    boundary = r"(?:(?<=\.)|(?=\.|$))"
    return not any(re.match(rf"(?:{key}){boundary}", module) or module.endswith(key) for key in patterns)


MOE_ROUTERS = ("mlp.gate", "feed_forward.router")
"""The routers beside fused experts (``memfit.core.families.moe``): in transformers 5.24 none is an
``nn.Linear`` (``MixtralTopKRouter``, ``Qwen2MoeTopKRouter``, ``Qwen3MoeTopKRouter``,
``DeepseekV3TopkRouter`` are plain modules with a ``weight``; ``Llama4Router`` subclasses
``nn.Linear``, and ``replace_with_bnb_linear`` takes exactly ``type(module) is nn.Linear``), so they
stay in the load dtype like the fused 3-D expert params."""


def is_moe_router(module: str, modules: set[str]) -> bool:
    """``module`` is a router of a fused-experts block (a sibling ``experts`` module exists)."""
    parent, _, leaf = module.rpartition(".")
    return any(module.endswith(r) for r in MOE_ROUTERS) and f"{parent}.experts" in modules


def quantized_weights(params, q: QuantSettings, model_type: str) -> dict[str, tuple[int, ...]]:  # noqa: ANN001
    return dict(_quantized_weights(tuple(params), q, model_type))


@lru_cache(maxsize=16)
def _quantized_weights(params, q: QuantSettings, model_type: str) -> tuple[tuple[str, tuple[int, ...]], ...]:  # noqa: ANN001
    """The weights ``replace_with_bnb_linear`` quantizes, by parameter name, with the ``(out, in)`` shape
    bitsandbytes quantizes (a GPT-2 ``Conv1D``'s ``(in, out)`` weight is transposed first): every
    Linear/Conv1D ``weight`` whose module ``should_convert``, the skips being ``llm_int8_skip_modules``
    or, when that is ``None``, ``default_skips``. ``params``: the model's ``ParamSpec``s as trained."""
    from memfit.core.peft.adapter_params import is_adapter_param
    from memfit.core.peft.modules import layer_kind

    if not q.enabled:
        return {}
    own: dict[str, dict] = {}
    for p in params:
        mod, _, leaf = p.name.rpartition(".")
        own.setdefault(mod, {})[leaf] = p
    kinds = {mod: layer_kind(model_type, mod.replace(".base_layer", ""), ps) for mod, ps in own.items()}
    base = [p for p in params if not is_adapter_param(p.name)]
    skips = q.skip_modules if q.skip_modules is not None else default_skips(
        sorted({base_module(p.name) for p in base}), base[-1].name)
    modules = {base_module(p.name) for p in base}
    out: dict[str, tuple[int, ...]] = {}
    for p in base:
        mod, _, leaf = p.name.rpartition(".")
        kind = kinds.get(mod)
        if is_moe_router(base_module(p.name), modules):
            continue
        if leaf == "weight" and kind in ("linear", "conv1d") and should_convert(base_module(p.name), skips):
            out[p.name] = tuple(p.shape)[::-1] if kind == "conv1d" else tuple(p.shape)
    return tuple(out.items())


def quant_notes(sc) -> tuple[str, ...]:  # noqa: ANN001 (Scenario)
    """What a plan with a bitsandbytes base should say it assumed: the release when not given, an
    empty skip list (everything quantized), and under DeepSpeed the load order it does not follow."""
    q = sc.quant
    if not q.enabled:
        return ()
    notes = []
    if not sc.runtime.bitsandbytes_version_given:
        notes.append(f"bitsandbytes {sc.runtime.bitsandbytes_version} assumed (what its matmuls keep changes with the "
                     "release: 4-bit layers keep their input up to 0.43.1); give runtime.bitsandbytes_version or "
                     "--bitsandbytes-version")
    if q.skip_modules is not None and not q.skip_modules:
        notes.append("llm_int8_skip_modules is an empty list: every Linear is quantized, the output head too "
                     "(transformers adds its default skips only when the key is absent)")
    if sc.framework == "deepspeed" and not (sc.load.zero_init and sc.deepspeed.zero.stage == 3):
        notes.append("4-bit base under DeepSpeed without zero.Init: from_pretrained quantizes each weight on the GPU "
                     "as it loads; the plan's load phase still stages the packed weights in host memory first")
    return tuple(notes)
