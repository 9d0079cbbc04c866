"""Typed results of a plan: ledger items, phases, the verdict and findings.

Renderers (terminal, JSON, Markdown, HTML) take these and never recompute.
"""

from __future__ import annotations

from enum import Enum

from memfit.core.lean_dataclass import dataclass


class Device(str, Enum):
    """Where an allocation lives."""

    GPU = "gpu"
    CPU_PINNED = "cpu_pinned"
    CPU_PAGEABLE = "cpu_pageable"
    NVME = "nvme"


TRAINING_PHASES = ("forward", "backward", "accum.forward", "accum.backward", "optimizer_step",
                   "step2.forward", "step2.backward", "step2.optimizer_step")
"""The step phases every framework runs, in order: step 1, its later micro-steps, the steady state."""

EPOCH_PHASES = ("epoch.forward", "epoch.backward", "epoch.optimizer_step")
"""The epoch simulation's peak step, as phases the verdict judges (only with an epoch simulation)."""


EVAL_PHASES = ("eval.forward", "eval.generate")
"""The Trainer's evaluation between steps (only when the run evaluates): ``evaluate()``'s no-grad
forward at the eval batch size, and ``generate()`` with its KV cache (``predict_with_generate``)."""

PHASES = ("load", "initialize.cast", "initialize.move", "initialize.partition", "initialize.optimizer",
          *TRAINING_PHASES, *EVAL_PHASES, "save")
"""Phase names in run order; replays mark the same boundaries. ``forward``/``backward``/
``optimizer_step`` are step 1 (its first micro-step); ``accum.*`` a later micro-step of step 1
(only with gradient_accumulation_steps > 1); ``step2.*`` the steady state (step 2 on: the
optimizer states alive with the step's own memory; the worst micro-step when accumulating). A
phase a scenario does not have is not emitted."""

PHASE_LABELS = {
    "forward": "step 1 forward",
    "backward": "step 1 backward",
    "accum.forward": "step 1, later micro-step: forward",
    "accum.backward": "step 1, later micro-step: backward",
    "optimizer_step": "step 1 optimizer step",
    "step2.forward": "steady state (step 2+): forward",
    "step2.backward": "steady state (step 2+): backward",
    "step2.optimizer_step": "steady state (step 2+): optimizer step",
    "epoch.forward": "the epoch's peak step: forward",
    "epoch.backward": "the epoch's peak step: backward",
    "epoch.optimizer_step": "the epoch's peak step: optimizer step",
    "eval.forward": "evaluation: forward without gradients",
    "eval.generate": "evaluation: generate (KV cache)",
}
"""Plain-words names of the step phases, for the terminal and reports (JSON keeps ``name``)."""

TORCH_PHASES = ("load", "setup", *TRAINING_PHASES, *EVAL_PHASES, "save")
"""Phase names of the frameworks without ``deepspeed.initialize`` (torch, ddp, fsdp, fsdp2), in run
order (contract 1): ``setup`` is the DDP/FSDP wrap, the move to the GPU and the optimizer's
construction; ``accum.*`` only with gradient accumulation; ``step2.*`` the steady state."""

