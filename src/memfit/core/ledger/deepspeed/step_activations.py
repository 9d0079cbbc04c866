"""The step's activation tensors, segment by segment: what the forward keeps per block, the logits
and the loss, and what the backward frees (``memfit.core.activations.analytic`` gives the bytes).

Shared by every framework's step recipe (``memfit.core.ledger.deepspeed.step`` for DeepSpeed) and mirrored by
the recommender's estimator (``memfit.core.recommend.deepspeed.aggregates.activation_segments``). One event is
one tensor (BRIEF contract 2): ``(key, +bytes)`` allocates it, ``(key, -bytes)`` frees it.

Forward, per segment (``step_segments``): the embeddings' tensors before the first block, one set per
block (its saved tensors, or with checkpointing what it holds), then after the last block the head's
saved tensors, the logits the outputs hold, and the loss as transformers computes it
(transformers/loss/loss_utils.py ``ForCausalLMLoss``): ``logits.float()`` (an fp32 copy), the label
copies, ``cross_entropy`` = ``log_softmax`` (saved for backward) + ``nll_loss``; the fp32 copy and the
label copies die when the loss returns. The forward's peak is there: the saved activations plus
every loss tensor at once (``ActivationEstimate.forward_peak_bytes``).

Backward, when it starts (the head's segment, before any parameter gradient): ``nll_loss_backward``
makes the gradient of the log-softmax output, ``_log_softmax_backward_data`` its input's gradient
(both logits-sized, fp32 after an upcast, while the saved log-softmax is alive: the backward's loss
peak, ``backward_peak_bytes``); then the first gradient and the saved log-softmax are released,
``ToCopyBackward`` casts the gradient back to the training dtype, and that gradient lives through
the head's backward. Each block's activations go after its backward; with checkpointing a block's
activations are rebuilt at the start of its backward (``recompute``). The logits the outputs hold and
the embeddings' tensors go at the end of the backward.
"""

from __future__ import annotations

from memfit.core.activations.analytic import ActivationEstimate
from memfit.core.activations.tensors import ActivationTensors
from memfit.core.ledger.timeline import Timeline
from memfit.core.ledger_types import Device

ACT = "step.activations"
LOGITS = "step.logits"
LOSS_SAVED = "step.loss_log_softmax"
LOSS_FWD = "step.loss_forward"
LOSS_BWD = "step.loss_backward"
RECOMPUTE = "step.checkpoint_recompute"

Event = tuple[str, int]


class ActivationPlan:
    """Which activation tensors each forward segment allocates while its modules run (``fwd``, placed
    at the segment's highest point of ZeRO-3 gathered params) and after them (``fwd_after``: the loss,
    which runs once the head's modules have released their params); in each backward segment, what
    runs before its modules fetch anything (``bwd_pre``: the loss's backward, first of all), the
    checkpoint recompute (``recompute``: bytes rebuilt while the segment's block runs its backward),
    and what is freed after the gradients (``bwd_free``). Segments as ``step_segments.StepLayout``:
    with no block recognised everything is allocated in the first and freed at the end.

    ``tensors`` (``memfit.core.activations.tensors.split_estimate``): each layer's, the embeddings' and
    the head's activations as the tensors they are, allocated one by one in order and freed in reverse
    (a recompute likewise: ``recompute_tensors``); without it each part is one tensor. The sums per
    segment, which the recommender's estimator reads, are the same either way."""

    def __init__(self, est: ActivationEstimate, blocks: int, n_segments: int, dtype_bytes: int, checkpointing: bool,
                 num_layers: int, tensors: ActivationTensors | None = None) -> None:
        L = num_layers
        self.fwd: list[list[Event]] = [[] for _ in range(n_segments)]
        self.fwd_after: list[list[Event]] = [[] for _ in range(n_segments)]
        self.bwd_pre: list[list[Event]] = [[] for _ in range(n_segments + 1)]
        self.bwd_free: list[list[Event]] = [[] for _ in range(n_segments + 1)]
        self.recompute = [0] * (n_segments + 1)
        layer = list(est.per_layer_bytes())
        recompute = est.recompute_per_layer() if checkpointing else (0,) * L
        if len(layer) != L:  # an estimate without per-layer groups: the total spread evenly
            held = est.total_bytes - est.embedding_bytes - est.head_bytes
            q, r = divmod(held, L) if L else (0, held)
            layer = [q + (r if k == 0 else 0) for k in range(L)]
            recompute = (est.recompute_bytes,) * L
        kept, saved = est.logits_kept_bytes, est.loss_saved_bytes
        head_rest = est.head_bytes - kept - saved
        split = tensors is not None and len(layer) == L == len(tensors.layers)

        def parts(k: int) -> tuple[int, ...]:
            return tensors.layers[k] if split else (layer[k],)  # type: ignore[union-attr]

        def alloc(sizes: tuple[int, ...]) -> list[Event]:
            return [(ACT, b) for b in sizes]

        def free(sizes: tuple[int, ...]) -> list[Event]:
            return [(ACT, -b) for b in reversed(sizes)]

        emb = tensors.embedding if split else (est.embedding_bytes,)  # type: ignore[union-attr]
        rest = tensors.head_rest if split else (head_rest,)  # type: ignore[union-attr]
        self.recompute_tensors: list[tuple[int, ...]] = [() for _ in range(n_segments + 1)]
        fwd_tensors = [b for b in est.loss_forward_tensors if b]
        # the head (its saved tensors, the logits the outputs hold), then the loss (upcast copy and
        # labels, the saved log-softmax; the copies die when the loss returns)
        head = [*alloc(rest), (LOGITS, kept)]
        loss = [(LOSS_FWD, b) for b in fwd_tensors] + [(LOSS_SAVED, saved)]
        loss += [(LOSS_FWD, -b) for b in reversed(fwd_tensors)]
        pre, left = _loss_backward(est)
        if blocks == L and L:
            self.fwd[0] += alloc(emb)
            for k in range(L):
                self.fwd[2 * k + 1] += alloc(parts(k))
                j = L - 1 - k  # backward segment of block k
                self.bwd_free[2 * j + 1] += free(parts(k))
                self.recompute[2 * j + 1] = recompute[k]
                if split and recompute[k]:
                    self.recompute_tensors[2 * j + 1] = tensors.recompute[k]  # type: ignore[union-attr]
            self.fwd[n_segments - 1] += head
        else:  # blocks not recognised: everything allocated in one segment, freed at the end
            self.fwd[0] += [*alloc(emb), *(e for k in range(L) for e in alloc(parts(k))), *head]
            self.bwd_free[n_segments - 1] += [e for k in reversed(range(L)) for e in free(parts(k))]
            if checkpointing:
                self.recompute[0] = max(recompute, default=0)
        for s, n in enumerate(self.recompute):
            if n and not self.recompute_tensors[s]:
                self.recompute_tensors[s] = (n,)
        self.fwd_after[n_segments - 1] += loss
        self.bwd_pre[0] += pre
        self.bwd_free[0] += [(LOSS_BWD, -left), *free(rest)]
        self.bwd_free[n_segments] += [*free(emb), (LOGITS, -kept)]
        for lst in (*self.fwd, *self.fwd_after, *self.bwd_pre, *self.bwd_free):
            lst[:] = [ev for ev in lst if ev[1]]


