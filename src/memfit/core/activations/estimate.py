"""What an activation model returns (``ActivationEstimate``, its ``LayerGroup``s): shared by the analytic
model (``analytic``) and the per-family layouts (``layout``), read by the ledger's step
recipes and the recommender.
"""

from __future__ import annotations


from memfit.core.lean_dataclass import dataclass


@dataclass(frozen=True, slots=True)
class LayerGroup:
    """Layers that keep the same activation bytes (without checkpointing)."""

    name: str
    """``layer``, ``encoder``, ``decoder``, ``dense``, ``moe``, ``sliding`` ..."""
    count: int
    bytes: int
    """Per layer."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ActivationEstimate:
    """Activation bytes live at the end of the forward (what backward will need).

    Per layer, for a ledger that allocates one layer at a time: ``layers`` (groups of identical
    layers, in execution order; the very first layer keeps ``first_layer_bytes`` instead of its
    group's ``bytes``), ``per_layer_bytes()`` (one entry per layer, in order, checkpointing
    applied) and ``non_layer_bytes`` (embeddings + head and loss, kept outside the layers).
    """

    total_bytes: int
    """Everything below together: layers + embeddings + head and loss (+ checkpointed inputs)."""
    layer_bytes: int
    """One layer (every layer but the first) without checkpointing; the largest group's when
    layers differ."""
    first_layer_bytes: int
    """The first layer without checkpointing (less when the embeddings are frozen)."""
    embedding_bytes: int
    """Before the first layer (embedding output, dropout mask, rotary tables)."""
    head_bytes: int
    """Final norm, the head's input, logits (kept with the outputs) and the loss's log-softmax."""
    logits_bytes: int
    """Part of ``head_bytes``: logits in the training dtype plus the loss's log-softmax."""
    recompute_bytes: int
    """With checkpointing: one layer recomputed during backward, on top of ``total_bytes``."""
    formula: str
    layers: tuple[LayerGroup, ...] = ()
    checkpointed_layer_bytes: int = 0
    """With checkpointing: what each layer keeps (its input), instead of its activations."""
    logits_kept_bytes: int = 0
    """Part of ``logits_bytes``: the logits the model's outputs hold (training dtype), kept until the
    training loop drops the outputs (here: the end of backward)."""
    loss_saved_bytes: int = 0
    """Part of ``logits_bytes``: the log-softmax ``cross_entropy`` saves for its backward (fp32 when the
    loss upcasts the logits), freed once log_softmax's backward has run."""
    loss_forward_tensors: tuple[int, ...] = ()
    """Transient tensors on top of ``total_bytes`` while the loss runs, all alive at its peak: the fp32
    copy of the logits (``logits.float()`` in ForCausalLMLoss/ForMaskedLMLoss, alive next to the
    log-softmax it feeds) and the label copies (transformers/loss/loss_utils.py)."""
    loss_backward_tensors: tuple[int, ...] = ()
    """Transients when backward starts, in order, both alive at its peak with the saved log-softmax:
    the gradient of the log-softmax output (``nll_loss_backward``) and log_softmax's backward result."""
    logits_grad_bytes: int = 0
    """After log_softmax's backward, when the loss upcast the logits: their gradient cast back to the
    training dtype (``ToCopyBackward``), alive through the head's backward (0 when the loss ran in the
    training dtype: log_softmax's backward result is then that gradient)."""
    loss_source: str = ""
    """The code the loss tensors come from (file:function, transformers version)."""
    checkpointed_layers: tuple[int, ...] = ()
    """With checkpointing: what each layer holds, in order (its input; the first layer of a stack also
    the masks or position biases handed to every layer). Sums to ``total_bytes`` minus embeddings and head."""

    @property
    def loss_forward_bytes(self) -> int:
        """Transient on top of ``total_bytes`` while the loss runs (``loss_forward_tensors``)."""
        return sum(self.loss_forward_tensors)

    @property
    def loss_backward_bytes(self) -> int:
        """Transient on top of ``total_bytes`` when backward starts (``loss_backward_tensors``)."""
        return sum(self.loss_backward_tensors)

    @property
    def non_layer_bytes(self) -> int:
        """Embeddings plus head and loss: kept outside the layers."""
        return self.embedding_bytes + self.head_bytes

    @property
    def forward_peak_bytes(self) -> int:
        """Highest activation bytes of the forward: at the loss, when the logits peak."""
        return self.total_bytes + self.loss_forward_bytes

    @property
    def backward_peak_bytes(self) -> int:
        """Activation bytes when backward starts (the loss's gradients; layer-by-layer transients of
        the backward are not modelled)."""
        return self.total_bytes + self.loss_backward_bytes

    def per_layer_bytes(self) -> tuple[int, ...]:
        """Bytes each layer keeps, in execution order (encoder layers first), checkpointing applied."""
        if self.checkpointed_layers:
            return self.checkpointed_layers
        if self.checkpointed_layer_bytes:
            count = sum(g.count for g in self.layers)
            return (self.checkpointed_layer_bytes,) * count
        out = [g.bytes for g in self.layers for _ in range(g.count)]
        if out:
            out[0] = self.first_layer_bytes
        return tuple(out)

    def recompute_per_layer(self) -> tuple[int, ...]:
        """With checkpointing: the activations each layer's recompute rebuilds during its backward
        (its group's bytes: checkpointing makes the embedding output require grad, so the first layer
        keeps what the others do), in execution order; zeros without checkpointing."""
        if not self.recompute_bytes:
            return (0,) * sum(g.count for g in self.layers)
        return tuple(g.bytes for g in self.layers for _ in range(g.count))
