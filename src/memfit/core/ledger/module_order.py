"""The order in which a training step runs the model's modules, from the parameter names alone.

ZeRO-3 gathers a module's parameters in its forward (and backward) pre-hook and may release them
in the post-hook (``memfit.core.ledger.zero3_fetch``); the ledger's in-step phases interleave those
gathers with the activations each transformer block keeps. Without tracing the model (``memfit
plan --exact`` does), the order is rebuilt from ``named_parameters()`` names:

- modules are the name prefixes of the parameters (``a.b.c.weight`` is owned by ``a.b.c``; ``a.b``
  and ``a`` are its containers, and the root ``""`` is the model); children run in the order their
  first parameter appears, a container's pre-hook before its children and its post-hook after
  (``nn.Module.__call__``); PEFT's prompt/prefix encoder (``prompt_encoder``) runs first
  (``PeftModelForCausalLM.forward`` calls ``get_prompt`` before the base model);
- backward mirrors the forward (DeepSpeed's pre-backward hook fires when the gradient reaches a
  module's output, the post-backward hook when it reaches its input), for modules whose output
  depends on a trained parameter; a post-backward hook fires only if the module's input needs a
  gradient too (a trained parameter ran before it, or checkpointing made the embeddings' output
  require grad), else DeepSpeed releases it at the end of the backward
  (``release_backward_leftovers``);
- with gradient checkpointing, a block's backward re-runs its forward when its first backward node
  (its last leaf's) unpacks a saved tensor (non-reentrant ``torch.utils.checkpoint``): the forward
  hooks of the block's children fire again inside the backward, not the block's own (transformers'
  ``GradientCheckpointingLayer`` checkpoints the block's forward inside its ``__call__``; seen in
  the replay's coordinator log);
- the transformer blocks are the numbered children (``layers.0``, ``h.17``, ``block.3``) of the
  containers that hold ``num_layers`` of them together (two stacks for encoder-decoders).

What the names cannot tell, and so is approximated: modules without parameters (activations,
rotary embeddings, dropout) are not in the order (ZeRO-3 fetches them too, which only moves
prefetches a little earlier), and the order of a block's children is their registration order
(Llama registers its norms after attention and MLP but runs the first norm before them).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

PROMPT_ENCODER = "prompt_encoder"
LORA_CHILDREN = ("lora_A",)
"""peft LoRA layers read this child's weight in their own forward (``Linear.forward``: ``lora_A.weight.dtype``)."""


@dataclass(frozen=True, slots=True)
class ModuleOrder:
    """Modules, their own parameters, and the hook events of one forward and one backward."""

    names: tuple[str, ...]
    """Module names (``""`` is the root); the index is the module id used below."""
    params: tuple[tuple[int, ...], ...]
    """Per module, the indices (into the parameter list given) of the params it owns directly."""
    forward: tuple[tuple[bool, int], ...]
    """``(is_pre, module)`` hook events of the forward."""
    backward: tuple[tuple[bool, int], ...]
    """``(is_pre, module)`` hook events of the backward (``is_pre``: pre-backward hook; forward
    hooks of a checkpoint recompute appear as ``(True, m)``/``(False, m)`` with ``m`` in
    ``recompute`` marks, see ``backward_forward``)."""
    backward_forward: tuple[bool, ...]
    """Per backward event: True when it is a forward hook of a checkpoint recompute."""
    externals: tuple[tuple[int, ...], ...]
    """Per module, params of *other* modules its forward reads, which DeepSpeed registers as its
    external parameters the first time (``parameter_offload.py:ZeROOrderedDict.__getitem__`` ->
    ``register_external_parameter``) and from then on gathers and releases with it: peft's LoRA
    layer reads ``lora_A[adapter].weight`` (for its dtype)."""
    layers: tuple[int, ...]
    """Module ids of the transformer blocks, in forward order (empty: not recognised)."""
    chain_max: int
    """Largest elements owned by one module and its ancestors together (active at once)."""

    def fetched(self, m: int, complete: bool) -> tuple[int, ...]:
        """The params module ``m``'s hooks gather and release: its own, plus its external params
        once the first step has registered them."""
        return self.params[m] + self.externals[m] if complete else self.params[m]


