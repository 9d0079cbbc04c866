"""ShadowPEFT: a small trainable *shadow* backbone run beside the frozen decoder, its state injected into
each wrapped decoder block and updated from the block's output (peft 0.21.2 ``tuners/shadow/``).

What peft builds (``ShadowModel._create_and_replace``, ``_init_shadow_backbone``, ``_build_shadow_backbone``,
``ShadowLayer.update_layer``, ``_sync_shadow_module_trainability``):

- every target is a whole decoder block (default: each block of ``_get_backbone``'s ``layers``/``h``),
  wrapped in a ``ShadowLayer`` holding the block as ``base_layer`` and, after it, ``shadow_down (r, d)``,
  ``shadow_up (d, r)`` (no biases), ``shadow_update_transform`` and ``shadow_update_gate``: each
  ``Linear(d, u) + GELU + Linear(u, d)`` with biases (``u = update_hidden_size or r``, ``d`` the base hidden);
- once per adapter, on the tuner (``base_model.``, after the whole transformers model): the *mirror*
  backbone ``shadow_backbone.default``, the backbone class built from a copy of the base config with
  ``num_hidden_layers = shadow_num_hidden_layers or 1`` and the hidden / intermediate / head overrides
  (``_set_config_attr``: the first of peft's names the config has, transformers' aliases being one
  attribute), ``layer_types`` cut or padded and ``max_window_layers`` clamped (``_normalize_layer_config``);
  its ``embed_tokens`` removed when it reads the base's embeddings (``share_embeddings``, widths equal;
  a GPT-2 backbone's ``wte`` is not called ``embed_tokens`` and stays); all of it trains (a mirror's own
  embeddings too); ``shadow_projection.default`` a ``Linear(shadow hidden, d, bias=False)`` when the widths
  differ (else an ``Identity``); ``shadow_head.default`` a trained copy of ``score``/``classifier`` under
  SEQ_CLS (the causal LM reuses the frozen ``lm_head``). The backbone's buffers (its rotary tables) are
  moved to the base's first parameter's dtype with it (``module.to(dtype=...)``).

memfit builds the backbone with its own family builder from the base's config.json
(``ModelShape.config``), so its parameters and buffers are those transformers creates. A ``shadow_model``
checkpoint (a path or hub id) is refused: its sizes are in files memfit is not given.
"""

from __future__ import annotations

import re
from typing import Any

from memfit.core.model import ArchSpec, BufferSpec, ModelShape, ParamSpec
from memfit.core.peft.modules import (ADAPTER_NAME, EMBEDDING_LAYER_NAMES, flatten, task_type, under_any, with_modules_to_save)
from memfit.core.peft.inject import checked_modules_to_save
from memfit.core.peft.spec import PeftSpec
from memfit.core.peft.targets import find_targets
from memfit.core.peft.tuners.base import (EXCLUDE, LAYERS, LAYERS_PATTERN, MODULES_TO_SAVE, TARGETS, Settings, Tuner,
                                          free, keys, only, require, sized)
from memfit.errors import MemfitError

ROOT = "base_model.model."
TUNER_ROOT = "base_model."
_STACK = re.compile(r"^(?P<prefix>[^.]+(?:\.decoder)?)\.(?P<attr>layers|h)\.(?P<idx>\d+)\.")
_BACKBONE_ATTRS = ("model", "transformer", "base_model", "decoder")
"""``_get_backbone``'s attributes, in its order (``base_model`` is transformers' ``base_model_prefix`` one)."""

_CONFIG_NAMES = {
    "num_hidden_layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "hidden_size": ("hidden_size", "n_embd", "d_model"),
    "intermediate_size": ("intermediate_size", "ffn_dim", "n_inner"),
    "num_attention_heads": ("num_attention_heads", "n_head", "num_heads"),
}
"""``_set_config_attr``'s names per override (a transformers config's ``attribute_map`` makes them one
attribute: memfit sets each one the config.json holds, the first when it holds none)."""


