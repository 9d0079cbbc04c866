"""Typed results of a fake-tensor training-step trace (pure data: no torch needed to read them).

Glossary:
- *live bytes*: bytes of every tensor storage alive at an instant, each storage counted once
  (views share their base's storage), rounded up per storage to ``granularity_bytes``.
- *saved*: a storage autograd saved for backward (``torch.autograd.graph.saved_tensors_hooks``
  saw it packed) and that is not a parameter, buffer or model input.
- *output*: a storage reachable from the model's return value (logits, loss, cache), not saved.
- *held*: alive at the end of the forward although neither saved nor an output (e.g. a layer input
  that non-reentrant gradient checkpointing keeps for its recompute).
- *temporary*: any other storage an op created (freed as soon as nothing refers to it).
- *param_cast*: autocast's 16-bit copy of a parameter (``_to_copy`` of a parameter's storage; the
  ledger books these as ``amp.weight_casts``, not as activations).
- *activation side*: everything but parameters, buffers and gradients, i.e. what ZeRO-3 does not
  partition: ``saved + output + held + temporary + input``.
"""

from __future__ import annotations

from dataclasses import dataclass

CATEGORIES = (
    "param_trainable",
    "param_frozen",
    "buffer",
    "input",
    "gradient",
    "saved",
    "output",
    "held",
    "temporary",
    "param_cast",
)
"""Allocation categories, in the order ``MemoryBreakdown`` lists them."""

PHASES = ("forward", "backward")


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceOptions:
    """What step to trace: the knobs that change activation memory."""

    seq_len: int = 2048
    """Tokens per sequence (prefix/prompt virtual tokens come on top)."""
    micro_batch: int = 1
    """Sequences per micro-step."""
    dtype: str = "fp16"
    """Parameter and activation dtype, as DeepSpeed casts the model: ``fp16``, ``bf16``, ``fp32``.
    The loss is computed as the model computes it (transformers' causal-LM loss upcasts logits)."""
    adapter_dtype: str | None = None
    """``fp32``/``fp16``/``bf16``: the PEFT-created params in this dtype instead of ``dtype`` (peft's
    ``autocast_adapter_dtype`` keeps them fp32 beside a 16-bit base outside DeepSpeed); None: ``dtype``."""
    gradient_checkpointing: bool = False
    """``model.gradient_checkpointing_enable()`` (transformers' default: non-reentrant)."""
    attention: str = "sdpa"
    """The ``attn_implementation`` (``memfit.core.families.attention.IMPLEMENTATIONS``). ``eager``
    and ``sdpa`` are traced as built; ``flash_attention_2/3`` and ``flex_attention`` cannot run on a
    CPU, so the model is built with ``sdpa`` and traced through its flash kernel, which keeps the same
    tensors for backward (q, k, v, the output and the fp32 logsumexp)."""
    task: str | None = None
    """Head to build and train (``memfit.core.families.heads.TASKS``); None: ``architectures[0]``'s."""
    target_len: int | None = None
    """Encoder-decoder models: decoder tokens per sequence (the labels); None: ``seq_len``."""
    keep_outputs: bool = True
    """The training loop holds the model outputs (logits) through backward, as
    ``outputs = model(**batch); loss = outputs.loss; loss.backward()`` does."""
    zero3_linear: bool = False
    """Trace ``torch.nn.functional.linear`` as DeepSpeed ZeRO-3 replaces it
    (``memory_efficient_linear``, deepspeed/runtime/zero/linear.py ``LinearFunctionForZeroStage3``):
    it saves every Linear's input, frozen or not."""
    autocast: str | None = None
    """``fp16``/``bf16``: the forward and the loss run under ``torch.autocast`` to that dtype (AMP on a
    model whose params are ``dtype``, usually fp32; backward outside it, as the Trainer and accelerate
    run it), with CUDA's op lists when ``kernels`` is ``cuda`` (``memfit.trace.cuda_kernels``)."""
    kernels: str = "cuda"
    """Whose kernel choices to trace: ``cuda`` routes dropout to the fused ``native_dropout``
    (saves a 1-byte bool mask, as on a GPU; the CPU kernel saves a mask in the input dtype) and
    keeps sdpa on its flash kernel when dropout is on (CUDA's flash/mem-efficient kernels take
    dropout; the CPU falls back to the math kernel, which materializes the score matrix); ``cpu``
    traces what the CPU kernels do (the tests compare that with real CPU tensors)."""
    granularity_bytes: int = 512
    """Each storage is counted rounded up to a multiple of this (CUDA caching allocator:
    ``round_size`` in c10/cuda/CUDACachingAllocator.cpp rounds to 512 B, which
    ``torch.cuda.memory_allocated`` reports); 1 counts exact tensor bytes."""

    def __post_init__(self) -> None:
        from memfit.errors import MemfitError

        if self.seq_len < 1 or self.micro_batch < 1:
            raise MemfitError(f"seq_len and micro_batch must be >= 1, got {self.seq_len} and {self.micro_batch}")
        if self.dtype not in ("fp16", "bf16", "fp32"):
            raise MemfitError(f"dtype must be fp16, bf16 or fp32, got {self.dtype!r}")
        from memfit.core.families.attention import IMPLEMENTATIONS

        if self.attention not in IMPLEMENTATIONS:
            raise MemfitError(f"attention must be one of {', '.join(IMPLEMENTATIONS)}, got {self.attention!r}")
        if self.target_len is not None and self.target_len < 1:
            raise MemfitError(f"target_len must be >= 1, got {self.target_len}")
        if self.adapter_dtype not in (None, "fp16", "bf16", "fp32"):
            raise MemfitError(f"adapter_dtype must be fp16, bf16, fp32 or None, got {self.adapter_dtype!r}")
        if self.autocast not in (None, "fp16", "bf16"):
            raise MemfitError(f"autocast must be fp16, bf16 or None, got {self.autocast!r}")
        if self.kernels not in ("cuda", "cpu"):
            raise MemfitError(f"kernels must be 'cuda' or 'cpu', got {self.kernels!r}")
        if self.granularity_bytes < 1:
            raise MemfitError(f"granularity_bytes must be >= 1, got {self.granularity_bytes}")


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryBreakdown:
    """Live bytes by category at one instant."""

    param_trainable_bytes: int = 0
    param_frozen_bytes: int = 0
    buffer_bytes: int = 0
    input_bytes: int = 0
    gradient_bytes: int = 0
    saved_bytes: int = 0
    output_bytes: int = 0
    held_bytes: int = 0
    temporary_bytes: int = 0
    param_cast_bytes: int = 0

    @property
    def total_bytes(self) -> int:
        return (
            self.param_trainable_bytes + self.param_frozen_bytes + self.buffer_bytes + self.input_bytes
            + self.gradient_bytes + self.saved_bytes + self.output_bytes + self.held_bytes + self.temporary_bytes
            + self.param_cast_bytes
        )

    @property
    def activation_side_bytes(self) -> int:
        """Everything ZeRO-3 does not partition: saved + output + held + temporary + input."""
        return self.input_bytes + self.saved_bytes + self.output_bytes + self.held_bytes + self.temporary_bytes

    def by_category(self) -> tuple[tuple[str, int], ...]:
        return tuple((c, getattr(self, f"{c}_bytes")) for c in CATEGORIES)


