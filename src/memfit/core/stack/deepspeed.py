"""Which of memfit's DeepSpeed allocation models a DeepSpeed release runs (``Scenario.ds_version``).

The ledger's DeepSpeed recipes (``core/ledger/deepspeed/``) model three lines, each read from the
release's source: 0.19 (0.19.8, installed here), 0.6 (0.6.x, Feb-Jul 2022) and 0.5 (0.5.10's
source, which ``tests/conftest.py:ds0510`` downloads; 0.5.8, the seed case's release, allocates the
same in every recipe memfit models: ``stage3.py``, ``stage2.py``, ``partition_parameters.py`` and
``engine.py:_configure_distributed_model`` differ from 0.5.10 in a class name and in dead code).
``ALLOCATION_LINES`` maps each release line to the model whose allocations it has, with the reason.
"""

from __future__ import annotations

from memfit.errors import MemfitError

ALLOCATION_LINES: dict[str, tuple[str, str]] = {
    "0.3": ("0.5", "read: 0.3.10's zero/stage2.py: ZeRO-1/2 allocate as 0.5 (move_to_cpu before flattening, "
                   "the master cloned on its device, the init-time step; its temp_grad_buffer_for_cpu_offload is "
                   "made fp32 first, a transient not modelled); 0.3.10 has no ZeRO-3"),
    "0.5": ("0.5", "read: 0.5.8 and 0.5.10 sources"),
    "0.6": ("0.6", "read: 0.6.0 source"),
    "0.7": ("0.6", "read: 0.7.7 source: the ZeRO-1/2 and ZeRO-3 code memfit models allocates as 0.6's"),
    "0.8": ("0.6", "read: 0.8.0 source: as 0.6, except that ZeRO-3 optimizes only the trainable params "
                   "(_get_trainable_parameter_groups, as 0.19)"),
    **{f"0.{m}": ("0.19", "the 0.19.8 source read; the ZeRO allocation code memfit models is unchanged since 0.13")
       for m in range(13, 20)},
}
"""release line -> (allocation model, why)."""


def allocation_line(release: str | None, *, where: str = "--deepspeed-version") -> str:
    """The allocation model of a DeepSpeed release line (None, DeepSpeed not installed: 0.19, unused)."""
    if release is None:
        return "0.19"
    hit = ALLOCATION_LINES.get(release)
    if hit is None:
        known = ", ".join(sorted(ALLOCATION_LINES, key=lambda v: int(v.split(".")[1])))
        raise MemfitError(f"{where}: DeepSpeed {release}.x's allocations are not modelled; memfit models DeepSpeed "
                          f"{known}")
    return hit[0]


def allocation_reason(release: str | None) -> str:
    return "" if release is None else ALLOCATION_LINES[release][1]


def optimizes_frozen_params(allocation: str, release: str | None, stage: int) -> bool:
    """Every param of ``model_parameters`` goes into ZeRO's 16-bit groups, frozen ones too: ZeRO-1/2
    before 0.7 (0.7.7 ``stage_1_and_2.py``: ``trainable_parameters = [param for param in
    param_group['params'] if param.requires_grad]``), ZeRO-3 before 0.8 (0.8.0 ``stage3.py``:
    ``_get_trainable_parameter_groups``)."""
    from memfit.core.stack.lines import at_least

    if allocation == "0.19":
        return False
    if release is None:  # a scenario built from its allocation line alone (0.5 or 0.6)
        return True
    return not at_least(release, "0.8" if stage == 3 else "0.7")


def frozen_filter_release(stage: int) -> str:
    return "0.8" if stage == 3 else "0.7"


def check_release(release: str | None, stage: int) -> None:
    """What a release cannot run: ZeRO-3 arrived after 0.3.10."""
    if release == "0.3" and stage == 3:
        raise MemfitError("DeepSpeed 0.3.10 has no ZeRO stage 3 (runtime/zero/ has stage1.py and stage2.py only); "
                          "give the release the run used (ZeRO-3 arrived in a later 0.3.x, not modelled) or stage 1 or 2")