HEAD_DIM_STORED = frozenset({"deepseek_v3", "gemma", "gemma2", "gemma3_text", "llama", "llama4_text", "mistral", "qwen3"})
"""The model types (of memfit's Llama-like builders) whose transformers 5.24 config class stores ``head_dim`` when it
is not given (``hidden_size // num_attention_heads`` of the base: a resized mirror keeps it); the others (Qwen2,
Mixtral, Phi-3, OLMo2 ...) compute it in the attention from the resized config. Checked against transformers in
``tests/exact/test_every_tuner.py``."""


def decoder_stack(shape: ModelShape) -> tuple[str, str, int]:
    """(backbone prefix, layer-list attribute, blocks): ``_get_backbone`` + ``_get_decoder_layers`` read from
    the parameter names (``model.layers``, ``transformer.h``, OPT's ``model.decoder.layers``)."""
    blocks: dict[int, None] = {}
    prefix = attr = None
    for p in shape.params:
        m = _STACK.match(p.name)
        if m is None or (prefix is not None and (m["prefix"], m["attr"]) != (prefix, attr)):
            continue
        prefix, attr = m["prefix"], m["attr"]
        blocks.setdefault(int(m["idx"]), None)
    if prefix is None:
        raise MemfitError(f"SHADOW: {shape.name} has no decoder layer list (.layers or .h) where peft's _get_backbone "
                          "looks for one; peft cannot build a shadow backbone for it")
    return prefix, attr, len(blocks)


def _mirror_config(config: dict[str, Any], s: Settings, base_head_dim: int) -> dict[str, Any]:
    """``_build_shadow_backbone``'s copy of the base config, resized."""
    cfg = dict(config)
    layers = s["shadow_num_hidden_layers"] or 1
    overrides = {"num_hidden_layers": ("shadow_num_hidden_layers", layers),
                 "hidden_size": ("shadow_hidden_size", s["shadow_hidden_size"]),
                 "intermediate_size": ("shadow_intermediate_size", s["shadow_intermediate_size"]),
                 "num_attention_heads": ("shadow_num_attention_heads", s["shadow_num_attention_heads"])}
    if (s["shadow_hidden_size"] is not None or s["shadow_num_attention_heads"] is not None) and \
            cfg.get("head_dim") is None and cfg.get("model_type") in HEAD_DIM_STORED:
        cfg["head_dim"] = base_head_dim  # the config stored hidden // heads of the base: the copy keeps it
    for field, (key, value) in overrides.items():
        if value is None:
            continue
        require(isinstance(value, int) and value > 0, f"SHADOW {key} must be a positive integer, got {value!r}")
        for name in [n for n in _CONFIG_NAMES[field] if n in cfg] or [_CONFIG_NAMES[field][0]]:
            cfg[name] = value
    heads, kv = s["shadow_num_attention_heads"], cfg.get("num_key_value_heads")
    require(heads is None or not isinstance(kv, int) or kv <= 0 or heads % kv == 0,
            f"SHADOW shadow_num_attention_heads={heads} is not a multiple of the base's num_key_value_heads={kv}, "
            "which the mirror's config keeps: peft builds it and its attention's forward fails (repeat_kv)")
    types = cfg.get("layer_types")
    if types is not None:
        types = list(types) or ["full_attention"] * layers
        cfg["layer_types"] = types[:layers] + [types[-1]] * (layers - len(types))
    window = cfg.get("max_window_layers")
    if isinstance(window, int) and window > layers:
        cfg["max_window_layers"] = layers
    return cfg


def mirror_backbone(shape: ModelShape, s: Settings, prefix: str) -> tuple[tuple[ParamSpec, ...], tuple[BufferSpec, ...], ArchSpec]:
    """The mirror backbone's parameters and buffers (names relative to it) and its architecture."""
    from memfit.core.families import NoPureBuilder, family_for

    if shape.config is None:
        raise MemfitError("SHADOW: the mirror backbone is built from the base model's config.json, which this plan "
                          f"of {shape.name} does not carry")
    cfg = _mirror_config(dict(shape.config), s, shape.arch.head_dim)
    try:
        family = family_for(cfg)
    except NoPureBuilder as exc:
        raise MemfitError(f"SHADOW: memfit builds the mirror backbone with its own family builders and {exc}; the "
                          "shadow backbone is not planned for it") from None
    built = family.build(f"{shape.name} (shadow mirror)", cfg, "causal-lm")
    start = prefix + "."
    params = tuple(ParamSpec(p.name[len(start):], p.shape, True) for p in built.params if p.name.startswith(start))
    buffers = tuple(BufferSpec(b.name[len(start):], b.shape, b.dtype, b.persistent, True)
                    for b in built.buffers if b.name.startswith(start))
    return params, buffers, built.arch