@dataclass(frozen=True, slots=True, kw_only=True)
class ModuleBytes:
    """Live bytes that one module's code allocated (by ``named_modules`` name; "" is the root)."""

    module: str
    category: str
    bytes: int


@dataclass(frozen=True, slots=True, kw_only=True)
class TracePeak:
    """The highest live bytes of one phase and what was live then."""

    phase: str
    peak_bytes: int
    breakdown: MemoryBreakdown
    by_module: tuple[ModuleBytes, ...]
    """Non-parameter live bytes by the module that allocated them, largest first."""
    module: str
    """Module whose code made the allocation that reached the peak."""
    op: str
    """The aten op that made it, e.g. ``aten._log_softmax.default``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TracedParam:
    """One parameter as traced (tied weights once)."""

    name: str
    numel: int
    element_bytes: int
    trainable: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class TracedModule:
    """One module with the parameters it owns directly (``named_parameters(recurse=False)``)."""

    name: str
    params: tuple[int, ...]
    """Indices into ``TraceResult.params``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StepEvent:
    """A point of the step where ZeRO-3 acts, with the activation-side bytes around it.

    kinds: ``fwd_pre``/``fwd_post`` (forward hooks, also during checkpoint recompute),
    ``bwd_pre``/``bwd_post`` (first/last backward node created under the module or its children),
    ``grad`` (a parameter's gradient was accumulated: ``param`` set), ``end_forward``,
    ``end_backward``.
    """

    kind: str
    module: int = -1
    """Index into ``TraceResult.modules`` (-1: none)."""
    param: int = -1
    """Index into ``TraceResult.params`` for ``grad`` events (-1: none)."""
    act_bytes: int
    """Activation-side live bytes at the event."""
    act_peak_bytes: int
    """Highest activation-side live bytes since the previous event (up to this one)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceTimings:
    """Wall seconds of each stage."""

    build_s: float
    forward_s: float
    backward_s: float

    @property
    def total_s(self) -> float:
        return self.build_s + self.forward_s + self.backward_s


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceResult:
    """Memory of one forward + loss + backward, traced op by op on fake tensors.

    Bytes are per GPU as the step would allocate them (the trace runs on the CPU device with fake
    tensors; shapes, dtypes and storage lifetimes are the same as on a GPU, except that the CPU
    and CUDA kernels of a few fused ops save different auxiliaries, e.g. sdpa's logsumexp).
    """

    model_type: str
    architecture: str
    """Class traced, e.g. ``PeftModelForCausalLM(GPTJForCausalLM)``."""
    method: str
    """PEFT method: full, lora, prefix, prompt, freeze."""
    options: TraceOptions
    params: tuple[TracedParam, ...]
    modules: tuple[TracedModule, ...]
    param_bytes: int
    trainable_param_bytes: int
    forward: TracePeak
    backward: TracePeak
    end_of_forward: MemoryBreakdown
    """Live bytes once the loss is computed, before backward starts."""
    end_of_backward: MemoryBreakdown
    """Live bytes after ``loss.backward()`` (gradients of the trainable params, kept outputs)."""
    events: tuple[StepEvent, ...]
    """Module order and activation-side bytes through the step (what ZeRO-3 replays)."""
    timings: TraceTimings
    layer_reuse: str = ""
    """How the layers were traced: written out from a 5-layer trace (``memfit.trace.layer_reuse``) or the
    full trace, and why."""

    @property
    def peak_bytes(self) -> int:
        return max(self.forward.peak_bytes, self.backward.peak_bytes)

    @property
    def saved_bytes(self) -> int:
        """Bytes autograd saved for backward, live at the end of the forward."""
        return self.end_of_forward.saved_bytes

    @property
    def activation_bytes(self) -> int:
        """Non-parameter, non-input bytes live at the end of the forward: saved + output + held
        (+ temporaries still referenced)."""
        b = self.end_of_forward
        return b.saved_bytes + b.output_bytes + b.held_bytes + b.temporary_bytes

    @property
    def trainable_params(self) -> int:
        return sum(p.numel for p in self.params if p.trainable)

    @property
    def total_params(self) -> int:
        return sum(p.numel for p in self.params)
