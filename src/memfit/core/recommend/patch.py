"""A candidate as edits to the user's own files: the DeepSpeed JSON and the scenario inputs.

``patch_deepspeed_json`` changes only the keys whose value changes, where the user wrote them
(``stage3_prefetch_bucket_size`` or its ``prefetch_bucket_size`` alias, ``bf16`` or the old
``bfloat16``), and keeps every ``"auto"`` the Trainer fills from its own arguments: the micro
batch (``per_device_train_batch_size``), the accumulation (``gradient_accumulation_steps``) and the
precision (``bf16``/``fp16``), which the recommendation changes where the user keeps them (their
TrainingArguments, or the scenario: ``user_files``); the hidden-size buckets while unchanged. An
``"auto"`` bucket that must change is written out as a number, and a note says so.

``candidate_inputs`` gives the scenario inputs of a candidate (the patched JSON inline), so the
exact ledger sees it through the same ``build_scenario`` path as any user scenario, and
``claimed_mismatches`` checks that what was built is what the candidate claims.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from memfit.core.lean_dataclass import dataclass
from memfit.core.recommend.deepspeed.space import Candidate
from memfit.core.scenario.types import Scenario
from memfit.core.scenario.inputs import ScenarioInputs

AUTO = "auto"
NVME_PATH_PLACEHOLDER = "/local_nvme"
"""Written as ``nvme_path`` when the user's config has none: the user must point it at their drive."""

