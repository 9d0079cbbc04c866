"""The settings a user can change, and the candidate configurations built from them.

A ``Candidate`` is one point of the search: a DeepSpeed config (ZeRO stage, offloads, pinning,
precision, batch split, bucket and live-parameter limits) plus how the script builds the model
(zero.Init / HfDeepSpeedConfig, load dtype, low_cpu_mem_usage, gradient checkpointing). Settings
that do nothing in a given stage are pinned to the user's value, so no two candidates describe
the same run: offloads and pinning need ZeRO (param offload and zero.Init need ZeRO-3), bucket
sizes need ZeRO 1-3 and the prefetch/live/persistence limits ZeRO-3.

The values tried for each setting are the user's own plus a few common alternatives
(``SearchSpace``); the global batch (micro-batch x gradient accumulation x world size) is kept.
"""

from __future__ import annotations

from collections.abc import Iterator

from memfit.core.lean_dataclass import dataclass
from memfit.core.scenario.types import Scenario

REDUCE_BUCKET_CHOICES = (50_000_000, 200_000_000, 500_000_000)
"""``reduce_bucket_size`` values tried besides the user's (elements; DeepSpeed's default 5e8)."""
PREFETCH_CHOICES = (10_000_000, 50_000_000)
"""``stage3_prefetch_bucket_size`` values tried besides the user's (DeepSpeed's default 5e7)."""
MAX_LIVE_CHOICES = (100_000_000, 1_000_000_000)
"""``stage3_max_live_parameters`` values tried besides the user's (DeepSpeed's default 1e9)."""
PERSISTENCE_CHOICES = (10_000, 100_000)
"""``stage3_param_persistence_threshold`` values tried besides the user's (DeepSpeed's default 1e5)."""
MAX_MICRO_BATCH_CHOICES = 6
"""At most this many micro-batch sizes (divisors of micro x accumulation, smallest first)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Candidate:
    """One configuration: the DeepSpeed settings and the script settings that change memory."""

    stage: int
    """ZeRO stage 0-3."""
    offload_optimizer: str = "none"
    """``none``, ``cpu`` (stages 1-3) or ``nvme`` (stage 3)."""
    offload_param: str = "none"
    """``none``, ``cpu`` or ``nvme`` (stage 3)."""
    pin_optimizer: bool = True
    """``offload_optimizer.pin_memory`` (meaningful when the optimizer is offloaded)."""
    pin_param: bool = True
    """``offload_param.pin_memory`` (meaningful when params are offloaded)."""
    zero_init: bool = False
    """The script builds the model under zero.Init (``HfDeepSpeedConfig`` before ``from_pretrained``);
    ZeRO-3 only."""
    load_dtype: str = "fp32"
    """``from_pretrained(torch_dtype=...)``."""
    low_cpu_mem_usage: bool = True
    """``from_pretrained(low_cpu_mem_usage=...)``."""
    precision: str = "fp16"
    """Training dtype: ``fp16``, ``bf16`` (cards that support it) or ``fp32``."""
    micro_batch: int = 1
    """``train_micro_batch_size_per_gpu``."""
    grad_accum: int = 1
    """``gradient_accumulation_steps`` (micro x accum x world = the user's global batch)."""
    gradient_checkpointing: bool = False
    """``model.gradient_checkpointing_enable()``."""
    reduce_bucket_size: int = 500_000_000
    prefetch_bucket_size: int = 50_000_000
    """``stage3_prefetch_bucket_size``."""
    max_live_parameters: int = 1_000_000_000
    """``stage3_max_live_parameters``."""
    param_persistence_threshold: int = 100_000
    """``stage3_param_persistence_threshold``."""

    @property
    def signature(self) -> tuple:
        """The settings that shape the run (not the fine limits, pinning, precision or how the model
        loads, which the search settles by fewest changes): one recommendation per signature."""
        return (self.stage, self.offload_optimizer, self.offload_param, self.micro_batch, self.gradient_checkpointing)


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchSpace:
    """The values tried for each setting (the user's own first)."""

    base: Candidate
    """The user's configuration as a candidate."""
    stages: tuple[int, ...]
    offload_devices: tuple[str, ...]
    """``none``, ``cpu``, and ``nvme`` when the scenario gives NVMe space (used by ZeRO-3 only)."""
    precisions: tuple[str, ...]
    micro_batches: tuple[tuple[int, int], ...]
    """(micro-batch, gradient accumulation) pairs with the user's global batch."""
    reduce_buckets: tuple[int, ...]
    prefetch_buckets: tuple[int, ...]
    max_live: tuple[int, ...]
    persistence: tuple[int, ...]
    checkpointing: tuple[bool, ...] = (False, True)
    """Gradient checkpointing choices (only the user's own under prefix tuning: transformers drops
    the prefix, passed as past_key_values, when checkpointing turns the cache off)."""


def _with_base(base: object, choices: tuple) -> tuple:
    return (base,) + tuple(c for c in choices if c != base)


def base_candidate(sc: Scenario, *, stage3_limits: tuple[int, int, int]) -> Candidate:
    """The scenario's own configuration. ``stage3_limits`` = (prefetch, max live, persistence) as
    the user's JSON sets them under ZeRO-3 (its values, or DeepSpeed's defaults)."""
    ds, z = sc.deepspeed, sc.deepspeed.zero
    prefetch, live, persist = stage3_limits
    return Candidate(
        stage=z.stage, offload_optimizer=z.offload_optimizer.device if z.stage >= 1 else "none",
        offload_param=z.offload_param.device if z.stage == 3 else "none",
        pin_optimizer=z.offload_optimizer.pin_memory, pin_param=z.offload_param.pin_memory,
        zero_init=sc.load.zero_init and z.stage == 3, load_dtype=sc.load.dtype,
        low_cpu_mem_usage=sc.load.low_cpu_mem_usage, precision=ds.precision,
        micro_batch=ds.train_micro_batch_size_per_gpu, grad_accum=ds.gradient_accumulation_steps,
        gradient_checkpointing=sc.train.gradient_checkpointing, reduce_bucket_size=z.reduce_bucket_size,
        prefetch_bucket_size=prefetch, max_live_parameters=live, param_persistence_threshold=persist)


def search_space(sc: Scenario, base: Candidate) -> SearchSpace:
    """The values tried for ``sc`` (see the module docstring)."""
    offload = ("none", "cpu") + (("nvme",) if sc.hardware.nvme_bytes else ())
    precisions = _with_base(base.precision, ("bf16", "fp16") if sc.hardware.gpu.bf16 else ("fp16",))
    per_gpu = base.micro_batch * base.grad_accum
    divisors = [m for m in range(1, per_gpu + 1) if per_gpu % m == 0]
    micro = _with_base(base.micro_batch, tuple(divisors[:MAX_MICRO_BATCH_CHOICES]))
    return SearchSpace(
        base=base, stages=_with_base(base.stage, (0, 1, 2, 3)), offload_devices=offload, precisions=precisions,
        micro_batches=tuple((m, per_gpu // m) for m in micro),
        reduce_buckets=_with_base(base.reduce_bucket_size, REDUCE_BUCKET_CHOICES),
        prefetch_buckets=_with_base(base.prefetch_bucket_size, PREFETCH_CHOICES),
        max_live=_with_base(base.max_live_parameters, MAX_LIVE_CHOICES),
        persistence=_with_base(base.param_persistence_threshold, PERSISTENCE_CHOICES),
        checkpointing=((base.gradient_checkpointing,) if sc.peft.method == "prefix"
                       else (base.gradient_checkpointing, not base.gradient_checkpointing)))


def structures(space: SearchSpace, *, allowed=lambda stage, off_opt, off_param, precision: True
               ) -> Iterator[tuple[int, str, str, str]]:
    """(stage, optimizer offload, param offload, precision) combinations that make sense and that
    ``allowed`` accepts (the search passes a check that DeepSpeed accepts the patched config)."""
    for stage in space.stages:
        # DeepSpeed's stages 1 and 2 offload the optimizer to cpu only (engine.py zero_cpu_offload:
        # an nvme device there is silently no offload); NVMe is ZeRO-3's (ZeRO-Infinity)
        opt_devices = space.offload_devices if stage == 3 else ("none", "cpu") if stage >= 1 else ("none",)
        for off_opt in opt_devices:
            for off_param in (space.offload_devices if stage == 3 else ("none",)):
                for precision in space.precisions:
                    if allowed(stage, off_opt, off_param, precision):
                        yield stage, off_opt, off_param, precision


def enumerate_candidates(space: SearchSpace, *, allowed=lambda stage, off_opt, off_param, precision: True
                         ) -> Iterator[Candidate]:
    """Every candidate of the space, irrelevant settings pinned to the user's values."""
    b = space.base
    for stage, off_opt, off_param, precision in structures(space, allowed=allowed):
        pins_opt = (b.pin_optimizer, not b.pin_optimizer) if off_opt != "none" else (b.pin_optimizer,)
        pins_par = (b.pin_param, not b.pin_param) if off_param != "none" else (b.pin_param,)
        zero_inits = (b.zero_init, not b.zero_init) if stage == 3 else (False,)
        # load in the user's dtype or in the training dtype (fp32 training loads fp32: the engine
        # does not cast an fp32 run, so a 16-bit load would train in 16 bits)
        loads = ("fp32",) if precision == "fp32" else _with_base(b.load_dtype, (precision,))
        lcmus = (b.low_cpu_mem_usage,) if b.low_cpu_mem_usage else (False, True)
        buckets = space.reduce_buckets if stage >= 1 else (b.reduce_bucket_size,)
        ckpts = space.checkpointing
        if stage == 3:
            limits = [(pf, ml, pt) for pf in space.prefetch_buckets for ml in space.max_live for pt in space.persistence]
        else:
            limits = [(b.prefetch_bucket_size, b.max_live_parameters, b.param_persistence_threshold)]
        for pin_o in pins_opt:
            for pin_p in pins_par:
                for zi in zero_inits:
                    for load in loads:
                        for lcmu in lcmus:
                            for micro, accum in space.micro_batches:
                                for ckpt in ckpts:
                                    for rb in buckets:
                                        for pf, ml, pt in limits:
                                            yield Candidate(
                                                stage=stage, offload_optimizer=off_opt, offload_param=off_param,
                                                pin_optimizer=pin_o, pin_param=pin_p, zero_init=zi, load_dtype=load,
                                                low_cpu_mem_usage=lcmu, precision=precision, micro_batch=micro,
                                                grad_accum=accum, gradient_checkpointing=ckpt, reduce_bucket_size=rb,
                                                prefetch_bucket_size=pf, max_live_parameters=ml,
                                                param_persistence_threshold=pt)
