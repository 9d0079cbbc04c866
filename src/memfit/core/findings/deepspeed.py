"""Plain-words findings of a DeepSpeed run: why it fails or nearly fails, and what the numbers mean.

Every finding is computed from the ledger (never recomputed from formulas of its own), so the
numbers it quotes are the numbers the tables show.
"""

from __future__ import annotations

from memfit.core.findings.common import _first_failure, _risk_finding, _worst_failure, _host_findings, _item, _phase, _tightest
from memfit.core.findings.inputs import input_findings
from memfit.core.ledger_types import Device, Finding, PhaseLedger, Verdict
from memfit.core.scenario.types import Scenario
from memfit.core.units import fmt_both, fmt_bytes
from memfit.core.verdict import gpu_figure


def deepspeed_findings(sc: Scenario, phases: tuple[PhaseLedger, ...], verdict: Verdict) -> tuple[Finding, ...]:
    out: list[Finding] = []
    ds = sc.deepspeed
    z = ds.zero
    W = sc.world_size
    model = sc.model
    first = verdict.failures[0] if verdict.failures else None

    failure = _first_failure(sc, phases, verdict)
    if failure is not None:
        out.append(failure)
        worst = _worst_failure(sc, phases, verdict)
        if worst is not None:
            out.append(worst)

    if first is None:
        out.append(_risk_finding(sc, verdict) or _tightest(sc, phases))

    move = _phase(phases, "initialize.move")
    moved = _item(move, "move.params")
    if z.stage == 3 and moved:
        gpu_fail = first is not None and first.device == "gpu" and first.phase == "initialize.move"
        out.append(Finding(id="whole-model-moved-to-gpu", severity="error" if gpu_fail else "warning", message=(
            f"deepspeed.initialize moves the whole model to every GPU before ZeRO-3 partitions it: "
            f"{model.total_params:,} params x {_elem(ds.precision)} B = {fmt_both(moved)} on each rank's GPU "
            f"(engine.py _configure_distributed_model: self.module.to(self.device)), because the model was not "
            f"built under deepspeed.zero.Init. ZeRO-3 then frees it param by param, but the CUDA caching allocator "
            f"keeps it reserved{_still_reserved(phases)}. Build the model under zero.Init (with transformers: create "
            f"HfDeepSpeedConfig(ds_config) before from_pretrained) and no GPU ever holds more than about one module.")))

    alloc = _allocator_finding(sc, phases)
    if alloc is not None:
        out.append(alloc)

    if model.frozen_params and ds.optimizer.states_per_param == 2:
        out.append(_sixteen_bytes(sc, phases))

    out.extend(_host_findings(sc, phases, verdict))

    from memfit.core.stack.deepspeed import frozen_filter_release, optimizes_frozen_params

    if sc.train.model_parameters == "all" and model.frozen_params and \
            optimizes_frozen_params(sc.ds_version, sc.versions.deepspeed, z.stage):
        out.append(Finding(id="frozen-params-get-optimizer-state", severity="warning", message=(
            f"DeepSpeed before {frozen_filter_release(z.stage)} gives every param passed to initialize a 16-bit "
            f"partition, an fp32 master, a "
            f"gradient buffer and optimizer state, frozen ones too: passing model.parameters() costs "
            f"{model.frozen_params:,} frozen params x 16 B / {W} per rank. Pass only the trained params.")))
    if sc.load.zero_init and z.stage != 3:
        out.append(Finding(id="zero-init-needs-stage-3", severity="info", message=(
            "deepspeed.zero.Init only partitions parameters under ZeRO stage 3; with this stage the model is "
            "built and moved whole.")))
    if sc.load.dtype == "fp32" and ds.precision != "fp32" and not (sc.load.zero_init and z.stage == 3):
        out.append(Finding(id="fp32-load", severity="info", message=(
            f"from_pretrained loads in fp32 unless told otherwise: {fmt_both(_item(_phase(phases, 'load'), 'load.weights'))} "
            f"per process before DeepSpeed casts it to {ds.precision}. Pass torch_dtype=torch.{_torch(ds.precision)} "
            f"to halve that.")))
    cast = _cast_mismatch(sc)
    if cast is not None:
        out.append(cast)
    out.append(Finding(id="estimates", severity="info", message=(
        "Exact (byte for byte from DeepSpeed's code): parameters, partitions, optimizer buffers and states. "
        "Estimated: activations (analytic; `memfit trace` gives the exact figure), params gathered at a given "
        "instant, the GPU memory outside PyTorch (CUDA context, NCCL, cuBLAS: per GPU architecture and torch/CUDA "
        "version, from published measurements) and the process itself in host memory (interpreter, libraries, CUDA runtime, tokenizer, dataset, DataLoader workers: measured on a CPU run or published, per part, see the host.* items). The allocator figures "
        "(blocks, segments, pinned rounding and caching) are torch's rules applied to these allocations on one "
        "stream.")))
    out.extend(input_findings(sc))
    return tuple(out)


def _elem(precision: str) -> int:
    return 4 if precision == "fp32" else 2


def _torch(precision: str) -> str:
    return {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}[precision]


_TRAINED_STATE_KEYS = {
    "zero3.flat_16bit_partitions": "16-bit weights",
    "zero12.flat_16bit_params": "16-bit weights",
    "zero12.offload_16bit_partition": "16-bit host copy",
    "zero3.grad_partitions_flat": "16-bit gradients",
    "zero12.grads_in_partition": "16-bit gradients",
    "step.gradients": "16-bit gradients",
    "optimizer.fp32_grads": "fp32 gradients",
    "optimizer.fp32_master": "fp32 master",
    "optimizer.states": "optimizer states",
}