def mirror_arch(shape: ModelShape, s: Settings, prefix: str) -> tuple[ArchSpec, int, bool]:
    """(the mirror backbone's architecture, its hidden size, whether its first block's input requires grad: it
    reads its own trained embeddings, or GPT-2's trained ``wpe`` is added to the shared ones)."""
    params, _, arch = mirror_backbone(shape, s, prefix)
    share = s["share_embeddings"] and arch.hidden_size == shape.arch.hidden_size
    own = [p for p in params if not _STACK.match(f"{prefix}.{p.name}") and p.name.count(".") == 1
           and p.name.split(".")[0] in EMBEDDING_LAYER_NAMES and not (share and p.name.startswith("embed_tokens."))]
    return arch, arch.hidden_size, bool(own)


def shadow(shape: ModelShape, spec: PeftSpec, s: Settings) -> ModelShape:
    """The base with each target block wrapped (``.base_layer.`` + the block's shadow tensors after its last
    parameter), ``modules_to_save`` wrapped, then the tuner's shadow backbone, projection and head."""
    require(spec.target_modules_pattern is None or not (spec.layers_to_transform or spec.layers_pattern),
            "`layers_to_transform` cannot be used when `target_modules` is a str (ShadowConfig raises)")
    require(not spec.layers_pattern or spec.layers_to_transform,
            "When `layers_pattern` is specified, `layers_to_transform` must also be specified (ShadowConfig raises)")
    r = s["r"]
    require(isinstance(r, int) and r > 0, f"`r` should be a positive integer value but the value passed is {r}")
    update = s["update_hidden_size"] or r
    require(isinstance(update, int) and update > 0, f"SHADOW update_hidden_size must be positive, got {update!r}")
    prefix, attr, count = decoder_stack(shape)
    stack = f"{prefix}.{attr}"
    blocks = [f"{stack}.{i}" for i in range(count)]
    layers = find_targets(shape, spec, what="SHADOW", defaults={shape.arch.model_type: tuple(blocks)},
                          kinds=frozenset({"linear", "conv1d", "embedding", "norm", "other"}))
    targets = [layer.module for layer in layers]
    for t in targets:
        require(t in blocks, f"SHADOW target {t!r} is not a decoder block ({stack}.<i>): a ShadowLayer wraps whole "
                "blocks (ShadowConfig.target_modules) and memfit plans only that")
    indices = sorted(blocks.index(t) for t in targets)
    require(indices == list(range(indices[0], indices[-1] + 1)), f"SHADOW targets {', '.join(targets)} are not "
            "contiguous: the shadow state rides the decoder loop from the first wrapped block to the last "
            "(ShadowConfig.target_modules), a gap would hand a ShadowCarrier to an unwrapped block")
    d = shape.arch.hidden_size
    adapter = [(f"shadow_down.{ADAPTER_NAME}.weight", (r, d)), (f"shadow_up.{ADAPTER_NAME}.weight", (d, r))]
    for mlp in ("shadow_update_transform", "shadow_update_gate"):
        adapter += [(f"{mlp}.{ADAPTER_NAME}.0.weight", (update, d)), (f"{mlp}.{ADAPTER_NAME}.0.bias", (update,)),
                    (f"{mlp}.{ADAPTER_NAME}.2.weight", (d, update)), (f"{mlp}.{ADAPTER_NAME}.2.bias", (d,))]
    last: dict[str, int] = {}
    for i, p in enumerate(shape.params):
        block = under_any(p.name, targets)
        if block is not None:
            last[block] = i
    task = task_type(shape, spec)
    wrapped = checked_modules_to_save(shape, spec, targets, "SHADOW")
    paired: list[tuple[ParamSpec, list[ParamSpec]]] = []
    for i, p in enumerate(shape.params):
        block = under_any(p.name, targets)
        if block is None:
            paired.append((ParamSpec(p.name, p.shape, False), []))
            continue
        extra = [ParamSpec(f"{block}.{name}", dims, True) for name, dims in adapter] if last[block] == i else []
        paired.append((ParamSpec(f"{block}.base_layer{p.name[len(block):]}", p.shape, False), extra))
    params = list(flatten(with_modules_to_save(paired, wrapped), ROOT))
    backbone, backbone_buffers, backbone_arch = mirror_backbone(shape, s, prefix)
    shadow_hidden = backbone_arch.hidden_size
    share = s["share_embeddings"] and shadow_hidden == d
    at = f"{TUNER_ROOT}shadow_backbone.{ADAPTER_NAME}."
    params += [ParamSpec(at + p.name, p.shape, True) for p in backbone
               if not (share and p.name.startswith("embed_tokens."))]
    if shadow_hidden != d:
        params.append(ParamSpec(f"{TUNER_ROOT}shadow_projection.{ADAPTER_NAME}.weight", (d, shadow_hidden), True))
    if task == "SEQ_CLS":
        head = next((h for h in ("score", "classifier") if any(p.name.startswith(h + ".") for p in shape.params)),
                    None)
        if head is not None:
            params += [ParamSpec(f"{TUNER_ROOT}shadow_head.{ADAPTER_NAME}{p.name[len(head):]}", p.shape, True)
                       for p in shape.params if p.name.startswith(head + ".")]
    buffers = tuple(BufferSpec(at + b.name, b.shape, b.dtype, b.persistent, b.follows_load_dtype)
                    for b in backbone_buffers)
    return shape.with_params(tuple(params)).with_buffers((*shape.buffers, *buffers))


