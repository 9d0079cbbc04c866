"""One precedence rule for every input, in one place.

A setting (a ``ScenarioInputs`` field, or a key of one of its mappings such as ``fsdp.cpu_offload``)
may be given by several inputs. The strongest wins, in this order (``LAYERS``)::

    flags > scenario YAML > TrainingArguments/SFTConfig > accelerate config > BitsAndBytesConfig
          > DeepSpeed JSON "auto" (filled from all of the above) > stack files (pip freeze,
          ``transformers env``, ``accelerate env``, ``ds_report``: the library versions) > defaults

- A flag or the scenario overriding a file is said in a note ("--micro-batch 1 overrides
  ta.json: per_device_train_batch_size = 4").
- Two files that disagree are one error line naming both files and both values, unless the
  libraries themselves settle it (``LIBRARY_RULES``: e.g. transformers lets TrainingArguments'
  ``bf16: true`` replace accelerate's ``mixed_precision: 'no'``), which is then said in a note.
- A file's library default (a key the file leaves out) yields to any value given elsewhere; when
  nothing else gives the setting, it is the value, and it is listed as assumed.

New inputs plug in here: a reader in ``core/inputs/<kind>.py`` returns a ``Sourced`` with its layer
(a new name in ``LAYERS`` at its place in the order), ``merge.py`` turns it into ``Given`` values, and
``choose`` decides every setting the same way. A library precedence rule is one entry in
``LIBRARY_RULES`` with the source it follows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from memfit.core.lean_dataclass import dataclass
from memfit.errors import MemfitError

LAYERS = ("flag", "scenario", "training_args", "accelerate_config", "bnb_config", "deepspeed", "stack",
          "default")
"""Where a setting can come from, strongest first."""

_RANK = {name: i for i, name in enumerate(LAYERS)}
_ABOVE_FILES = ("flag", "scenario")


@dataclass(frozen=True, slots=True)
class Given:
    """One input's value for one setting."""

    setting: str
    value: Any
    layer: str
    """One of ``LAYERS``."""
    origin: str
    """Where, as the user would find it: ``--micro-batch``, ``run.yaml: train.micro_batch``,
    ``ta.json: per_device_train_batch_size`` (``(TrainingArguments default)`` for a default)."""
    default: bool = False
    """The library's default for a key the file leaves out: it yields to any other value."""
    shown: str | None = None
    """The value as the file writes it (``bf16: true``), when that differs from memfit's name for it."""

    def __post_init__(self) -> None:
        if self.layer not in _RANK:
            raise ValueError(f"unknown input layer {self.layer!r}")

    def describe(self) -> str:
        return f"{self.origin} = {self.shown if self.shown is not None else repr(self.value)}"


LibraryRule = Callable[[Given, Given], "str | None"]
"""``rule(stronger, weaker)``: why the libraries let the stronger file's value win, or None when they
do not (then the two files contradict each other)."""


def _mixed_precision_rule(hi: Given, lo: Given) -> str | None:
    if hi.layer == "training_args" and lo.layer == "accelerate_config" and not hi.default:
        return ("transformers' TrainingArguments.__post_init__ sets its mixed precision from fp16/bf16 over the "
                "ACCELERATE_MIXED_PRECISION that accelerate launch sets from the config (5.24 training_args.py)")
    return None


def _framework_rule(hi: Given, lo: Given) -> str | None:
    if hi.layer == "training_args" and lo.layer == "accelerate_config" and hi.value in ("deepspeed", "fsdp", "fsdp2") \
            and lo.value in ("torch", "ddp"):
        return ("the Trainer builds its DeepSpeed/FSDP plugin from TrainingArguments and hands it to accelerate, "
                "whatever distributed_type the launch config names (transformers 5.24 "
                "Trainer.create_accelerator_and_postprocess)")
    return None


def _deepspeed_config_rule(hi: Given, lo: Given) -> str | None:
    if hi.layer == "training_args" and lo.layer == "accelerate_config":
        return ("TrainingArguments.__post_init__ builds the DeepSpeedPlugin from its own deepspeed config "
                "(hf_ds_config), not from accelerate's deepspeed_config")
    return None


def _cpu_ram_loading_rule(hi: Given, lo: Given) -> str | None:
    if hi.layer == "training_args" and lo.layer == "accelerate_config" and not hi.default:
        return ("TrainingArguments.__post_init__ (with fsdp set) writes FSDP_CPU_RAM_EFFICIENT_LOADING from its "
                "fsdp_config, default false, over what accelerate launch set from the config (transformers 4.41.0 "
                "training_args.py:1864-1872; 5.24 line 2850)")
    return None


LIBRARY_RULES: Mapping[str, LibraryRule] = {
    "mixed_precision": _mixed_precision_rule,
    "fsdp.cpu_ram_efficient_loading": _cpu_ram_loading_rule,
    "framework": _framework_rule,
    "deepspeed_config": _deepspeed_config_rule,
}


@dataclass(frozen=True, slots=True)
class Chosen:
    """The value a setting takes, and the other values it won over."""

    given: Given
    overridden: tuple[Given, ...] = ()

    @property
    def value(self) -> Any:
        return self.given.value


def choose(givens: Iterable[Given], *, rules: Mapping[str, LibraryRule] = LIBRARY_RULES,
           notes: list[str] | None = None, hint: str = "") -> Chosen | None:
    """The value of one setting from every input that gives it (see the module docstring); None when
    none does. Overrides and library-settled disagreements are appended to ``notes``; two files that
    disagree raise ``MemfitError`` naming both (``hint``: what to do, appended)."""
    ranked = sorted(givens, key=lambda g: (g.default, _RANK[g.layer]))
    if not ranked:
        return None
    win = ranked[0]
    lost = []
    for other in ranked[1:]:
        if other.value == win.value:
            continue
        if other.default:  # a library's default yields to any value given
            continue
        lost.append(other)
        if win.layer in _ABOVE_FILES:
            if notes is not None:
                notes.append(f"{win.describe()} overrides {other.describe()}")
            continue
        rule = rules.get(win.setting)
        why = rule(win, other) if rule else None
        if why is None:
            raise MemfitError(f"{win.describe()} contradicts {other.describe()}" + (f"; {hint}" if hint else ""))
        if notes is not None:
            notes.append(f"{win.describe()} wins over {other.describe()}: {why}")
    return Chosen(given=win, overridden=tuple(lost))


def choose_mapping(givens: Iterable[Given], *, notes: list[str] | None = None) -> tuple[dict[str, Any], dict[str, Given]]:
    """A mapping setting (``fsdp``, ``ddp``, ``quantization``, ``optim_args``) decided key by key:
    each ``Given``'s setting is ``<mapping>.<key>``. Returns the merged mapping and each key's winner."""
    by_key: dict[str, list[Given]] = {}
    for g in givens:
        by_key.setdefault(g.setting.split(".", 1)[1], []).append(g)
    merged: dict[str, Any] = {}
    winners: dict[str, Given] = {}
    for key, gs in by_key.items():
        chosen = choose(gs, notes=notes)
        if chosen is not None:
            merged[key] = chosen.value
            winners[key] = chosen.given
    return merged, winners


def layer_of_origin(origin: str) -> str:
    """``flag`` for an origin that names a command-line flag, else ``scenario``."""
    return "flag" if origin.startswith("--") else "scenario"