_STAGE3_KEYS = (
    ("prefetch_bucket_size", "stage3_prefetch_bucket_size"),
    ("max_live_parameters", "stage3_max_live_parameters"),
    ("param_persistence_threshold", "stage3_param_persistence_threshold"),
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Change:
    """One setting the recommendation changes."""

    setting: str
    """What it is, as the user knows it (a JSON key or a script argument)."""
    before: str
    after: str


def _fmt(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int) and v >= 1_000_000 and v % 1_000_000 == 0:
        return f"{v:.0e}".replace("e+0", "e").replace("e+", "e")
    return str(v)


def describe_changes(base: Candidate, cand: Candidate) -> tuple[Change, ...]:
    """The settings ``cand`` changes, in the order a user reads them."""
    out: list[Change] = []

    def add(setting: str, a: object, b: object) -> None:
        if a != b:
            out.append(Change(setting=setting, before=_fmt(a), after=_fmt(b)))

    add("ZeRO stage", base.stage, cand.stage)
    if cand.stage >= 1:  # a stage that does not use a section leaves it as written (see the patch)
        add("offload_optimizer", base.offload_optimizer, cand.offload_optimizer)
    if cand.stage == 3:
        add("offload_param", base.offload_param, cand.offload_param)
    if cand.offload_optimizer != "none":
        add("offload_optimizer.pin_memory", base.pin_optimizer, cand.pin_optimizer)
    if cand.offload_param != "none":
        add("offload_param.pin_memory", base.pin_param, cand.pin_param)
    add("precision", base.precision, cand.precision)
    if (base.micro_batch, base.grad_accum) != (cand.micro_batch, cand.grad_accum):
        out.append(Change(setting="micro-batch x grad accumulation",
                          before=f"{base.micro_batch} x {base.grad_accum}", after=f"{cand.micro_batch} x {cand.grad_accum}"))
    add("gradient checkpointing", base.gradient_checkpointing, cand.gradient_checkpointing)
    add("zero.Init (HfDeepSpeedConfig)", base.zero_init, cand.zero_init)
    add("from_pretrained dtype", base.load_dtype, cand.load_dtype)
    add("low_cpu_mem_usage", base.low_cpu_mem_usage, cand.low_cpu_mem_usage)
    if cand.stage >= 1:
        add("reduce_bucket_size", base.reduce_bucket_size, cand.reduce_bucket_size)
    if cand.stage == 3:
        add("stage3_prefetch_bucket_size", base.prefetch_bucket_size, cand.prefetch_bucket_size)
        add("stage3_max_live_parameters", base.max_live_parameters, cand.max_live_parameters)
        add("stage3_param_persistence_threshold", base.param_persistence_threshold, cand.param_persistence_threshold)
    return tuple(out)


def count_changes(base: Candidate, c: Candidate) -> int:
    """``len(describe_changes(base, c))``, without building the descriptions (the search's hot path)."""
    n = ((base.stage != c.stage) + (c.stage >= 1 and base.offload_optimizer != c.offload_optimizer)
         + (c.stage == 3 and base.offload_param != c.offload_param) + (base.precision != c.precision)
         + ((base.micro_batch, base.grad_accum) != (c.micro_batch, c.grad_accum))
         + (base.gradient_checkpointing != c.gradient_checkpointing) + (base.zero_init != c.zero_init)
         + (base.load_dtype != c.load_dtype) + (base.low_cpu_mem_usage != c.low_cpu_mem_usage))
    if c.offload_optimizer != "none":
        n += base.pin_optimizer != c.pin_optimizer
    if c.offload_param != "none":
        n += base.pin_param != c.pin_param
    if c.stage >= 1:
        n += base.reduce_bucket_size != c.reduce_bucket_size
    if c.stage == 3:
        n += ((base.prefetch_bucket_size != c.prefetch_bucket_size) + (base.max_live_parameters != c.max_live_parameters)
              + (base.param_persistence_threshold != c.param_persistence_threshold))
    return n


def _pin_now(sc: Scenario, offload) -> bool:
    """What ``pin_memory`` means now for an offload section: as resolved, or, for one the user's
    configuration leaves off, the stack's DeepSpeed release default (False until 0.19.4), which a
    section written without the key would get."""
    if offload.device != "none":
        return offload.pin_memory
    from memfit.core.stack.deepspeed import offload_pin_memory_default

    stack = sc.versions
    return offload_pin_memory_default(stack.entry("deepspeed").version, stack.deepspeed)[0]


def _offload(zo: dict, key: str, deprecated: str, device: str, current: str, pin: bool, pin_now: bool,
             notes: list[str]) -> None:
    section = zo.get(key)
    if device != current:
        if device == "none":
            if isinstance(section, dict):
                section["device"] = "none"
            zo.pop(deprecated, None)
            return
        if not isinstance(section, dict):
            section = zo[key] = {}
            zo.pop(deprecated, None)
        section["device"] = device
        if device == "nvme" and not section.get("nvme_path"):
            section["nvme_path"] = NVME_PATH_PLACEHOLDER
            notes.append(f"zero_optimization.{key}.nvme_path is a placeholder ({NVME_PATH_PLACEHOLDER}): "
                         "point it at your NVMe drive")
    if device != "none" and pin != pin_now:
        if not isinstance(zo.get(key), dict):  # given by the deprecated key: write the new one
            zo.pop(deprecated, None)
            zo[key] = {"device": device}
        zo[key]["pin_memory"] = pin


def patch_deepspeed_json(raw: Mapping[str, Any], sc: Scenario, base: Candidate, cand: Candidate,
                         ) -> tuple[dict[str, Any], tuple[str, ...]]:
    """The user's DeepSpeed JSON ``raw`` with only the keys that ``cand`` changes changed.

    ``sc`` is the user's scenario (its resolved settings say what each key means now); ``base``
    is the user's configuration as a candidate. Returns the patched JSON and notes for the user.
    """
    out = copy.deepcopy(dict(raw))
    notes: list[str] = []
    z = sc.deepspeed.zero
    given = out.get("zero_optimization")
    zo = given if isinstance(given, dict) else {"stage": z.stage}  # absent (or the old true/false form)
    if cand.stage != z.stage:
        zo["stage"] = cand.stage
    # a section the stage does not use is left as written, except an optimizer offload under
    # ZeRO-0, which DeepSpeed ignores: it is turned off so the file says what runs
    if cand.stage >= 1 or z.offload_optimizer.device != "none":
        _offload(zo, "offload_optimizer", "cpu_offload", cand.offload_optimizer if cand.stage >= 1 else "none",
                 z.offload_optimizer.device, cand.pin_optimizer, _pin_now(sc, z.offload_optimizer), notes)
    if cand.stage == 3:
        _offload(zo, "offload_param", "cpu_offload_param", cand.offload_param, z.offload_param.device,
                 cand.pin_param, _pin_now(sc, z.offload_param), notes)
    if cand.stage >= 1 and cand.reduce_bucket_size != base.reduce_bucket_size:
        if zo.get("reduce_bucket_size") == AUTO:
            notes.append('reduce_bucket_size was "auto" (hidden_size^2): written as a number')
        zo["reduce_bucket_size"] = cand.reduce_bucket_size
    if cand.stage == 3:
        # base holds the values the user's JSON gives under ZeRO-3 ("auto" included), so an
        # unchanged value keeps the user's key and form
        for field, alias in _STAGE3_KEYS:
            value = getattr(cand, field)
            if value == getattr(base, field):
                continue
            key = field if (field in zo and alias not in zo) else alias
            if zo.get(key) == AUTO:
                notes.append(f'{key} was "auto": written as a number')
            zo[key] = value
    if zo is not given and zo != {"stage": z.stage}:
        out["zero_optimization"] = zo
    _patch_precision(out, sc, cand, notes)
    _patch_batch(out, base, cand, notes)
    return out, tuple(notes)


def _patch_precision(out: dict, sc: Scenario, cand: Candidate, notes: list[str]) -> None:
    """An ``"auto"`` ``enabled`` stays: the Trainer fills it from its ``bf16``/``fp16`` arguments
    (transformers ``HfTrainerDeepSpeedConfig.trainer_config_process``), which the recommendation sets
    (``candidate_inputs``; its TrainingArguments file, ``user_files``)."""
    current = sc.deepspeed.precision
    if cand.precision == current:
        return
    bf16_key = "bf16" if out.get("bf16") is not None or "bfloat16" not in out else "bfloat16"
    sections = {"fp16": "fp16", "bf16": bf16_key}
    for name, key in sections.items():
        sec = out.get(key)
        want = cand.precision == name
        if isinstance(sec, dict):
            if sec.get("enabled") != AUTO:
                sec["enabled"] = want
        elif want:
            out[key] = {"enabled": True}


def _patch_batch(out: dict, base: Candidate, cand: Candidate, notes: list[str]) -> None:
    """``"auto"`` micro-batch and accumulation stay: the Trainer fills them from
    ``per_device_train_batch_size`` and ``gradient_accumulation_steps``, which the recommendation
    sets; explicit values are changed."""
    if (cand.micro_batch, cand.grad_accum) == (base.micro_batch, base.grad_accum):
        return
    if _batch_keys_absent(out):  # the Trainer writes them from its arguments (transformers < 4.6 refuses them)
        return
    micro = out.get("train_micro_batch_size_per_gpu")
    if micro != AUTO:
        out["train_micro_batch_size_per_gpu"] = cand.micro_batch
    accum = out.get("gradient_accumulation_steps")
    if accum != AUTO and (accum is not None or cand.grad_accum != 1):
        out["gradient_accumulation_steps"] = cand.grad_accum


BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")


def _batch_keys_absent(raw: dict[str, Any]) -> bool:
    """A DeepSpeed config with none of the batch keys: the scenario's micro batch and accumulation
    are the script's (a Trainer writes them into the config; DeepSpeed alone refuses such a config,
    which the scenario's reading says), so the written config leaves them out too."""
    return not any(k in raw for k in BATCH_KEYS)


def _has_auto(raw: dict[str, Any], *paths: tuple[str, ...]) -> bool:
    for path in paths:
        node: Any = raw
        for k in path:
            node = node.get(k) if isinstance(node, dict) else None
        if node == AUTO:
            return True
    return False


def candidate_inputs(inputs: ScenarioInputs, patched: dict[str, Any], cand: Candidate) -> ScenarioInputs:
    """The user's scenario inputs with the candidate's script settings and its patched JSON; what
    the Trainer fills into an ``"auto"`` (accumulation, precision) is the candidate's."""
    accum = cand.grad_accum if (inputs.grad_accum is not None or _has_auto(patched, ("gradient_accumulation_steps",))
                                or (_batch_keys_absent(patched) and cand.grad_accum != 1)) else None
    precision = cand.precision if (inputs.precision is not None or _has_auto(
        patched, ("fp16", "enabled"), ("bf16", "enabled"), ("bfloat16", "enabled"))) else None
    return replace(inputs, deepspeed=None, deepspeed_inline=patched, load_dtype=cand.load_dtype,
                   zero_init=cand.zero_init, low_cpu_mem_usage=cand.low_cpu_mem_usage, micro_batch=cand.micro_batch,
                   gradient_checkpointing=cand.gradient_checkpointing, accelerator="cuda", grad_accum=accum,
                   precision=precision)


def claimed_mismatches(sc: Scenario, cand: Candidate) -> list[str]:
    """Settings of the built scenario ``sc`` that differ from what ``cand`` claims (empty: all agree)."""
    ds, z = sc.deepspeed, sc.deepspeed.zero
    got: dict[str, object] = {
        "stage": z.stage, "precision": ds.precision, "micro_batch": ds.train_micro_batch_size_per_gpu,
        "grad_accum": ds.gradient_accumulation_steps, "zero_init": sc.load.zero_init and z.stage == 3,
        "load_dtype": sc.load.dtype, "low_cpu_mem_usage": sc.load.low_cpu_mem_usage,
        "gradient_checkpointing": sc.train.gradient_checkpointing,
        "offload_optimizer": z.offload_optimizer.device if z.stage >= 1 else "none",
        "offload_param": z.offload_param.device if z.stage == 3 else "none",
    }
    if z.stage >= 1:
        got["reduce_bucket_size"] = z.reduce_bucket_size
    if got["offload_optimizer"] != "none":
        got["pin_optimizer"] = z.offload_optimizer.pin_memory
    if got["offload_param"] != "none":
        got["pin_param"] = z.offload_param.pin_memory
    if z.stage == 3:
        got.update(prefetch_bucket_size=z.prefetch_bucket_size, max_live_parameters=z.max_live_parameters,
                   param_persistence_threshold=z.param_persistence_threshold)
    return [f"{k}: claimed {getattr(cand, k)!r}, built {v!r}" for k, v in got.items() if getattr(cand, k) != v]
