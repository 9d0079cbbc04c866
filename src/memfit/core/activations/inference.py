"""Memory of the model run without gradients: the Trainer's evaluation forward and ``generate``.

Without autograd nothing is saved between layers: each op's output dies once the next op has read
it, so one layer's largest group of live tensors is what a forward adds, layer after layer
(``no_grad_layer_bytes``, an estimate: the layer's output, the MLP's intermediates (gate, up and
their product for a gated MLP; up and its activation otherwise) or attention's (q, k, v, its output;
with eager attention the scores and their softmax), whichever is larger, and an RMSNorm's fp32 copy).
The language-model head then holds the logits, and with labels the loss's fp32 copy of 16-bit
logits and its log-softmax (transformers 5.24 ``loss_utils.py:ForCausalLMLoss``: ``logits.float()``,
``cross_entropy``).

``generate`` (transformers 5.24 ``generation/utils.py``): inputs expanded to ``batch x num_beams``
rows (``_expand_inputs_for_generation``), a prefill forward over the prompt that keeps only the last
position's logits (``logits_to_keep=1`` where the model takes it), then one token per step. The KV
cache is ``DynamicCache`` (``cache_utils.py:DynamicLayer.update``): per layer a key and a value tensor
of ``rows x kv_heads x length x head_dim`` in the model's dtype, grown by ``torch.cat`` at every step
(the new tensor is made before the old one is dropped); beam search reorders it each step
(``index_select``: a copy per layer). An encoder-decoder's cache is an ``EncoderDecoderCache``: the
decoder's self-attention grows from one token, its cross-attention holds the encoder's length once
computed; the encoder's output is kept (expanded per beam) for every step. Per step the last
position's logits are copied to fp32 (``.to(copy=True, dtype=torch.float32)``) and beam search takes
their log-softmax and adds the running scores (``rows x vocab`` fp32 each). Sliding-window caches
(``DynamicSlidingWindowLayer``) are taken at full length: an upper bound for those layers.
"""

from __future__ import annotations


from memfit.core.lean_dataclass import dataclass
from memfit.core.model import ArchSpec


@dataclass(frozen=True, slots=True, kw_only=True)
class NoGradForward:
    """One forward without gradients of ``rows x tokens``."""

    layer_bytes: int
    """The largest live group of one layer (its output included), an estimate."""
    encoder_layer_bytes: int
    """The same for an encoder layer of an encoder-decoder (0 otherwise)."""
    encoder_output_bytes: int
    """The encoder's last hidden state, kept while the decoder runs (encoder-decoders)."""
    head_bytes: tuple[int, ...]
    """Logits, then (with labels) the loss's fp32 copy and log-softmax: alive together at the head."""
    formula: str


def no_grad_layer_bytes(arch: ArchSpec, *, rows: int, tokens: int, kv_tokens: int, dtype_bytes: int,
                        attention: str) -> int:
    """See the module docstring; ``kv_tokens`` is the length attended to (the cache's, when decoding)."""
    D = dtype_bytes
    t = rows * tokens
    h, i = arch.hidden_size, arch.intermediate_size
    hq, hkv = arch.num_heads * arch.head_dim, arch.num_kv_heads * arch.head_dim
    k_exp = arch.experts_per_token if arch.num_experts > 1 else 1
    gated = arch.mlp_kind == "gated" or (arch.layout is not None and arch.layout.gated)
    mlp = (3 if gated else 2) * t * i * D * k_exp
    attn = t * (2 * hq + 2 * hkv) * D
    if attention == "eager":
        attn += 2 * D * rows * arch.num_heads * tokens * kv_tokens
    norm = t * h * 4 if D != 4 else 0
    return t * h * D + max(mlp, attn) + norm


def no_grad_forward(arch: ArchSpec, *, rows: int, seq_len: int, target_len: int | None, dtype_bytes: int,
                    logits_bytes: int, attention: str, labels: bool = True) -> NoGradForward:
    """The evaluation forward (``Trainer.prediction_step``: ``torch.no_grad()``, the loss with labels)."""
    encdec = arch.num_encoder_layers > 0
    dec_tokens = (target_len or seq_len) if encdec else seq_len
    layer = no_grad_layer_bytes(arch, rows=rows, tokens=dec_tokens, kv_tokens=dec_tokens, dtype_bytes=dtype_bytes,
                                attention=attention)
    enc = no_grad_layer_bytes(arch, rows=rows, tokens=seq_len, kv_tokens=seq_len, dtype_bytes=dtype_bytes,
                              attention=attention) if encdec else 0
    enc_out = rows * seq_len * arch.hidden_size * dtype_bytes if encdec else 0
    head: tuple[int, ...] = ()
    if not arch.is_encoder_only and arch.task in ("causal-lm", "seq2seq-lm"):
        tv = rows * dec_tokens * arch.vocab_size
        head = (tv * logits_bytes,)
        if labels:
            head += ((tv * 4,) if logits_bytes != 4 else ()) + (tv * 4,)
    return NoGradForward(layer_bytes=layer, encoder_layer_bytes=enc, encoder_output_bytes=enc_out, head_bytes=head,
                         formula=(f"{rows} x {dec_tokens:,} tokens: one layer's largest live group {layer:,} B "
                                  f"(no_grad: nothing saved)" + (f", encoder layers {enc:,} B, encoder output "
                                                                 f"{enc_out:,} B" if encdec else "")
                                  + (f"; head: logits {head[0]:,} B" + (" + the loss's fp32 copy and log-softmax"
                                                                       if labels else "") if head else "")))


@dataclass(frozen=True, slots=True, kw_only=True)
class GenerateShape:
    """The shapes of an evaluation's ``generate()``: rows, prompt and output tokens."""

    rows: int
    """batch x num_beams."""
    prompt: int
    """Decoder-only: the prompt's tokens; encoder-decoders: the encoder's input length."""
    new_tokens: int
    beams: int
    kv_bytes_per_token: int
    """One layer's key (or value) tensor grows by this much per token: rows x kv_heads x head_dim x B."""
    cross_bytes: int
    """Encoder-decoders: one layer's cross-attention key (or value): rows x heads x encoder length x B."""
    layers: int
    """Layers that keep a cache (the decoder's)."""
    vocab: int

    def kv_total(self, length: int) -> int:
        """Every layer's key and value at ``length`` cached tokens (+ the cross-attention's)."""
        return self.layers * 2 * (self.kv_bytes_per_token * length + self.cross_bytes)


def generate_shape(arch: ArchSpec, *, batch: int, prompt: int, new_tokens: int, beams: int,
                   dtype_bytes: int) -> GenerateShape:
    rows = batch * beams
    encdec = arch.num_encoder_layers > 0
    kv_heads = arch.num_heads if encdec else arch.num_kv_heads
    per_token = rows * kv_heads * arch.head_dim * dtype_bytes
    cross = rows * arch.num_heads * arch.head_dim * prompt * dtype_bytes if encdec else 0
    return GenerateShape(rows=rows, prompt=prompt, new_tokens=new_tokens, beams=beams, kv_bytes_per_token=per_token,
                         cross_bytes=cross, layers=arch.num_layers, vocab=arch.vocab_size)