def _patch(version: str | None) -> int | None:
    """The patch number of ``version`` (``0.19.8`` -> 8); None when it names none."""
    from memfit.core.stack.lines import split_local

    if not version:
        return None
    parts = split_local(version)[0].lstrip("v").split(".")
    return int("".join(ch for ch in parts[2] if ch.isdigit()) or 0) if len(parts) > 2 else None


def _since_0_19(version: str | None, release: str, patch_min: int) -> tuple[bool, bool]:
    """``(release is 0.19.<patch_min> or later, the 0.19 patch was assumed)``: a 0.19 release that names
    no patch is taken as 0.19.8, the source read."""
    from memfit.core.stack.lines import at_least

    patch = _patch(version)
    if release == "0.19" and patch is None:
        return 8 >= patch_min, True
    return at_least(release, "0.20") or (release == "0.19" and patch >= patch_min), False


def casts_params_only(version: str | None, release: str | None) -> tuple[bool, str]:
    """Whether ``deepspeed.initialize`` under fp16/bf16 casts only the parameters, keeping fp32 buffers
    (``engine.py:_configure_distributed_model``: "Cast params only; preserve fp32 buffers ... Replaces
    blanket module.half()/bfloat16()", from 0.19.2; 0.19.1 and before call ``self.module.half()`` /
    ``self.module.bfloat16()``, which cast the floating buffers too)."""
    if release is None:
        return False, "DeepSpeed not installed"
    new, assumed = _since_0_19(version, release, 2)
    if assumed:
        return True, "DeepSpeed 0.19 (0.19.8 assumed): parameters only are cast, from 0.19.2"
    return new, (f"DeepSpeed {version or release}: " + ("parameters only are cast, fp32 buffers kept (from 0.19.2)"
                                                       if new else "module.half()/bfloat16() casts the buffers too "
                                                       "(until 0.19.1)"))


def offload_pin_memory_default(version: str | None, release: str | None) -> tuple[bool, str]:
    """``offload_param`` / ``offload_optimizer`` ``pin_memory`` when the JSON leaves it out:
    False up to 0.19.4 (``OFFLOAD_*_PIN_MEMORY_DEFAULT = False`` in 0.5.10/0.6.0;
    ``offload_config.py: pin_memory: bool = False`` in 0.7.7-0.19.4), True from 0.19.5."""
    if release is None:
        return True, "DeepSpeed not installed"
    new, assumed = _since_0_19(version, release, 5)
    if assumed:
        return True, "DeepSpeed 0.19 (0.19.8 assumed): pin_memory defaults to true from 0.19.5"
    return new, (f"DeepSpeed {version or release}: offload pin_memory defaults to "
                 f"{'true (from 0.19.5)' if new else 'false (until 0.19.4)'}")


def apply_release_defaults(ds, raw: dict, stack):  # (DeepSpeedSettings, dict, Stack) -> (DeepSpeedSettings, notes)
    """The DeepSpeed settings memfit parsed with 0.19.8's defaults, with the defaults of the stack's
    release where they differ: offload ``pin_memory`` (``offload_pin_memory_default``). Each change
    is said in a note."""
    from dataclasses import replace

    release = stack.deepspeed
    check_release(release, ds.zero.stage)
    zero_raw = raw.get("zero_optimization") if isinstance(raw.get("zero_optimization"), dict) else {}
    pin, why = offload_pin_memory_default(stack.entry("deepspeed").version, release)
    notes: list[str] = []
    z = ds.zero
    changes = {}
    for name in ("offload_param", "offload_optimizer"):
        section = zero_raw.get(name) if isinstance(zero_raw.get(name), dict) else None
        off = getattr(z, name)
        if off.device == "none" or (section is not None and "pin_memory" in section):
            continue
        if off.pin_memory != pin:
            changes[name] = replace(off, pin_memory=pin)
            notes.append(f"{name}.pin_memory not given: {pin} ({why})")
    if not changes:
        return ds, ()
    return replace(ds, zero=replace(z, **changes)), tuple(notes)
