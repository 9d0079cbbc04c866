"""``memfit recommend`` for runs outside DeepSpeed: the framework (torch / DDP / FSDP2 and its
sharding strategy and CPU offload), the precision mode, the optimizer, bitsandbytes quantization of
the base, gradient checkpointing and the micro-batch split of the user's global batch.

Fast estimate: every candidate runs the ledger's own recipes on a ``LeanTimeline`` (per-phase peaks
only, no item snapshots) with the model-state view shared between candidates, so its peaks are the
exact ledger's; ``tests/core/test_recommend.py`` checks them equal to ``make_plan`` on the
candidate's scenario rebuilt from its inputs, to the byte. The best per signature are then confirmed
by the exact ledger, as for DeepSpeed (``memfit.core.recommend.deepspeed.search``). The step time is a rough
FLOP/bandwidth estimate, to rank what fits (not a prediction).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import replace
from typing import Any

from memfit.core.lean_dataclass import dataclass
from memfit.core.hardware import Hardware
from memfit.core.ledger.lean_timeline import LeanTimeline
from memfit.core.ledger.pytorch.build import build_torch_ledger
from memfit.core.plan import make_plan
from memfit.core.recommend.patch import Change
from memfit.core.recommend.results import PhaseEstimate
from memfit.core.recommend.step_time import StepTime
from memfit.core.scenario.types import Scenario
from memfit.core.scenario.build import build_scenario
from memfit.core.scenario.inputs import ScenarioInputs
from memfit.errors import MemfitError

OPTIM_CHOICES = ("adamw_torch_fused", "adamw_bnb_8bit", "paged_adamw_8bit", "adafactor")
QLORA = {"method": "4bit", "quant_type": "nf4", "double_quant": True, "compute_dtype": "bf16"}
MAX_MICRO = 3


@dataclass(frozen=True, slots=True, kw_only=True)
class TorchCandidate:
    framework: str
    precision: str
    optim: str
    quantization: str = "none"
    """``none`` or ``4bit`` (QLoRA's NF4 + double quant + bf16 compute; bf16 storage under FSDP)."""
    sharding_strategy: str | None = None
    cpu_offload: bool = False
    micro_batch: int = 1
    grad_accum: int = 1
    gradient_checkpointing: bool = False

    @property
    def signature(self) -> tuple:
        return (self.framework, self.sharding_strategy, self.cpu_offload, self.quantization, self.micro_batch,
                self.gradient_checkpointing)


def _base(sc: Scenario, inputs: ScenarioInputs) -> TorchCandidate:
    return TorchCandidate(
        framework=sc.framework, precision=sc.torch.precision, optim=sc.torch.optim,
        quantization="4bit" if sc.quant.method == "4bit" else sc.quant.method,
        sharding_strategy=sc.fsdp.sharding_strategy if sc.framework.startswith("fsdp") else None,
        cpu_offload=sc.fsdp.cpu_offload if sc.framework.startswith("fsdp") else False,
        micro_batch=sc.train.micro_batch, grad_accum=sc.torch.gradient_accumulation_steps,
        gradient_checkpointing=sc.train.gradient_checkpointing)


def candidate_inputs(inputs: ScenarioInputs, sc: Scenario, c: TorchCandidate, *, files: bool = False,
                     trainer: bool = False) -> ScenarioInputs:
    """The scenario inputs of a candidate (input files already merged into ``inputs``); ``files``: the
    candidate will be written into the user's TrainingArguments/accelerate files (``recommend_torch``)."""
    quant = dict(inputs.quantization or {}) if c.quantization == ("4bit" if sc.quant.method == "4bit" else sc.quant.method) \
        else (dict(QLORA) if c.quantization == "4bit" else {"method": "none"})
    if c.quantization == "4bit" and c.framework.startswith("fsdp"):
        quant["quant_storage"] = "bf16"  # FSDP shards the packed weights as bf16 elements
    fsdp = None
    precision = c.precision
    if c.framework.startswith("fsdp"):
        fsdp = {**(inputs.fsdp or {}), "sharding_strategy": c.sharding_strategy, "cpu_offload": c.cpu_offload}
        if files and c.precision in ("amp_bf16", "amp_fp16"):
            # what the written files mean: under FSDP, TrainingArguments' bf16/fp16 or accelerate's
            # mixed_precision is FSDP's MixedPrecision policy over fp32 sharded params (the input layer's
            # rule, memfit.core.inputs.merge._precision), not autocast beside fp32 FSDP
            precision = "fp32"
            fsdp["mixed_precision"] = c.precision.removeprefix("amp_")
        if trainer:  # the Trainer sets peft's wrap policy for a PEFT model, whatever the files say (stack rule)
            from memfit.core.stack.resolve import trainer_fsdp_wrap

            wrap = trainer_fsdp_wrap(replace(inputs, framework=c.framework))
            if wrap is not None:
                fsdp["wrap_policy"] = wrap[0]
    load = inputs.load_dtype or "fp32"
    if c.precision in ("bf16", "fp16"):
        load = c.precision
    elif c.quantization != "none" and load == "fp32":
        load = "bf16"
    elif c.precision in ("amp_bf16", "amp_fp16", "fp32") and sc.peft.method in ("full", "freeze"):
        load = "fp32"  # AMP and fp32 train fp32 weights
    return replace(inputs, framework=c.framework, precision=precision, optim=c.optim, quantization=quant,
                   fsdp=fsdp, micro_batch=c.micro_batch, grad_accum=c.grad_accum,
                   gradient_checkpointing=c.gradient_checkpointing, load_dtype=load, accelerator="cuda",
                   training_args=None, accelerate_config=None, bnb_config=None)


TRAINER_PRECISIONS = ("fp32", "amp_bf16", "amp_fp16")
"""What a TrainingArguments (``bf16``/``fp16``) or an accelerate config (``mixed_precision``) can say:
autocast or fp32. The pure 16-bit modes are a plain loop's (``model.to(torch.bfloat16)``)."""


def enumerate_candidates(sc: Scenario, base: TorchCandidate, *, files: bool = False):
    """Every candidate; ``files``: the run is described by the user's TrainingArguments or accelerate
    config, so only the precisions those files can say are tried (``TRAINER_PRECISIONS``; FSDP's
    mixed-precision policy stays the user's)."""
    W = sc.world_size
    full = sc.peft.method in ("full", "freeze")
    if W == 1:
        structures = [("torch", None, False)]
    else:
        structures = [("ddp", None, False), ("fsdp2", "FULL_SHARD", False), ("fsdp2", "SHARD_GRAD_OP", False),
                      ("fsdp2", "FULL_SHARD", True)]
    own = (base.framework, base.sharding_strategy, base.cpu_offload)
    if own not in structures:
        structures.insert(0, own)
    precisions = [base.precision] + [p for p in (("bf16", "amp_bf16") if sc.hardware.gpu.bf16 else ("amp_fp16",))
                                     if p != base.precision and (not files or p in TRAINER_PRECISIONS)]
    optims = [base.optim] + [o for o in OPTIM_CHOICES if o != base.optim]
    quants = [base.quantization] + ([] if full or base.quantization != "none" else ["4bit"])
    ckpts = [base.gradient_checkpointing] + ([] if sc.peft.method == "prefix" else [not base.gradient_checkpointing])
    per_gpu = base.micro_batch * base.grad_accum
    divisors = [m for m in range(1, per_gpu + 1) if per_gpu % m == 0]
    micro = [base.micro_batch] + [m for m in divisors[:MAX_MICRO] if m != base.micro_batch]
    for fw, strat, off in structures:
        for prec in (precisions if not (files and fw.startswith("fsdp")) else [base.precision]):
            for opt in optims:
                for q in quants:
                    for ck in ckpts:
                        for m in micro:
                            yield TorchCandidate(framework=fw, precision=prec, optim=opt, quantization=q,
                                                 sharding_strategy=strat, cpu_offload=off, micro_batch=m,
                                                 grad_accum=per_gpu // m, gradient_checkpointing=ck)


def fast_peaks(inputs: ScenarioInputs, sc: Scenario, c: TorchCandidate, cache: dict, *, files: bool = False,
               trainer: bool = False) -> tuple | None:
    """Per phase (GPU, host per process, host per node, NVMe) from the lean timeline; None when the
    candidate is not a valid configuration (a contradiction the exact path would refuse too)."""
    try:
        csc = _scenario(inputs, sc, c, cache, files=files, trainer=trainer)
    except MemfitError:
        return None
    t = LeanTimeline(ranks_per_node=csc.hardware.gpus_per_node, accelerator=csc.accelerator)
    try:
        build_torch_ledger(csc, t, cache.setdefault("models", {}), step_cache=cache.setdefault("step_context", {}))
    except MemfitError:
        return None
    return tuple(p[1:] for p in t.peaks())


def _scenario(inputs: ScenarioInputs, sc: Scenario, c: TorchCandidate, cache: dict, *, files: bool = False,
              trainer: bool = False) -> Scenario:
    """The candidate's scenario, without re-resolving the model (the only part that does not change)."""
    from memfit.core.frameworks.resolve import resolve_framework_settings

    ci = candidate_inputs(inputs, sc, c, files=files, trainer=trainer)
    fw = resolve_framework_settings(ci, sc.hardware, has_deepspeed_json=False)
    return replace(sc, framework=fw.framework, torch=fw.torch, quant=fw.quant, ddp=fw.ddp, fsdp=fw.fsdp,
                   load=replace(sc.load, dtype=ci.load_dtype or "fp32"),
                   train=replace(sc.train, micro_batch=c.micro_batch, gradient_checkpointing=c.gradient_checkpointing))


def estimate_step_time(sc: Scenario, c: TorchCandidate) -> StepTime:
    """A rough step time, only to rank candidates: matmul FLOPs (forward 2N, backward 2N for the
    input gradients + 2N_trained, checkpointing another forward) at 40% of the card's peak (fp32 at
    1/8 of it), 4-bit dequantization +15%, FSDP all-gathers/reduce-scatters at 100 GB/s, CPU offload
    of the shards and gradients at 20 GB/s."""
    n, ntr = sc.model.total_params, sc.model.trainable_params
    tokens = c.micro_batch * c.grad_accum * sc.train.seq_len
    flops = tokens * (2 * n * (2 + (1 if c.gradient_checkpointing else 0)) + 2 * ntr)
    peak = sc.hardware.gpu.fp16_tflops or 100.0
    rate = peak * 1e12 * 0.4 / (8 if c.precision == "fp32" else 1)
    compute = flops / rate * (1.15 if c.quantization == "4bit" else 1.0)
    comm = off = 0.0
    W = sc.world_size
    if c.framework.startswith("fsdp") and W > 1:
        pbytes = n * (2 if c.precision != "fp32" else 4)
        comm = (3 if c.sharding_strategy == "FULL_SHARD" else 2) * pbytes * c.grad_accum / 100e9
    elif c.framework == "ddp" and W > 1:
        comm = 2 * ntr * 4 / 100e9
    if c.cpu_offload:
        off = (n * 4 * 2 + ntr * 4) / W / 20e9
    return StepTime(compute_s=compute, communication_s=comm, offload_s=off,
                    tokens_per_step=tokens * W)


def describe_changes(base: TorchCandidate, c: TorchCandidate) -> tuple[Change, ...]:
    out = []
    for f in dataclasses.fields(TorchCandidate):
        a, b = getattr(base, f.name), getattr(c, f.name)
        if a != b and not (f.name == "grad_accum"):
            out.append(Change(setting=f.name, before=str(a), after=str(b)))
    if base.grad_accum != c.grad_accum:
        out.append(Change(setting="gradient_accumulation_steps", before=str(base.grad_accum), after=str(c.grad_accum)))
    return tuple(out)


def recommend_torch(inputs: ScenarioInputs, *, top: int = 5, headroom: float | None = None, progress=None,
                    files: bool = False, trainer: bool = False):
    """``files``: the user described the run with a TrainingArguments or accelerate config
    (``enumerate_candidates``); ``trainer``: with a TrainingArguments, so the Trainer runs it and its own
    FSDP rules apply to every candidate (``candidate_inputs``)."""
    from memfit.core.frameworks.resolve import apply_input_files
    from memfit.core.recommend.confirm import (_fast_exact_diff, _fits, _limits, confirmation_order,
                                               enough_fitting, headroom_words, rank_by_level, rejection,
                                               rejection_notes, risk_ratio)
    from memfit.core.recommend.results import Recommendation, RecommendResult

    inputs = apply_input_files(inputs)
    sc = build_scenario(inputs)
    if sc.accelerator != "cuda":
        raise MemfitError("recommend searches GPU configurations: the scenario's accelerator must be cuda")
    hw: Hardware = sc.hardware
    gpu_limit, host_limit, _ = _limits(hw, headroom)
    base = _base(sc, inputs)
    cands = list(enumerate_candidates(sc, base, files=files))
    cache: dict[str, Any] = {}
    fitting: dict[tuple, list] = {}
    t0 = time.perf_counter()
    for k, c in enumerate(cands, 1):
        if progress is not None and k % 64 == 0:
            progress(k, len(cands))
        peaks = fast_peaks(inputs, sc, c, cache, files=files, trainer=trainer)
        if peaks is None or any(g > gpu_limit or node > host_limit for g, _, node, _ in peaks):
            continue
        fitting.setdefault(c.signature, []).append((c, peaks, estimate_step_time(sc, c), describe_changes(base, c)))
    elapsed = time.perf_counter() - t0
    if progress is not None:
        progress(len(cands), len(cands))
    best = []
    for group in fitting.values():
        fastest = min(s.total_s for _, _, s, _ in group)
        near = [g for g in group if g[2].total_s <= fastest * 1.01]
        # without --headroom, of equally fast variants the one the verdict calls "fits" (least at risk) wins
        def risk(g) -> float:  # noqa: ANN001
            r = risk_ratio(max(p[0] for p in g[1]), max(p[2] for p in g[1]), hw)
            return r if r > 1.0 else 0.0
        best.append(min(near, key=lambda g: (len(g[3]), g[2].total_s) if headroom is not None else
                        (risk(g), len(g[3]), g[2].total_s)))
    best.sort(key=lambda g: (g[2].total_s, len(g[3])))
    baseline = make_plan(sc)
    recs, notes, max_diff, rejected = [], [], 0, []
    if headroom is None:
        best = confirmation_order(best, hw, lambda g: g[1])
    for c, peaks, step, changes in best[: top * 3]:
        if enough_fitting(recs, top):
            break
        ci = candidate_inputs(inputs, sc, c, files=files, trainer=trainer)
        plan = make_plan(build_scenario(ci))
        diff = _fast_exact_diff(peaks, plan)
        max_diff = max(max_diff, diff)
        if not _fits(plan, hw, headroom):
            rejected.append(rejection(plan, hw, headroom, diff))
            continue
        names = [p.name for p in plan.phases]
        if (ci.load_dtype or "fp32") != sc.load.dtype:  # the precision or quantization brings it: say so
            changes = changes + (Change(setting="from_pretrained dtype", before=sc.load.dtype,
                                        after=ci.load_dtype or "fp32"),)
        recs.append(Recommendation(
            rank=len(recs) + 1, candidate=c, changes=changes, step_time=step,
            fast_phases=tuple(PhaseEstimate(name=n, gpu_peak_bytes=g, cpu_peak_bytes=h, node_cpu_peak_bytes=nd,
                                            nvme_bytes=nv) for n, (g, h, nd, nv) in zip(names, peaks)),
            plan=plan, deepspeed_json={}, script_diff="", scenario_inputs=ci))
    recs = list(rank_by_level(recs, top, hw))
    notes += rejection_notes(rejected, hw, headroom)
    if not recs:
        notes.append(f"no configuration in the search space fits every phase with {headroom_words(hw, headroom)}; "
                     "try a smaller --headroom, more GPUs, a shorter sequence, or a PEFT method")
    return RecommendResult(
        scenario_name=sc.name, hardware=hw, headroom=headroom, gpu_limit_bytes=gpu_limit, host_limit_bytes=host_limit,
        baseline=baseline, baseline_fits_with_headroom=_fits(baseline, hw, headroom),
        baseline_step_time=estimate_step_time(sc, base), recommendations=tuple(recs),
        candidates_searched=len(cands), candidates_fitting=sum(len(g) for g in fitting.values()),
        search_seconds=elapsed, candidates_per_second=len(cands) / elapsed if elapsed else 0.0,
        max_fast_exact_diff_bytes=max_diff, notes=tuple(notes), headroom_words=headroom_words(hw, headroom),
        base_candidate=base, base_load_dtype=sc.load.dtype,
        base_quantization=dict(inputs.quantization) if inputs.quantization else None)


def torch_scenario_document(rec, *, hardware: dict[str, Any]) -> dict[str, Any]:
    """The scenario YAML of a non-DeepSpeed recommendation (``memfit.core.scenario.inputs`` keys)."""
    from pathlib import Path

    i = rec.scenario_inputs
    model = i.model
    if model and Path(model).exists():
        model = str(Path(model).resolve())
    peft: Any = i.peft_method or "full"
    if i.peft_options:
        peft = {"method": peft, **{k: list(v) if isinstance(v, tuple) else v for k, v in i.peft_options.items()}}
    doc: dict[str, Any] = {"name": f"{i.name or model} (recommendation {rec.rank})", "model": model, "peft": peft,
                           "framework": i.framework, "precision": i.precision, "optim": i.optim,
                           "hardware": hardware, "load": {"dtype": i.load_dtype or "fp32"},
                           "train": {"seq_len": i.seq_len, "micro_batch": i.micro_batch,
                                     "gradient_checkpointing": bool(i.gradient_checkpointing),
                                     "gradient_accumulation_steps": i.grad_accum}}
    if i.optim_args:
        doc["optim_args"] = dict(i.optim_args)
    if i.quantization and i.quantization.get("method", "none") != "none":
        doc["quantization"] = {k: list(v) if isinstance(v, tuple) else v for k, v in i.quantization.items()}
    if i.fsdp:
        doc["fsdp"] = dict(i.fsdp)
    if i.ddp:
        doc["ddp"] = dict(i.ddp)
    doc["train"] = {k: v for k, v in doc["train"].items() if v is not None}
    from memfit.core.recommend.stack_doc import stack_section

    runtime = {k: v for k, v in (("torch_version", i.torch_version), ("cuda_version", i.cuda_version)) if v}
    if runtime:  # the stack the recommendation was judged under
        doc["runtime"] = runtime
    if stack_section(i):
        doc["stack"] = stack_section(i)
    return doc
