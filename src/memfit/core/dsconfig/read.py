"""Reading a DeepSpeed config: the entry points, the batch triple (step 3) and the whole config."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from memfit.core.frameworks.deepspeed import DeepSpeedSettings
from memfit.core.dsconfig.auto import AUTO, AUTO_FLAGS, AutoContext, resolve_auto_record
from memfit.core.dsconfig.sections import check_sections
from memfit.core.reading import check_tree, parse_json, read_text
from memfit.core.dsconfig.optimizer import _read_optimizer
from memfit.core.dsconfig.validate import (REMOVED_TOP_LEVEL_KEYS, _as_bool, _as_float, _as_int, _read_dtype,
                                           _read_precision, _read_zero)
from memfit.errors import MemfitError


# --------------------------------------------------------------------------------------------
# Entry points
# --------------------------------------------------------------------------------------------


def load_deepspeed_config(path: str | Path, *, context: AutoContext | None = None
                          ) -> tuple[DeepSpeedSettings, dict]:
    """Read a DeepSpeed JSON file: the typed settings and the JSON with ``"auto"`` resolved (what
    a replay hands to ``deepspeed.initialize(config=...)``).

    Duplicate keys are refused, as DeepSpeed's ``dict_raise_error_on_duplicate_keys`` does. Only
    strict JSON is read (DeepSpeed also takes hjson; transformers and accelerate take JSON only).
    """
    raw = read_deepspeed_json(path)
    resolved, record = resolve_auto_record(raw, context)
    return _parse_resolved(resolved, context, record), resolved


def read_deepspeed_json(path: str | Path) -> dict:
    """The JSON object of a DeepSpeed config file, as written (size-capped, strict JSON, duplicate
    keys refused as DeepSpeed's ``dict_raise_error_on_duplicate_keys`` does)."""
    p = Path(path)
    what = f"DeepSpeed config {p}"
    raw = parse_json(read_text(p, what="DeepSpeed config"), what=what, object_pairs_hook=_reject_duplicate_keys)
    if not isinstance(raw, dict):
        raise MemfitError(f"{what} must be a JSON object, got {type(raw).__name__}")
    return raw


def parse_deepspeed_config(raw: Mapping, *, context: AutoContext | None = None) -> DeepSpeedSettings:
    """Typed settings from a DeepSpeed config dict (``"auto"`` filled from ``context``). The input
    is not modified."""
    if not isinstance(raw, Mapping):
        raise MemfitError(f"a DeepSpeed config must be a JSON object, got {type(raw).__name__}")
    check_tree(raw, what="DeepSpeed config")
    resolved, record = resolve_auto_record(raw, context)
    return _parse_resolved(resolved, context, record)


def _reject_duplicate_keys(pairs: list[tuple[str, object]]) -> dict:
    d = dict(pairs)
    if len(d) != len(pairs):
        seen: set[str] = set()
        dup = sorted({k for k, _ in pairs if k in seen or seen.add(k)})
        raise MemfitError(f"duplicate keys in DeepSpeed config: {', '.join(dup)} (DeepSpeed refuses them too)")
    return d


# --------------------------------------------------------------------------------------------
# Step 3: the batch triple, as DeepSpeedConfig completes and checks it
# --------------------------------------------------------------------------------------------


def resolve_batch_sizes(train: int | None, micro: int | None, accum: int | None, world: int | None
                        ) -> tuple[int | None, int, int]:
    """``DeepSpeedConfig._set_batch_related_parameters`` then ``_batch_assertion``
    (``runtime/config.py``): the missing members of ``train = micro x accum x world`` derived with
    integer division, then the identity checked. Returns ``(train, micro, accum)``; ``train`` is
    None when the world size is unknown and the config does not give it (the rest needs no world
    size). Any other derivation that needs the world size without one is an error."""
    need_world = f"pass {AUTO_FLAGS['world_size']} (the world size) to derive them"
    if train is not None and micro is not None and accum is not None:
        pass
    elif train is not None and micro is not None:
        if world is None:
            raise MemfitError(f"DeepSpeed config gives train_batch_size and the micro batch but not "
                              f"gradient_accumulation_steps: {need_world}")
        accum = train // micro // world
    elif train is not None and accum is not None:
        if world is None:
            raise MemfitError(f"DeepSpeed config gives train_batch_size and gradient_accumulation_steps but not "
                              f"train_micro_batch_size_per_gpu: {need_world}")
        micro = train // world // accum
    elif micro is not None and accum is not None:
        train = None if world is None else micro * accum * world
    elif train is not None:
        if world is None:
            raise MemfitError(f"DeepSpeed config gives only train_batch_size: {need_world}")
        accum, micro = 1, train // world
    elif micro is not None:
        accum = 1
        train = None if world is None else micro * world
    else:
        raise MemfitError("DeepSpeed config needs train_batch_size or train_micro_batch_size_per_gpu "
                          "(DeepSpeed refuses a config with neither)")
    if micro < 1 or accum < 1:
        raise MemfitError(f"DeepSpeed config batch sizes do not divide: train_batch_size {train} over "
                          f"{world} GPUs gives micro batch {micro} x gradient accumulation {accum}")
    if world is not None and train != micro * accum * world:
        raise MemfitError(f"DeepSpeed config train_batch_size {train} != train_micro_batch_size_per_gpu {micro} "
                          f"x gradient_accumulation_steps {accum} x world size {world}")
    if world is None and train is not None and train % (micro * accum):
        raise MemfitError(f"DeepSpeed config train_batch_size {train} is not a multiple of "
                          f"micro batch {micro} x gradient accumulation {accum} for any world size")
    return train, micro, accum


def _read_batch_member(raw: dict, key: str) -> int | None:
    value = raw.get(key)
    if value is None:
        return None
    n = _as_int(value, key)
    if n < 1:
        raise MemfitError(f"DeepSpeed config {key} must be >= 1, got {value!r}")
    if n > MAX_BATCH:
        raise MemfitError(f"DeepSpeed config {key} is {n:,}; memfit plans at most {MAX_BATCH:,}")
    return n


MAX_BATCH = 2**31 - 1
"""The largest batch size memfit plans (far beyond any real run; sizes computed from it stay exact)."""


# --------------------------------------------------------------------------------------------
# The whole config
# --------------------------------------------------------------------------------------------

def _parse_resolved(cfg: dict, context: AutoContext | None, auto_resolved: tuple[str, ...] = ()
                    ) -> DeepSpeedSettings:
    notes: list[str] = []
    warnings: list[str] = []
    for key in cfg:
        if key in REMOVED_TOP_LEVEL_KEYS:
            raise MemfitError(f"DeepSpeed config {key}: this feature was removed from DeepSpeed (0.19.8 refuses "
                              "the section)")
    check_sections(cfg, warnings)

    zero = _read_zero(cfg, notes, warnings)
    precision, fp16, bf16 = _read_precision(cfg, zero.stage, notes, warnings)
    optimizer = _read_optimizer(cfg, zero)

    data_types = cfg.get("data_types", {})
    if not isinstance(data_types, Mapping):
        raise MemfitError(f"DeepSpeed config data_types must be an object, got {data_types!r}")
    grad_accum_dtype = _read_dtype(data_types.get("grad_accum_dtype"), "data_types.grad_accum_dtype")
    param_dtype = _read_dtype(data_types.get("param_dtype"), "data_types.param_dtype")
    keep = data_types.get("keep_in_fp32_modules", AUTO)
    if keep != AUTO and not (isinstance(keep, list) and all(isinstance(n, str) for n in keep)):
        raise MemfitError(f'DeepSpeed config data_types.keep_in_fp32_modules must be "auto" or a list of name '
                          f"patterns, got {keep!r}")
    if zero.stage == 0 and (grad_accum_dtype or precision) != precision:
        # engine.py _do_optimizer_sanity_check: NotImplementedError without ZeRO
        raise MemfitError(f"DeepSpeed config data_types.grad_accum_dtype={grad_accum_dtype} with {precision} "
                          "training needs ZeRO (stage 0 supports only matching dtypes)")

    comm = cfg.get("communication_data_type")
    if comm is not None:
        if not isinstance(comm, str) or comm.lower() not in ("fp16", "bf16", "fp32"):
            raise MemfitError(f"DeepSpeed config communication_data_type must be fp16, bf16 or fp32, got {comm!r}")
        comm = comm.lower()

    clip = cfg.get("gradient_clipping", 1.0)
    clip = _as_float(clip, "gradient_clipping")
    if clip < 0:
        raise MemfitError(f"DeepSpeed config gradient_clipping must be >= 0 (0 turns clipping off), got {clip:g}")

    untested = cfg.get("zero_allow_untested_optimizer", False)
    _as_bool(untested, "zero_allow_untested_optimizer")

    scheduler = cfg.get("scheduler")
    if scheduler is not None and not isinstance(scheduler, Mapping):
        raise MemfitError(f"DeepSpeed config scheduler must be an object, got {scheduler!r}")
    scheduler_type = scheduler.get("type") if scheduler else None

    world = context.world_size if context else None
    train, micro, accum = resolve_batch_sizes(_read_batch_member(cfg, "train_batch_size"),
                                              _read_batch_member(cfg, "train_micro_batch_size_per_gpu"),
                                              _read_batch_member(cfg, "gradient_accumulation_steps"), world)
    if world is None:
        notes.append("world size unknown: the batch sizes were not checked against it")

    return DeepSpeedSettings(
        precision=precision, grad_accum_dtype=grad_accum_dtype, param_dtype=param_dtype,
        communication_data_type=comm, zero=zero, fp16=fp16, bf16=bf16, optimizer=optimizer,
        has_scheduler=scheduler_type is not None, scheduler_type=scheduler_type,
        zero_allow_untested_optimizer=untested, train_micro_batch_size_per_gpu=micro,
        gradient_accumulation_steps=accum, train_batch_size=train, world_size=world, gradient_clipping=clip,
        activation_checkpointing=isinstance(cfg.get("activation_checkpointing"), Mapping), notes=tuple(notes),
        warnings=tuple(warnings), auto_resolved=auto_resolved)