def _sixteen_bytes(sc: Scenario, phases: tuple[PhaseLedger, ...]) -> Finding:
    """The usual '16 bytes per trained param' accounting, against what the ledger holds."""
    W = sc.world_size
    n_tr = sc.model.trainable_params
    step = _phase(phases, "optimizer_step")
    parts: dict[str, int] = {}
    where: dict[str, int] = {}
    for i in step.resident if step else ():
        label = _TRAINED_STATE_KEYS.get(i.key)
        if label:
            parts[label] = parts.get(label, 0) + i.bytes
            dev = {Device.GPU: "GPU", Device.CPU_PINNED: "CPU pinned", Device.CPU_PAGEABLE: "CPU pageable",
                   Device.NVME: "NVMe"}[i.device]
            where[dev] = where.get(dev, 0) + i.bytes
    total = sum(parts.values())
    per_elem = total / (n_tr / W) if n_tr else 0
    breakdown = ", ".join(f"{k} {fmt_bytes(v)}" for k, v in parts.items())
    placed = ", ".join(f"{fmt_bytes(v)} on {k}" for k, v in where.items())
    frozen = sc.model.frozen_params
    eb = _elem(sc.deepspeed.precision)
    return Finding(id="sixteen-bytes-per-trainable-param", severity="info", message=(
        f"The textbook 16 bytes per trained parameter (16-bit weight 2 + 16-bit gradient 2 + fp32 master 4 + "
        f"Adam's two fp32 states 8) gives {n_tr:,} x 16 B = {fmt_both(n_tr * 16)}, 1/{W} per rank under ZeRO. "
        f"DeepSpeed's buffers for them come to {per_elem:.1f} B per trained element here, {fmt_both(total)} per rank "
        f"({breakdown}), placed {placed}. The {frozen:,} frozen params add {eb} B each "
        f"({fmt_both(frozen * eb)}) and get no gradient or optimizer state"
        + (f"; under ZeRO-3 they are partitioned too, 1/{W} per rank." if sc.deepspeed.zero.stage == 3
           else "; below ZeRO-3 every GPU holds all of them.")))


def _still_reserved(phases: tuple[PhaseLedger, ...]) -> str:
    part = _phase(phases, "initialize.partition")
    if part is None or not part.allocators_simulated:
        return ""
    return f" (the simulated allocator still holds {fmt_bytes(part.gpu_reserved_bytes)} reserved after partitioning)"


def _allocator_finding(sc: Scenario, phases: tuple[PhaseLedger, ...]) -> Finding | None:
    """What torch's allocators add to the tensors' bytes at the GPU-verdict peak phase."""
    if not any(p.allocators_simulated for p in phases):
        return None
    ph = max(phases, key=gpu_figure)
    rt = sc.runtime
    conf = f", PYTORCH_CUDA_ALLOC_CONF={rt.alloc_conf}" if rt.alloc_conf else ""
    stranded = ph.gpu_oom_relevant_bytes - ph.gpu_outside_pytorch_bytes - ph.gpu_allocated_bytes
    retries = sum(p.gpu_alloc_retries for p in phases)
    return Finding(id="allocator-figures", severity="info", message=(
        f"With torch {rt.torch_version}'s caching allocator{conf}, phase {ph.name} peaks at "
        f"{fmt_bytes(ph.gpu_allocated_bytes)} allocated (blocks) and {fmt_bytes(ph.gpu_reserved_bytes)} reserved "
        f"per rank. What a failing cudaMalloc cannot get back is {fmt_bytes(ph.gpu_oom_relevant_bytes)}: "
        f"allocated plus {fmt_bytes(max(stranded, 0))} of free space stranded in segments that still hold a live "
        f"block (or just cudaMalloc'ed for a request), plus {fmt_bytes(ph.gpu_outside_pytorch_bytes)} outside "
        f"PyTorch (CUDA context, NCCL); that is the figure the verdict uses. nvidia-smi would show about "
        f"{fmt_bytes(ph.gpu_nvidia_smi_bytes)}. Cached segments are released and the allocation retried "
        f"{retries} time(s) over the run."))


def _cast_mismatch(sc: Scenario) -> Finding | None:
    """A tuner whose forward raises under the params-only cast (``peft.cast_mismatch``), on a release that
    casts so, with a model built in fp32 outside zero.Init (the case checked against peft's forward)."""
    from memfit.core.peft.cast_mismatch import RAISES_UNDER_PARAMS_ONLY_CAST
    from memfit.core.stack.deepspeed import casts_params_only

    why = RAISES_UNDER_PARAMS_ONLY_CAST.get(sc.peft.method)
    ds = sc.deepspeed
    if why is None or ds.precision == "fp32" or sc.load.dtype != "fp32" or sc.load.zero_init:
        return None
    entry = sc.versions.entry("deepspeed") if sc.versions is not None else None
    params_only, release = casts_params_only(entry.version if entry else None, entry.line if entry else "0.19")
    if not params_only:
        return None
    return Finding(id="tuner-dtype-mismatch", severity="error", message=(
        f"This run stops at its first forward: {release}, and {sc.peft.method}'s forward then multiplies two "
        f"dtypes ({why}), which torch refuses (\"expected m1 and m2 to have the same dtype\"; peft's own forward "
        f"on a model built in fp32 and cast so). The memory figures are what it would need if it ran. Loading the "
        f"model in {ds.precision} (torch_dtype=torch.{_torch(ds.precision)}) before peft builds the adapters, or "
        f"DeepSpeed 0.19.1 or earlier (module.{_torch(ds.precision)}() casts the buffers too), avoids this cast "
        f"(not checked here)."))