ALL_PHASES = tuple(dict.fromkeys(PHASES + TORCH_PHASES + EPOCH_PHASES))
"""Every phase name any ledger or replay uses."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LedgerItem:
    """One allocation (or a group of identical ones) that is live at some point of the run."""

    key: str
    """Stable identifier, e.g. ``zero3.param_partitions``; replays attribute measurements to it."""
    name: str
    """What it is, in plain words."""
    device: Device
    bytes: int
    """Per rank (per process)."""
    formula: str
    """How ``bytes`` is computed, with the numbers, e.g. ``ceil(p/W) x 2 B summed over 285 params``."""
    source: str
    """The DeepSpeed (or torch/transformers) code it mirrors: ``file.py:function``."""
    category: str = "other"
    """For charts: ``params``, ``grads``, ``optimizer``, ``buffers``, ``activations``, ``runtime``."""
    exact: bool = True
    """False for estimates (activations without a trace, CUDA context, allocator slack)."""
    rank0_only: bool = False
    """Held by rank 0 alone (e.g. the consolidated state dict on save), not by every rank."""
    block_bytes: int | None = None
    """GPU: what the caching allocator gave its tensors (blocks, >= ``bytes``); None when not simulated."""
    locked_bytes: int | None = None
    """Pinned: bytes page-locked for it (power-of-two blocks since torch 1.11); None when not simulated."""
    outside_allocator: bool = False
    """GPU memory PyTorch's caching allocator never sees (CUDA context, NCCL, cuBLAS before 1.13)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PhaseLedger:
    """Memory at a phase's peak: the live items, per device, per rank and per node."""

    name: str
    description: str
    items: tuple[LedgerItem, ...]
    """Items live at the phase's peak (GPU items at the GPU peak, host items at the host peak)."""
    gpu_peak_bytes: int
    """Per rank, allocated by tensors (the CUDA caching allocator may reserve more)."""
    cpu_pinned_bytes: int
    """Per process, page-locked host memory at the host peak."""
    cpu_pageable_bytes: int
    """Per process, ordinary host memory at the host peak."""
    nvme_bytes: int
    """Per rank, on NVMe."""
    ranks_per_node: int
    resident: tuple[LedgerItem, ...] = ()
    """Items still live when the phase ends (what the next phase starts from)."""
    node_cpu_peak_bytes: int = 0
    """All ranks on one node together: each rank is its own process with its own copy, except
    items held by rank 0 alone."""
    allocators_simulated: bool = False
    """The figures below come from the allocator simulators (``core/alloc``); without them (CPU
    accelerator) they repeat the requested figures."""
    gpu_allocated_bytes: int = 0
    """Per rank, peak of torch's ``allocated_bytes`` in the phase (blocks: 512-B multiples, unsplit
    remainders) = ``max_memory_allocated`` after a reset at the phase start."""
    gpu_reserved_bytes: int = 0
    """Per rank, peak ``reserved_bytes`` (``max_memory_reserved``): segments cudaMalloc'ed and cached."""
    gpu_oom_relevant_bytes: int = 0
    """Per rank, peak of what a failing cudaMalloc cannot get back: every segment holding a live block
    (allocated + stranded free space + the segment a request just needed) + memory outside PyTorch.
    The run OOMs in this phase iff it exceeds the card (see ``core/alloc/device_caching.py``)."""
    gpu_outside_pytorch_bytes: int = 0
    """Per rank, CUDA context + NCCL buffers (+ cuBLAS workspace before torch 1.13), estimated."""
    gpu_nvidia_smi_bytes: int = 0
    """Per rank, peak reserved + outside PyTorch: what nvidia-smi would show (estimate)."""
    gpu_alloc_retries: int = 0
    """cudaMalloc failures that flushed the cache and retried (``num_alloc_retries``) in the phase."""
    gpu_ooms: int = 0
    """Allocations that failed even after the flush (``num_ooms``) in the phase."""
    cpu_pinned_requested_bytes: int = 0
    """Per process, peak of pinned bytes the live tensors asked for."""
    cpu_pinned_locked_bytes: int = 0
    """Per process, peak page-locked bytes: rounded blocks, freed blocks kept cached, outside pins."""
    cpu_locked_peak_bytes: int = 0
    """Per process, peak of pageable + page-locked bytes."""
    node_cpu_locked_peak_bytes: int = 0
    """All ranks of a node, with page-locked pinned bytes (rank-0-only items once)."""

    @property
    def cpu_peak_bytes(self) -> int:
        return self.cpu_pinned_bytes + self.cpu_pageable_bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class Failure:
    """A phase whose peak exceeds a device's limit (``Verdict.failures``)."""

    phase: str
    device: str
    """``gpu``, ``cpu`` (per node) or ``nvme``."""
    needed_bytes: int
    available_bytes: int
    figure: str = ""
    """Which figure was compared (e.g. the OOM-relevant GPU bytes), in words."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Risk:
    """A phase that fits on paper but within memfit's margin of the limit (``core/verdict.py``)."""

    phase: str
    device: str
    """``gpu`` (per rank) or ``cpu`` (per node)."""
    needed_bytes: int
    available_bytes: int
    """The card's or the node's capacity."""
    limit_bytes: int
    """What ``needed_bytes`` may reach and still be called "fits": capacity / (1 + margin), minus the
    host's reserve for the OS (host)."""
    why: str
    """The margin and the reserve that make it at risk, in words."""


VERDICT_LEVELS = ("fits", "at_risk", "does_not_fit")
"""The three levels of a verdict (issue 19): the run fits with memfit's measured error to spare; it
fits on paper but within that error (or a reserve) of the limit; a phase exceeds the limit."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Verdict:
    """Whether the run fits: the failing phases, the risks and the figures compared."""

    fits: bool
    """No phase exceeds the card or the host (``level`` is ``fits`` or ``at_risk``)."""
    failures: tuple[Failure, ...]
    """In run order; the first is where the run dies."""
    gpu_figure: str = ""
    """The GPU figure the verdict used, in words."""
    host_figure: str = ""
    """The host figure the verdict used, in words."""
    level: str = "fits"
    """``fits``, ``at_risk`` or ``does_not_fit`` (``VERDICT_LEVELS``)."""
    risks: tuple[Risk, ...] = ()
    """Phases within the margin of a limit, in run order (set whether or not a phase fails)."""
    gpu_margin: float = 0.0
    """The GPU margin: "fits" needs the verdict's GPU figure x (1 + gpu_margin) <= the card."""
    host_margin: float = 0.0
    host_reserve_bytes: int = 0
    """Host RAM per node kept for the OS and system daemons."""
    shared_gpu: bool = False
    """Other processes may use the card (``--shared-gpu``): a GPU that fits is at risk at best."""
    margin_source: str = ""
    """Where the margins come from, in words (the public runs they were measured on)."""

    @property
    def worst(self) -> Failure | None:
        """The failure furthest over its limit (needed / available), not only the first."""
        return max(self.failures, key=lambda f: f.needed_bytes / max(f.available_bytes, 1), default=None)