def build_module_order(names: Sequence[str], numels: Sequence[int], trainable: Sequence[bool], *,
                       num_layers: int, checkpointing: bool = False) -> ModuleOrder:
    """The order of ``names`` (``named_parameters()`` names, in order) as described in the module
    docstring. ``num_layers`` is the number of transformer blocks (both stacks of an
    encoder-decoder)."""
    index: dict[str, int] = {"": 0}
    mod_names: list[str] = [""]
    children: dict[int, list[int]] = {0: []}
    own: dict[int, list[int]] = {0: []}

    def module(path: str) -> int:
        if path in index:
            return index[path]
        parent = module(path.rsplit(".", 1)[0] if "." in path else "")
        i = len(mod_names)
        index[path] = i
        mod_names.append(path)
        children[i] = []
        own[i] = []
        children[parent].append(i)
        return i

    for pi, name in enumerate(names):
        owner = module(name.rsplit(".", 1)[0] if "." in name else "")
        own[owner].append(pi)
    # PEFT prompt/prefix encoders run before the base model
    root = children[0]
    root.sort(key=lambda c: 0 if mod_names[c].split(".")[0] == PROMPT_ENCODER else 1)
    for kids in children.values():
        _run_order(kids, mod_names)

    forward: list[tuple[bool, int]] = []

    def walk(m: int) -> None:
        forward.append((True, m))
        for c in children[m]:
            walk(c)
        forward.append((False, m))

    walk(0)
    layers = _find_layers(mod_names, children, num_layers)
    # which modules see a gradient: output depends on a trained param run before the post-hook;
    # input needs a gradient if a trained param ran before the pre-hook (or checkpointing made the
    # embeddings' output require grad: enable_input_require_grads)
    trained_mod = {m for m, ps in own.items() if any(trainable[p] for p in ps)}
    first_layer_pre = forward.index((True, layers[0])) if layers else None
    seen_trained = False
    out_grad: dict[int, bool] = {}
    in_grad: dict[int, bool] = {}
    for pos, (is_pre, m) in enumerate(forward):
        if is_pre:
            in_grad[m] = seen_trained or (checkpointing and first_layer_pre is not None and pos >= first_layer_pre)
        if m in trained_mod and is_pre:
            seen_trained = True
        if not is_pre:
            out_grad[m] = seen_trained or in_grad[m]
    subtree_of = {L: set(_subtree(L, children)) for L in layers} if checkpointing else {}
    layer_of_pos: dict[int, int] = {}
    if checkpointing:
        for L in layers:
            a, b = forward.index((True, L)), forward.index((False, L))
            for pos in range(a, b + 1):
                layer_of_pos[pos] = L
    backward: list[tuple[bool, int]] = []
    recompute: list[bool] = []
    pending: int | None = None  # a checkpointed block whose forward has not been re-run yet
    for pos in range(len(forward) - 1, -1, -1):
        is_pre, m = forward[pos]
        if not out_grad.get(m, False):
            continue
        if not is_pre:  # the gradient reaches the module's output: pre-backward hook
            backward.append((True, m))
            recompute.append(False)
            if checkpointing and m in subtree_of:
                pending = m
            elif pending is not None and not children[m]:
                # the block's first backward node (its last leaf's) unpacks a saved tensor: the
                # block's forward runs again, its children's hooks only (the checkpointed call is
                # the block's own forward, inside its __call__)
                a, b = forward.index((True, pending)), forward.index((False, pending))
                for ev in forward[a + 1:b]:
                    backward.append(ev)
                    recompute.append(True)
                pending = None
        elif in_grad.get(m, False):  # ... and its input: post-backward hook
            backward.append((False, m))
            recompute.append(False)
    params = tuple(tuple(own[i]) for i in range(len(mod_names)))
    ext: dict[int, list[int]] = {}
    for pi, name in enumerate(names):
        parts = name.split(".")
        for k, part in enumerate(parts[:-1]):
            if part in LORA_CHILDREN and k >= 1:
                ext.setdefault(index[".".join(parts[:k])], []).append(pi)
                break
    externals = tuple(tuple(ext.get(i, ())) for i in range(len(mod_names)))
    chain = {0: sum(numels[p] for p in own[0])}
    for i in range(1, len(mod_names)):  # parents are created before their children
        parent = index[mod_names[i].rsplit(".", 1)[0] if "." in mod_names[i] else ""]
        chain[i] = chain[parent] + sum(numels[p] for p in own[i])
    return ModuleOrder(names=tuple(mod_names), params=params, externals=externals, forward=tuple(forward), backward=tuple(backward),
                       backward_forward=tuple(recompute), layers=layers, chain_max=max(chain.values()))


def _run_order(kids: list[int], names: list[str]) -> None:
    """Llama-style blocks register ``self_attn, mlp, input_layernorm, post_attention_layernorm``
    but run ``input_layernorm, self_attn, post_attention_layernorm, mlp``
    (``LlamaDecoderLayer.forward``; Mistral, Qwen2 and others copy it): put the norms where they run."""
    last = {names[k].rsplit(".", 1)[-1]: k for k in kids}
    if "input_layernorm" in last:
        kids.remove(last["input_layernorm"])
        kids.insert(0, last["input_layernorm"])
    attn = last.get("self_attn")
    if "post_attention_layernorm" in last and attn is not None:
        kids.remove(last["post_attention_layernorm"])
        kids.insert(kids.index(attn) + 1, last["post_attention_layernorm"])


def _subtree(m: int, children: dict[int, list[int]]) -> list[int]:
    out = [m]
    for c in children[m]:
        out += _subtree(c, children)
    return out


def _find_layers(names: list[str], children: dict[int, list[int]], num_layers: int) -> tuple[int, ...]:
    """The numbered children of the containers holding the most of them, until ``num_layers``."""
    stacks = []
    for parent, kids in children.items():
        numbered = [k for k in kids if names[k].rsplit(".", 1)[-1].isdigit()]
        if len(numbered) >= 2:
            stacks.append(numbered)
    stacks.sort(key=len, reverse=True)
    chosen: list[int] = []
    for s in stacks:
        if len(chosen) + len(s) > num_layers:
            continue
        chosen += s
        if len(chosen) == num_layers:
            return tuple(sorted(chosen))
    if num_layers == 1:  # a single block is not "numbered children" of anything with two
        for kids in children.values():
            numbered = [k for k in kids if names[k].rsplit(".", 1)[-1].isdigit()]
            if len(numbered) == 1:
                return tuple(numbered)
    return ()
