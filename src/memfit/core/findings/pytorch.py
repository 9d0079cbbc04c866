"""Plain-words findings for runs outside DeepSpeed (torch, DDP, FSDP, FSDP2), computed from the ledger.

Every number quoted is read off the phase ledgers (never recomputed), like ``memfit.core.findings.deepspeed``.
"""

from __future__ import annotations

from memfit.core.findings.common import _first_failure, _risk_finding, _worst_failure, _host_findings, _phase, _tightest
from memfit.core.ledger_types import Finding, PhaseLedger, Verdict
from memfit.core.scenario.types import Scenario
from memfit.core.units import fmt_both, fmt_bytes


def _resident(ph: PhaseLedger | None, key: str) -> int:
    return sum(i.bytes for i in ph.resident if i.key == key) if ph else 0


def _peak_item(phases: tuple[PhaseLedger, ...], key: str) -> int:
    return max((i.bytes for ph in phases for i in ph.items if i.key == key), default=0)


def pytorch_findings(sc: Scenario, phases: tuple[PhaseLedger, ...], verdict: Verdict) -> tuple[Finding, ...]:
    out: list[Finding] = []
    failure = _first_failure(sc, phases, verdict)
    if failure is not None:
        out.append(failure)
        worst = _worst_failure(sc, phases, verdict)
        if worst is not None:
            out.append(worst)
    else:
        out.append(_risk_finding(sc, verdict) or _tightest(sc, phases))
    step2 = _phase(phases, "step2.optimizer_step") or _phase(phases, "optimizer_step")
    ts = sc.torch
    if step2 is not None:
        states = _resident(step2, "optimizer.states") + _resident(step2, "optimizer.paged_states")
        n_tr = sc.model.trainable_params
        if n_tr:
            out.append(Finding(id="optimizer-states", severity="info", message=(
                f"{ts.optim} keeps {fmt_both(states)} of state for {n_tr:,} trained params "
                f"({states / n_tr:.2f} B each) under precision {ts.precision}"
                + ("; in pure 16-bit, torch's optimizers keep their states in the params' dtype (no fp32 master)"
                   if ts.precision in ("bf16", "fp16") and not ts.optim.startswith(("adamw_bnb", "paged", "lion", "adamw_8bit"))
                   else "") + ".")))
    paged = _resident(step2, "optimizer.paged_states") if step2 else 0
    if paged:
        out.append(Finding(id="paged-optimizer", severity="info", message=(
            f"{ts.optim} puts {fmt_both(paged)} of its states in unified memory (cudaMallocManaged): they sit on the "
            "GPU while there is room and the driver evicts them to host RAM when the GPU runs short, so they are "
            "counted in host RAM here and cannot cause a CUDA out-of-memory error; the GPU figures do not include "
            "them, and nvidia-smi shows them while they are resident.")))
    casts = _peak_item(phases, "amp.weight_casts")
    if casts:
        out.append(Finding(id="autocast-weight-copies", severity="info", message=(
            f"Under {ts.precision} autocast makes a 16-bit copy of every fp32 Linear weight it uses and autograd keeps "
            f"it for backward: up to {fmt_both(casts)} during a step, on top of the fp32 weights. Loading the frozen "
            "weights in 16 bits (LoRA) or training in pure bf16 avoids it.")))
    deq = _peak_item(phases, "quant.dequantized_weight")
    if sc.quant.enabled:
        q = _resident(_phase(phases, "setup"), "quant.weights")
        up = [p for p in phases if p.name == "load"]
        out.append(Finding(id="quantized-base", severity="info", message=(
            f"The bitsandbytes {sc.quant.method} base takes {fmt_both(q)} on the GPU"
            + (f"; each quantized matmul dequantizes its weight into a temporary of up to {fmt_bytes(deq)}" if deq else "")
            + (". prepare_model_for_kbit_training upcasts every non-quantized parameter (embeddings, norms, the "
               "output head) to fp32" if sc.quant.prepare_kbit and sc.load.dtype != "fp32" else "")
            + ".")))
        del up
    out.extend(_host_findings(sc, phases, verdict))
    out.append(Finding(id="estimates", severity="info", message=(
        "Exact (byte for byte from the libraries' code, checked against real CPU runs): parameters and their "
        "dtypes, quantized storage, gradients, optimizer states and step temporaries"
        + (", DDP buckets" if sc.framework == "ddp" else "") + (", FSDP shards and flat parameters" if sc.framework in ("fsdp", "fsdp2") else "")
        + ". Estimated: activations (analytic), autocast's weight copies (which are kept is a rule), the GPU memory "
        "outside PyTorch (CUDA context, cuBLAS workspace, NCCL) and the process itself in host memory (the host.* "
        "items: measured on a CPU run or published, per part).")))
    return tuple(out)