TUNER = Tuner(
    peft_type="SHADOW", method="shadow", prefix="shadow_", source="peft/tuners/shadow/config.py, model.py, layers.py",
    build=shadow,
    note=("SHADOW activations: the wrapped blocks' shadow tensors as peft's layer keeps them (kept under "
          "checkpointing: the ShadowLayer wraps the checkpointed block), the exit block's update graph partly "
          "released as measured on peft 0.21.2 (its gate branch stays), the mirror backbone as a fully trained model "
          "of its sizes, never checkpointed, its key/value cache kept with the outputs (the config's use_cache), and "
          "the shadow loss's log-softmax; within 0.02% of a trace, checkpointed or not "
          "(tests/trace/test_tuner_activations_vs_trace.py)"),
    keys=keys(
        target_modules=TARGETS,
        exclude_modules=EXCLUDE,
        r=sized("int", 8, "rank of shadow_down / shadow_up"),
        shadow_alpha=free("float", 0.1, "scales the injected correction"),
        shadow_dropout=sized("float", 0.2, "dropout on the discrepancy h - s before shadow_down (a mask per block)"),
        init_weights=free("bool", True, "zero shadow_up or not: same shapes"),
        shadow_model=only("mirror", "a shadow_model checkpoint (a path or hub id) holds the backbone's sizes in its "
                          "own config.json and weights, which memfit is not given; only the mirror backbone built "
                          "from the base's config is planned", "str"),
        shadow_num_hidden_layers=sized("int", None, "the mirror backbone's depth (default 1)"),
        shadow_hidden_size=sized("int", None, "the mirror backbone's width (a projection to the base width when it "
                                 "differs)"),
        shadow_num_attention_heads=sized("int", None, "the mirror backbone's attention heads"),
        shadow_intermediate_size=sized("int", None, "the mirror backbone's MLP width"),
        share_embeddings=sized("bool", True, "the mirror reads the base's frozen embeddings (its embed_tokens removed)"),
        update_hidden_size=sized("int", None, "width of the update MLPs T and G (default r)"),
        auxiliary_loss_weight=sized("float", 0.05, "above 0: the shadow loss runs the LM head on the shadow state "
                                    "(a second logits tensor)"),
        layers_to_transform=LAYERS,
        layers_pattern=LAYERS_PATTERN,
        modules_to_save=MODULES_TO_SAVE,
    ),
)