@dataclass(frozen=True, slots=True, kw_only=True)
class Finding:
    """One finding of the plan: an identifier, its severity and the message."""

    id: str
    severity: str
    """``error`` (the run fails because of it), ``warning``, ``info``."""
    message: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ParamCounts:
    """The model's parameter counts: total, trained, frozen and the largest parameter."""

    total: int
    trainable: int
    frozen: int
    largest: int
    largest_name: str


@dataclass(frozen=True, slots=True, kw_only=True)
class EpochSummary:
    """An epoch of steady-state steps of varying batch shapes through one CUDA caching allocator
    (``core/epoch/simulate.py``). Bytes per rank; percentiles over the optimizer steps."""

    steps: int
    """Optimizer steps in the simulated epoch."""
    simulated: int
    """Of them, run through the allocator simulator."""
    from_memo: int
    """Of them, a step already simulated from the same allocator state at the same length."""
    approximated: int
    """Of them, past the event budget: the figures of the last simulated step of the same length."""
    per_epoch: int
    """Optimizer steps of a whole epoch on one rank (the distribution's samples)."""
    lengths_source: str
    """Where the batch lengths came from (a file, or memfit's stated default)."""
    rule: str
    quantum: int
    """Batch lengths rounded up to a multiple of this (1: not rounded)."""
    distinct_lengths: int
    reserved_p50_bytes: int = 0
    reserved_p99_bytes: int = 0
    reserved_max_bytes: int = 0
    oom_relevant_p50_bytes: int = 0
    oom_relevant_p99_bytes: int = 0
    oom_relevant_max_bytes: int = 0
    allocated_max_bytes: int = 0
    peak_step: int = 0
    """1-based step of the epoch with the highest OOM-relevant figure (the first such)."""
    peak_seq_len: int = 0
    peak_micro_batch: int = 0
    peak_shape_steps: int = 0
    """Steps of the simulated epoch with the peak step's batch shape."""
    peak_phase_figures: tuple[tuple[int, int, int], ...] = ()
    """(reserved, OOM-relevant, allocated) of the peak step's forward, backward, optimizer step."""
    template_lengths: tuple[int, ...] = ()
    """The lengths the step template was fitted on."""
    outside_bytes: int = 0
    """GPU memory outside PyTorch during the steps (in the OOM-relevant and nvidia-smi figures)."""
    eval_figures: tuple[int, int, int] | None = None
    """(reserved, OOM-relevant, allocated) peak of the evaluations run inside the epoch."""
    notes: tuple[str, ...] = ()
    error: str = ""
    """Why the epoch could not be simulated (then nothing else is set)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    """The whole answer for one scenario."""

    scenario_name: str
    params: ParamCounts
    phases: tuple[PhaseLedger, ...]
    verdict: Verdict
    findings: tuple[Finding, ...]
    notes: tuple[str, ...] = ()
    """What is estimated rather than exact, and why."""
    epoch: EpochSummary | None = None
    """The epoch simulation (``--lengths`` / ``--epoch``), None without one."""

    def phase(self, name: str) -> PhaseLedger:
        for p in self.phases:
            if p.name == name:
                return p
        raise KeyError(name)


@dataclass(frozen=True, slots=True, kw_only=True)
class TracedStep:
    """In-step GPU memory measured from the model's code (``memfit trace``), replacing the analytic
    activation and ZeRO-3 gather estimates in the ``forward`` and ``backward`` phases."""

    forward_items: tuple[LedgerItem, ...]
    """Live at the forward peak, besides what the ledger already holds (params, buffers)."""
    backward_items: tuple[LedgerItem, ...]
    """Live at the backward peak, likewise."""
    note: str
    """How it was obtained (trace options, peak module), for the plan's notes."""
    by_module: tuple[TracedModuleBytes, ...] = ()
    """The forward peak's activation-side bytes by the module whose code allocated them: the
    torch/DDP/FSDP/FSDP2 ledgers book each in its stage (``ledger/pytorch/traced.py``), so they are
    freed stage by stage in backward as the analytic ones are."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TracedModuleBytes:
    """What one module's code had allocated and was still live at the traced forward peak."""

    module: str
    """``named_modules`` name in the traced (PEFT) model; ``""`` the root, ``<outside modules>`` none."""
    kept_bytes: int
    """Saved for backward, outputs, tensors held (checkpointed inputs) and the model inputs."""
    temporary_bytes: int
    """Temporaries alive at the peak (the loss's, at a peak in the loss)."""