def _loss_backward(est: ActivationEstimate) -> tuple[list[Event], int]:
    """The loss's backward before the head's (module docstring): its events and the gradient left
    alive through the head's backward."""
    tensors = [b for b in est.loss_backward_tensors if b]
    if not tensors:
        return [], 0
    ev: list[Event] = [(LOSS_BWD, b) for b in tensors]
    ev += [(LOSS_BWD, -b) for b in reversed(tensors[:-1])]  # nll_loss's gradient, once consumed
    ev.append((LOSS_SAVED, -est.loss_saved_bytes))  # released once log_softmax's backward has run
    left = tensors[-1]
    if est.logits_grad_bytes:  # ToCopyBackward: the gradient in the logits' dtype
        ev += [(LOSS_BWD, est.logits_grad_bytes), (LOSS_BWD, -left)]
        left = est.logits_grad_bytes
    return ev, left


def declare_activations(t: Timeline, est: ActivationEstimate, *, checkpointing: bool, source: str) -> None:
    """The activation and loss items of a step recipe (``source``: where the activation bytes come from)."""
    t.declare(ACT, name="activations saved for backward, one set per block (analytic)", device=Device.GPU,
              category="activations", exact=False,
              formula=est.formula + " (the logits and the loss's tensors are their own items)", source=source)
    if est.logits_kept_bytes:
        t.declare(LOGITS, name="logits held by the model's outputs until the end of backward", device=Device.GPU,
                  category="activations", formula=f"{est.logits_kept_bytes:,} B: tokens x labels or vocabulary x "
                  "the training dtype (the loop keeps `outputs` while it backpropagates `outputs.loss`)",
                  source="the model's forward (lm_head / score output returned in the ModelOutput)")
    if est.loss_saved_bytes:
        t.declare(LOSS_SAVED, name="the loss's log-softmax, saved for its backward", device=Device.GPU,
                  category="activations", formula=f"{est.loss_saved_bytes:,} B: tokens x vocabulary x "
                  f"{'4 B (fp32 after the upcast)' if est.logits_grad_bytes else 'the logits dtype'}",
                  source=est.loss_source)
    if est.loss_forward_tensors:
        parts = " + ".join(f"{b:,}" for b in est.loss_forward_tensors)
        t.declare(LOSS_FWD, name="the loss's transients: the logits' fp32 copy and the label copies", device=Device.GPU,
                  category="activations", formula=f"{parts} B, alive while the loss runs (freed when it returns)",
                  source=est.loss_source)
    if est.loss_backward_tensors:
        parts = " + ".join(f"{b:,}" for b in est.loss_backward_tensors)
        cast = (f"; then the gradient cast to the training dtype {est.logits_grad_bytes:,} B, through the head's "
                "backward" if est.logits_grad_bytes else "; the second is the logits' gradient, through the head's backward")
        t.declare(LOSS_BWD, name="the loss's gradients when backward starts", device=Device.GPU,
                  category="activations",
                  formula=f"nll_loss's gradient + log_softmax's backward result = {parts} B with the log-softmax alive{cast}",
                  source="torch autograd: tools/autograd/derivatives.yaml (nll_loss_forward -> nll_loss_backward, "
                         "_log_softmax -> _log_softmax_backward_data, _to_copy), torch 2.13; the loss of step.loss_forward")
    if checkpointing:
        t.declare(RECOMPUTE, name="a checkpointed block's activations, rebuilt during its backward",
                  device=Device.GPU, category="activations", exact=False,
                  formula=f"one block's activations (at most {est.recompute_bytes:,} B), live while that block's "
                          "backward runs",
                  source="torch/utils/checkpoint.py (non-reentrant: the block's forward re-runs inside backward)")


def apply(t: Timeline, events: list[Event]) -> None:
    """The events in order; allocations in a row of one key go in one ``alloc_many`` (same result)."""
    run_key, run = None, []
    for key, b in events:
        if b > 0 and key == run_key:
            run.append(b)
            continue
        if run:
            t.alloc_many(run_key, run)
            run_key, run = None, []
        if b > 0:
            run_key, run = key, [b]
        else:
            t.free(key, -b)
    if run:
        t.alloc_many(run_key, run)
