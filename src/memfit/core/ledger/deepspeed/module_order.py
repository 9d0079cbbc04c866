"""The order in which a training step runs the model's modules, from the parameter names alone.

ZeRO-3 gathers a module's parameters in its forward (and backward) pre-hook and may release them
in the post-hook (``memfit.core.ledger.deepspeed.zero3_fetch``); the ledger's in-step phases interleave those
gathers with the activations each transformer block keeps. Without tracing the model (``memfit
plan --exact`` does), the order is rebuilt from ``named_parameters()`` names:

- modules are the name prefixes of the parameters (``a.b.c.weight`` is owned by ``a.b.c``; ``a.b``
  and ``a`` are its containers, and the root ``""`` is the model); children run in the order their
  first parameter appears, a container's pre-hook before its children and its post-hook after
  (``nn.Module.__call__``); PEFT's prompt/prefix encoder (``prompt_encoder``) runs first
  (``PeftModelForCausalLM.forward`` calls ``get_prompt`` before the base model);
- backward mirrors the forward (DeepSpeed's pre-backward hook fires when the gradient reaches a
  module's output, the post-backward hook when it reaches its input), for modules whose output
  needs a gradient; a post-backward hook fires only if the module's input needs one too, else
  DeepSpeed releases it at the end of the backward (``release_backward_leftovers``). Which do
  follows the data (``_grad_flow``): the q/k/v projections read their attention's input, not each
  other's output, so a frozen one fed by the frozen embeddings has no backward (LoRA's first
  block); prefix tuning's trained prefix enters each attention's core as keys and values, not the
  hidden states, so the embeddings, the first block's projections and, in a parallel block
  (GPT-J), its MLP have none either (checked against every ZeRO-3 replay's fetch order: the
  DeepSpeed coordinator's hooks, logged);
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

from memfit.core.lean_dataclass import dataclass

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
    ``register_external_parameter`` on the module on top of ``FWD_MODULE_STACK``, gathering it
    with ``param.all_gather()`` outside the coordinator) and from then on gathers and releases with
    it: peft's LoRA layer reads ``lora_A[adapter].weight`` (for its dtype); peft's ``get_prompt``
    reads the prompt encoder's ``embedding.weight`` (for its device) in the PeftModel's forward, so
    it is the root's."""
    layers: tuple[int, ...]
    """Module ids of the transformer blocks, in forward order (empty: not recognised)."""
    chain_max: int
    """Largest elements owned by one module and its ancestors together (active at once)."""



def build_module_order(names: Sequence[str], numels: Sequence[int], trainable: Sequence[bool], *,
                       num_layers: int, checkpointing: bool = False, parallel_blocks: bool = False,
                       prefix_kv: bool = False) -> ModuleOrder:
    """The order of ``names`` (``named_parameters()`` names, in order) as described in the module
    docstring. ``num_layers`` is the number of transformer blocks (both stacks of an
    encoder-decoder); ``parallel_blocks``: attention and MLP read the same normed input
    (``flow_flags``); ``prefix_kv``: the trained prompt encoder's output enters every attention as
    keys and values (prefix tuning), not the hidden states."""
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
    # peft's prompt learning keeps the input embeddings as PeftModel.word_embeddings as well
    # (peft_model.py PeftModel._setup_prompt_encoder): DeepSpeed's _register_deepspeed_module walks
    # module.children() of each parent (parameter_offload.py), so that module gets its hooks twice
    # and every call runs both
    twice = next((i for i, n in enumerate(mod_names) if n.rsplit(".", 1)[-1] in INPUT_EMBEDDINGS
                  and n.split(".")[0] != PROMPT_ENCODER), None) if any(
        n.split(".")[0] == PROMPT_ENCODER for n in mod_names) else None

    def walk(m: int) -> None:
        n = 2 if m == twice else 1
        forward.extend([(True, m)] * n)
        for c in children[m]:
            walk(c)
        forward.extend([(False, m)] * n)

    walk(0)
    layers = _find_layers(mod_names, children, num_layers)
    in_grad, out_grad = _grad_flow(mod_names, children, own, trainable, layers, checkpointing=checkpointing,
                                   parallel_blocks=parallel_blocks, prefix_kv=prefix_kv)
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
        if parts[0] == PROMPT_ENCODER and parts[-2:] == ["embedding", "weight"]:
            ext.setdefault(0, []).append(pi)  # peft's get_prompt, in the PeftModel's forward
    externals = tuple(tuple(ext.get(i, ())) for i in range(len(mod_names)))
    chain = {0: sum(numels[p] for p in own[0])}
    for i in range(1, len(mod_names)):  # parents are created before their children
        parent = index[mod_names[i].rsplit(".", 1)[0] if "." in mod_names[i] else ""]
        chain[i] = chain[parent] + sum(numels[p] for p in own[i])
    return ModuleOrder(names=tuple(mod_names), params=params, externals=externals, forward=tuple(forward), backward=tuple(backward),
                       backward_forward=tuple(recompute), layers=layers, chain_max=max(chain.values()))


