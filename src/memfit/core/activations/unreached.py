"""The configurations the analytic activations do not reach yet (issue 26), one source for two readers.

``tests/trace/test_activation_grid.py`` (the standing grid: small configs of the real shapes, every
family, head, precision and PEFT method, analytic against a fake-tensor trace of the model's own code)
derives its list of off cells from ``OFF_KINDS``: a grid cell that matches a kind must be off by the
gap recorded here, a cell that matches none must be within the README's 0.5%. ``memfit plan``
(``memfit.core.findings.activations``) labels its activation figure with the kind's reason and
measured gap when the planned configuration is of one of these kinds. So the test fails when the two
diverge: a fix that moves cells back onto the grid must remove their kind here, which removes the
label from the plan.

A kind is matched on everything the grid varies except the size of the model: the family
(``model_type``, and multi-query for Falcon), the precision mode, the PEFT method, the attention
implementation, gradient checkpointing, the task head and whether an encoder-decoder's target is
shorter than its input. Kinds are exactly what was measured; nothing is extrapolated to the
neighbouring cells the grid did not run.

Pure: no torch, transformers or peft.
"""

from __future__ import annotations


from memfit.core.lean_dataclass import dataclass
from memfit.core.model import ArchSpec

PRECISION_MODES = ("fp32", "amp-bf16", "amp-fp16", "bf16", "fp16")
"""The grid's precision modes: an fp32 model; an fp32 model under ``torch.autocast`` (bf16, fp16); a
model in pure bf16 / fp16 (DeepSpeed's bf16/fp16, FSDP's 16-bit param_dtype)."""

GRID = "tests/trace/test_activation_grid.py"


@dataclass(frozen=True, slots=True, kw_only=True)
class OffKind:
    """A kind of configuration whose analytic activations are off the executed code by more than 0.5%."""

    name: str
    model_types: tuple[str, ...]
    precisions: tuple[str, ...]
    """Among ``PRECISION_MODES``."""
    method: str
    """The PEFT method (``full``, ``lora``, ``prefix``, ``prompt``)."""
    task: str
    """The head (``ArchSpec.task``: causal-lm, masked-lm, seq2seq-lm, sequence-classification, ...)."""
    measured: tuple[tuple[str, float], ...]
    """(grid cell id, analytic vs trace: (analytic - traced) / traced) for every grid cell of the kind."""
    reason: str
    """What is off, as far as it was located (leads read off the traces are said to be leads)."""
    attention: str | None = None
    """The attention implementation; None: the family's default (``families.attention.resolve``)."""
    checkpointing: bool = False
    multi_query: bool | None = None
    """Falcon: one key/value head (Falcon-7B) or more (Falcon-40B's new decoder architecture); None: either."""

    @property
    def worst(self) -> tuple[str, float]:
        """The measured cell furthest off."""
        return max(self.measured, key=lambda m: abs(m[1]))

    def describe(self) -> str:
        parts = [f"{'/'.join(self.model_types)}", "/".join(self.precisions), self.method, self.task]
        if self.attention:
            parts.append(f"{self.attention} attention")
        if self.checkpointing:
            parts.append("gradient checkpointing")
        if self.multi_query:
            parts.append("multi-query")
        return ", ".join(parts)


OFF_KINDS: tuple[OffKind, ...] = ()
"""Every kind the standing grid finds off, with the gaps measured there (rounded to 0.001 percentage points).

None at present. The last one, ``mt5-lora-checkpointed`` (mT5/umT5, pure bf16, LoRA, checkpointing: -4.254% and
-5.047%), was the decoder's embeddings under checkpointing: ``enable_input_require_grads`` hooks every stack's
``embed_tokens`` (transformers modeling_utils.py), so over frozen embeddings both the encoder's and the decoder's
embedding outputs are leaves their AccumulateGrad nodes hold, and the decoder's embedding dropout keeps its mask
(``core/activations/layout.py``); both cells are now within 4 B of the trace (the loss's scalars)."""


def precision_mode(model_dtype: str, autocast: str | None) -> str:
    """The grid's name for a model in ``model_dtype`` (fp32, bf16, fp16) run under ``autocast`` (None, bf16, fp16)."""
    return f"amp-{autocast}" if autocast else model_dtype


def off_kind(arch: ArchSpec, *, method: str, precision: str, attention: str, checkpointing: bool,
             seq_len: int, target_len: int | None) -> OffKind | None:
    """The kind of ``OFF_KINDS`` this configuration is of, or None (within the grid's 0.5%, or not on the
    grid). An encoder-decoder with a target shorter than its input is of no kind here (the grid's
    short-target cells all pass)."""
    from memfit.core.families.attention import resolve

    if arch.num_encoder_layers and target_len is not None and target_len != seq_len:
        return None
    for kind in OFF_KINDS:
        if (arch.model_type in kind.model_types and precision in kind.precisions and method == kind.method
                and arch.task == kind.task and checkpointing == kind.checkpointing
                and attention == (kind.attention or resolve(arch.model_type, None))
                and (kind.multi_query is None or kind.multi_query == (arch.num_kv_heads == 1))):
            return kind
    return None
