"""SHADOW's saved tensors, read from peft 0.21.2 ``tuners/shadow/layers.py`` (``ShadowLayer.shadow_inject``,
``shadow_update``) and ``model.py`` (``_compute_initial_shadow_state``, ``shadow_auxiliary_loss``), checked against
the whole model traced (``tests/trace/test_tuner_activations_vs_trace.py``).

Per wrapped block (``d`` the base width, ``r`` the rank, ``u`` the update MLPs' width; ``A`` the adapter's element
size, ``E`` a matmul's output's):

- inject: ``delta = (h - s).to(A)``; the dropout keeps its bool mask (``shadow_dropout`` > 0) and its output, which
  ``shadow_down`` keeps (``delta`` itself without dropout): ``d A`` (+ ``d``); ``shadow_up`` keeps ``down``'s output
  ``r E``; ``alpha *`` and the adds keep nothing. The block's input (``h + alpha * delta``) requires grad in every
  wrapped block, the first included (``SideModel.feeds_blocks``);
- update: ``h_out.to(A)``, read by both MLPs' first Linear (``d A``, once); each MLP keeps its GELU's input and
  output (``2 u E`` each); ``sigmoid`` keeps its output ``g``; ``(1 - g) * s`` keeps ``1 - g`` and ``s`` (the previous
  shadow state), ``g * t`` keeps ``t`` (``g`` already kept): ``4 d`` more.

The exit block's new shadow state is never used (``_unwrap_exit_hook`` keeps only the carrier's ``.hidden``), and
part of its update graph is released with it: measured on peft's own model (CPU autograd, a weak reference to every
saved tensor, read after the forward), the transform MLP's two ``u``-wide tensors, the candidate, ``1 - g`` and the
previous state (``3 d + 2 u`` per token) are freed, the gate MLP's branch is not (what still holds it is not read
yet); the side model takes them back. Beside the blocks (``SideModel``): the mirror backbone's own blocks, fully trained
(planned by the same activation model as any model's, at its own sizes); a projection's input when the widths
differ; and under CAUSAL_LM the shadow loss: ``lm_head(s0)`` (frozen weight: keeps nothing) then
``F.cross_entropy`` of the shifted logits in the model's dtype, whose log-softmax ``(tokens - sequences) x vocab``
stays alive whatever ``auxiliary_loss_weight`` is (``last_shadow_loss = shadow_loss.detach()`` is a view whose
``_base`` holds the loss and its graph; at weight 0 nothing backpropagates it, so it lives until the next forward).
"""

from __future__ import annotations

from memfit.core.activations.adapters import AdaptedLayer, DtypeContext, Saved, SideModel, matmul_input, out_elem
from memfit.core.model import ModelShape
from memfit.core.peft.spec import PeftSpec


def shadow_block(layer: AdaptedLayer, spec: PeftSpec, ctx: DtypeContext) -> Saved:
    """One wrapped block's inject and update (module doc)."""
    r, d = layer.shape("shadow_down")
    u = layer.shape("shadow_update_transform")[0]
    A, E = ctx.adapter, out_elem(ctx)
    drop = spec.setting("shadow_dropout", 0.2)
    inject = matmul_input(A, False, d, ctx) + matmul_input(E, False, r, ctx) + Saved(per_token=d if drop else 0)
    update_in = matmul_input(A, False, d, ctx)
    if ctx.autocast and A != ctx.autocast:  # autocast caches weights only: each first Linear makes its own copy
        update_in = update_in + update_in
    return inject + update_in + Saved(per_token=4 * u * E + d * E + d * E + d * A + d * E)


def shadow_side(shape: ModelShape, spec: PeftSpec, elem: int) -> SideModel:
    """The mirror backbone, its projection's input, the shadow loss and the exit block's shared output."""
    from memfit.core.peft.modules import task_type
    from memfit.core.peft.tuners import TUNERS
    from memfit.core.peft.tuners.shadow import decoder_stack, mirror_arch

    tuner = TUNERS["shadow"]
    s = tuner.settings(spec, shape.arch.model_type)
    base = _base_view(shape)
    prefix, _, _ = decoder_stack(base)
    arch, shadow_hidden, own_embeddings = mirror_arch(base, s, prefix)
    d = shape.arch.hidden_size
    before = Saved(per_token=shadow_hidden * elem) if shadow_hidden != d else Saved()
    u = s["update_hidden_size"] or s["r"]
    after = Saved(per_token=-(3 * d + 2 * u) * elem)  # what the exit block's released update frees (module doc)
    if task_type(shape, spec) == "CAUSAL_LM":
        V = shape.arch.vocab_size
        after = after + Saved(per_token=V * elem, per_sample=-V * elem, fixed=elem)  # shifted log-softmax, the loss
    return SideModel(arch=arch, input_trains=own_embeddings, before=before, after=after,
                     note="the mirror backbone planned as a fully trained model of its sizes, its input frozen when it reads "
                           "the base's embeddings, its key/value cache kept with the outputs")


def _base_view(shape: ModelShape) -> ModelShape:
    """The transformers model's own parameter names (``base_model.model.`` and ``.base_layer`` taken off), which
    ``decoder_stack`` reads."""
    from memfit.core.model import ParamSpec

    return shape.with_params(tuple(ParamSpec(p.name.removeprefix("base_model.model.").replace(".base_layer.", "."), p.shape,
                             p.trainable) for p in shape.params if not p.name.startswith("base_model.shadow_")))


FORMULAS = {"shadow": shadow_block}
SIDES = {"shadow": shadow_side}
SIDE_PREFIXES = ("base_model.shadow_backbone.",)
"""Where peft puts the backbone's parameters (``ShadowModel._init_shadow_backbone``): not the model's blocks."""