INPUT_BRANCHES = frozenset({
    "q_proj", "k_proj", "v_proj", "query", "key", "value", "q", "k", "v", "qkv_proj", "query_key_value", "c_attn",
    "Wqkv", "W_pack", "gate_proj", "up_proj", "gate_up_proj", "w1", "w3", "wi_0", "wi_1", "base_layer",
})
"""Children that read their container's input rather than what its earlier children made: the
attention's q/k/v projections (``LlamaAttention.forward``: ``q_proj(hidden_states)``,
``k_proj(hidden_states)``, ``v_proj(hidden_states)``; GPT-J's, GPT-2's ``c_attn``, NeoX's
``query_key_value``), a gated MLP's gate and up projections (``LlamaMLP.forward``:
``down_proj(act_fn(gate_proj(x)) * up_proj(x))``), and a peft LoRA layer's ``base_layer``."""
INPUT_EMBEDDINGS = frozenset({"embed_tokens", "wte", "word_embeddings", "embed_in", "shared"})
"""What ``get_input_embeddings()`` returns in the families memfit builds (Llama, GPT-J/GPT-2, BERT/Bloom,
GPT-NeoX, T5)."""
ATTENTION = frozenset({"attn", "self_attn", "attention", "self_attention", "SelfAttention", "self"})
"""Containers whose attention core concatenates the cached keys and values (peft's prefix tuning
passes its prefix as the cache: ``GPTJAttention.forward``/``LlamaAttention.forward``:
``cache.update(key, value, ...)``; BERT's is its ``attention.self``)."""


def flow_flags(arch, peft_method: str) -> dict[str, bool]:
    """``build_module_order``'s data-flow settings for a model and PEFT method: ``parallel_blocks``
    (GPT-J, CodeGen, Phi and the layouts marked ``parallel``: ``GPTJBlock.forward`` feeds ``ln_1``'s
    output to both ``attn`` and ``mlp``), ``prefix_kv`` (peft prefix tuning)."""
    layout = getattr(arch, "layout", None)
    parallel = bool(layout is not None and layout.parallel) or arch.model_type in ("gptj", "codegen", "phi")
    return {"parallel_blocks": parallel, "prefix_kv": peft_method == "prefix"}


def _grad_flow(names: list[str], children: dict[int, list[int]], own: dict[int, list[int]],
               trainable: Sequence[bool], layers: tuple[int, ...], *, checkpointing: bool, parallel_blocks: bool,
               prefix_kv: bool) -> tuple[dict[int, bool], dict[int, bool]]:
    """Per module: does its input need a gradient (DeepSpeed's post-backward hook fires only then:
    ``parameter_offload.py`` ``PostBackwardFunctionModule.setup_context``, ``if
    output_in.requires_grad``), does its output (the pre-backward hook is an autograd Function on
    the outputs: ``PreBackwardFunctionForModule``, whose backward runs only for an output that
    requires grad)? A module's output needs a gradient when its input does or it trains a param.
    Inputs follow the data: a container's children read what its earlier children made (and its
    input, the residual stream), but for ``INPUT_BRANCHES`` (they read the container's input); in a
    parallel block a norm reads the block's input and the attention and MLP the last norm's output;
    with prefix tuning an attention's core joins the trained prefix to its keys and values, so what
    reads the core needs a gradient, and the prompt encoder's output feeds no hidden state;
    with checkpointing the input embeddings' output needs a gradient (transformers'
    ``gradient_checkpointing_enable`` calls ``enable_input_require_grads`` for a model whose
    ``main_input_name`` is ``input_ids``: a forward hook doing ``output.requires_grad_(True)``), and so
    every block's input (if the embedding is not recognised, the blocks' inputs alone). The prompt encoder of prompt tuning and
    P-tuning joins the input embeddings, so what runs after it needs a gradient."""
    in_grad: dict[int, bool] = {}
    out_grad: dict[int, bool] = {}
    layer_set = set(layers)

    def tail(m: int) -> str:
        return names[m].rsplit(".", 1)[-1]

    def norm(m: int) -> bool:
        t = tail(m).lower()
        return "norm" in t or t.startswith("ln")

    def flow(m: int, gin: bool) -> bool:
        in_grad[m] = gin
        seen = gin or any(trainable[p] for p in own[m])
        last_norm = gin
        core = prefix_kv and tail(m) in ATTENTION and names[m].split(".")[0] != PROMPT_ENCODER
        for c in children[m]:
            t = tail(c)
            if checkpointing and c in layer_set:
                cin = True
            elif t in INPUT_BRANCHES:
                cin = gin
            elif parallel_blocks and m in layer_set:
                cin = gin if norm(c) else last_norm
            else:
                cin = seen or core
            out = flow(c, cin)
            if checkpointing and t in INPUT_EMBEDDINGS and not layer_set & set(_subtree(c, children)):
                out = out_grad[c] = True  # enable_input_require_grads: output.requires_grad_(True)
            if parallel_blocks and m in layer_set and norm(c):
                last_norm = out
            if not (prefix_kv and m == 0 and t == PROMPT_ENCODER):
                seen = seen or out
        out_grad[m] = seen or core
        return out_grad[m]

    flow(0, False)
    return in_grad, out_grad


def _run_order(kids: list[int], names: list[str]) -> None:
    """Llama-style blocks register ``self_attn, mlp, input_layernorm, post_attention_layernorm``
    but run ``input_layernorm, self_attn, post_attention_layernorm, mlp``
    (``LlamaDecoderLayer.forward``; Mistral, Qwen2 and others copy it): put the norms where they
    run; an attention that registers ``k_proj`` before ``q_proj`` runs q first."""
    last = {names[k].rsplit(".", 1)[-1]: k for k in kids}
    if "input_layernorm" in last:
        kids.remove(last["input_layernorm"])
        kids.insert(0, last["input_layernorm"])
    attn = last.get("self_attn")
    if "post_attention_layernorm" in last and attn is not None:
        kids.remove(last["post_attention_layernorm"])
        kids.insert(kids.index(attn) + 1, last["post_attention_layernorm"])
    # GPT-J registers k_proj, v_proj, q_proj but runs q first (GPTJAttention.forward)
    if "q_proj" in last and "k_proj" in last and kids.index(last["q_proj"]) > kids.index(last["k_proj"]):
        kids.remove(last["q_proj"])
        kids.insert(kids.index(last["k_proj"]), last["q_proj"])


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
