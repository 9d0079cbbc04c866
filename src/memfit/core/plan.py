"""``make_plan``: a scenario in, the whole typed answer out (ledger, verdict, findings)."""

from __future__ import annotations

from memfit.core.findings.derive import derive_findings
from memfit.core.ledger.build import build_timeline
from memfit.core.ledger.evaluation import eval_notes
from memfit.core.ledger_types import ParamCounts, Plan, TracedStep
from memfit.core.quant import quant_notes
from memfit.core.scenario.types import Scenario
from memfit.core.stack.deepspeed import allocation_reason
from memfit.core.verdict import judge
from memfit.errors import MemfitError


def build_notes(sc: Scenario, model_cache: dict | None = None) -> tuple[str, ...]:
    """What the non-DeepSpeed ledger resolved (dtypes of trained params, ...): from the model-state
    view the ledger built (``model_cache``, filled by ``build_timeline``), else built here."""
    if model_cache:
        (model,) = model_cache.values()  # one scenario, one model
        return model.notes
    from memfit.core.ledger.pytorch.params import build_torch_model

    return build_torch_model(sc).notes


def count_params(sc: Scenario) -> ParamCounts:
    m = sc.model
    big = m.largest_param
    return ParamCounts(total=m.total_params, trainable=m.trainable_params, frozen=m.frozen_params,
                       largest=big.numel, largest_name=big.name)


def make_plan(sc: Scenario, traced: TracedStep | None = None) -> Plan:
    """The plan; with ``traced`` (from ``memfit.trace.ledger_step``) the forward/backward phases use
    the traced step memory instead of the analytic estimate (the torch/DDP/FSDP recipes book it per
    stage from ``traced.by_module``: one without it would be dropped, so it is refused)."""
    if traced is not None and sc.framework != "deepspeed" and not traced.by_module:
        raise MemfitError(f"a traced step without per-module bytes cannot replace the activations of a "
                          f"{sc.framework} plan (its layers are booked one by one)")
    models: dict = {}
    timeline = build_timeline(sc, traced, model_cache=models)
    phases = timeline.phases()
    if not sc.train.save:  # train.save false: the run saves nothing at the end
        phases = tuple(p for p in phases if p.name != "save")
    epoch = None
    if sc.epoch.simulate:
        from memfit.core.epoch.simulate import epoch_phases, simulate_epoch

        epoch = simulate_epoch(sc, timeline)
        if epoch is not None:
            phases = _with_epoch(phases, epoch_phases(sc, epoch, phases))
    verdict = judge(phases, sc.hardware)
    notes = (
        traced.note if traced is not None else
        "Activations are analytic (Korthikanti-style, corrected for frozen weights and PEFT); "
        "`memfit plan --exact` traces them from the model's code.",
        (f"Allocation behaviour of DeepSpeed {sc.ds_version}.x ({allocation_reason(sc.versions.deepspeed)}). "
         if sc.framework == "deepspeed" and sc.stack is not None else
         f"Allocation behaviour of DeepSpeed {sc.ds_version}.x. " if sc.framework == "deepspeed" else "")
        + allocator_note(sc),
        sc.versions.summary(),
        *sc.versions.notes,
        *timeline.granularity_notes,
        *sc.model.notes,
        *((sc.train.batch_shape.describe(),) if sc.train.batch_shape is not None else ()),
        *(() if sc.train.save else ("No save phase: train.save is false (the run saves no model at the end; "
                                    "--save plans it).",)),
    ) + tuple(sc.input_notes) + (build_notes(sc, models) if sc.framework != "deepspeed" else quant_notes(sc)) + eval_notes(sc)
    if epoch is not None:
        from memfit.core.epoch.words import epoch_notes

        notes += epoch_notes(epoch)
    return Plan(scenario_name=sc.name, params=count_params(sc), phases=phases, verdict=verdict,
                findings=derive_findings(sc, phases, verdict), notes=notes, epoch=epoch)


def _with_epoch(phases, extra):  # noqa: ANN001
    """The epoch's phases after the steady state (before evaluation and save)."""
    names = [p.name for p in phases]
    at = names.index("step2.optimizer_step") + 1 if "step2.optimizer_step" in names else len(phases)
    return tuple(phases[:at]) + tuple(extra) + tuple(phases[at:])


def allocator_note(sc: Scenario) -> str:
    """Which allocator rules the figures follow, said out loud (defaults included)."""
    from memfit.core.alloc.conf import parse_alloc_conf
    from memfit.core.alloc.versions import DEFAULT_TORCH, resolve_torch_version

    if sc.accelerator != "cuda":
        return "DeepSpeed's CPU accelerator: no CUDA or pinned allocator to simulate; GPU bytes are what tensors hold."
    rt = sc.runtime
    v = resolve_torch_version(rt.torch_version)
    parts = [f"Allocator figures follow torch {v.name}'s caching allocators"
             + (" (the default; --torch-version changes it)" if v.name == DEFAULT_TORCH else "")]
    if not v.rules_read:
        parts.append(f"torch {v.name}'s allocator source was not read here: torch {DEFAULT_TORCH}'s rules are used")
    parts.append(f"PYTORCH_CUDA_ALLOC_CONF={rt.alloc_conf}" if rt.alloc_conf else "PYTORCH_CUDA_ALLOC_CONF unset (torch's defaults)")
    if rt.alloc_conf_source:
        parts.append(rt.alloc_conf_source)
    parts.extend(parse_alloc_conf(rt.alloc_conf, v).notes)
    if rt.pin_memory_backend == "native":
        parts.append("DS_PIN_MEMORY_BACKEND=native: DeepSpeed mlocks pinned tensors itself (exact, freed on GC)")
    parts.append(f"CUDA {rt.cuda_version or v.default_cuda}")
    return "; ".join(parts) + "."
