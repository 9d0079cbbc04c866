"""The libraries of a training stack, the release lines memfit knows for each, and their defaults.

A *release line* is ``major.minor`` (``1.10`` stands for 1.10.0, 1.10.1, ...): the allocation rules
and defaults memfit models change between lines, never inside one, as far as the sources read say
(each behaviour's own module cites what was read: ``stack/transformers.py``, ``stack/deepspeed.py``,
``core/alloc/versions.py`` for torch). A version given in any form a user pastes (``1.10.1+cu113``,
``0.5.8``, ``4.15.0.dev0``, ``v0.21.2``, ``0.1.0.dev0``) reads as its line; a line memfit does not
know is a one-line ``MemfitError`` naming the lines it knows.

The default of each library (when the stack does not say) is the release whose source was read for
the current models: what this project's environment has installed (torch 2.13.0, DeepSpeed 0.19.8,
transformers 5.24.0, peft 0.21.2, bitsandbytes 0.50.2, accelerate 1.15.0) and, for TRL (not
installed here), the release the TrainingArguments/SFTConfig reader's defaults follow. A default is
always said as an assumption (``Stack.notes``).
"""

from __future__ import annotations

import re

from memfit.core.lean_dataclass import dataclass
from memfit.core.stack.lines import at_least, line_key, split_local
from memfit.errors import MemfitError

__all__ = ["LIBRARIES", "ORDER", "Library", "at_least", "cuda_from_local", "library", "line_key", "release_line",
           "split_local"]


def _lines(major: int, lo: int, hi: int) -> tuple[str, ...]:
    return tuple(f"{major}.{m}" for m in range(lo, hi + 1))


@dataclass(frozen=True, slots=True)
class Library:
    """One library of the stack."""

    name: str
    """The key in a scenario's ``stack:`` section and in ``Stack``."""
    label: str
    """How messages name it."""
    pip_names: tuple[str, ...]
    """Its distribution names in ``pip freeze`` (normalized: lowercase, ``-`` for ``_``/``.``)."""
    lines: tuple[str, ...]
    """Release lines memfit knows, oldest first."""
    default: str
    """The line assumed when the stack does not name one."""
    default_release: str
    """The release whose source was read for that line (said in the assumption)."""
    optional: bool = True
    """May be absent from a run (``none``): every library but torch and CUDA."""

    def knows(self, line: str) -> bool:
        return line in self.lines

    def known_text(self) -> str:
        """The known lines as ranges: ``0.3-0.19`` or ``4.0-4.57, 5.0-5.24``."""
        runs: list[list[str]] = []
        for ln in self.lines:
            major, minor = ln.split(".")
            if runs and runs[-1][-1].split(".")[0] == major and int(runs[-1][-1].split(".")[1]) + 1 == int(minor):
                runs[-1].append(ln)
            else:
                runs.append([ln])
        return ", ".join(r[0] if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


def _torch_lines() -> tuple[str, ...]:
    from memfit.core.alloc.versions import TORCH_VERSIONS, version_key

    return tuple(sorted(TORCH_VERSIONS, key=version_key))


LIBRARIES: dict[str, Library] = {lib.name: lib for lib in (
    Library(name="torch", label="torch", pip_names=("torch",), lines=(), default="2.13",
            default_release="2.13.0", optional=False),
    Library(name="cuda", label="CUDA", pip_names=(), lines=("10.2",) + _lines(11, 0, 8) + _lines(12, 0, 9) + ("13.0",),
            default="", default_release="", optional=False),
    Library(name="deepspeed", label="DeepSpeed", pip_names=("deepspeed",), lines=(), default="0.19",
            default_release="0.19.8"),
    Library(name="transformers", label="transformers", pip_names=("transformers",),
            lines=_lines(4, 0, 57) + _lines(5, 0, 25), default="5.24", default_release="5.24.0"),
    Library(name="peft", label="peft", pip_names=("peft",), lines=_lines(0, 1, 21), default="0.21",
            default_release="0.21.2"),
    Library(name="bitsandbytes", label="bitsandbytes", pip_names=("bitsandbytes",), lines=_lines(0, 35, 50),
            default="0.50", default_release="0.50.2"),
    Library(name="accelerate", label="accelerate", pip_names=("accelerate",), lines=_lines(0, 1, 34) + _lines(1, 0, 15),
            default="1.15", default_release="1.15.0"),
    Library(name="trl", label="TRL", pip_names=("trl",), lines=_lines(0, 1, 29) + _lines(1, 0, 16), default="0.24",
            default_release="0.24.0"),
)}
"""torch's lines are ``core/alloc/versions.py``'s and DeepSpeed's ``stack/deepspeed.py``'s (read from
there, so each list is one)."""

ORDER = ("torch", "cuda", "deepspeed", "transformers", "peft", "bitsandbytes", "accelerate", "trl")
NOT_INSTALLED = ("none", "not installed", "n/a", "na")


def _deepspeed_lines() -> tuple[str, ...]:
    from memfit.core.stack.deepspeed import ALLOCATION_LINES

    return tuple(sorted(ALLOCATION_LINES, key=line_key))


def library(name: str) -> Library:
    lib = LIBRARIES[name]
    if name in ("torch", "deepspeed") and not lib.lines:
        lines = _torch_lines() if name == "torch" else _deepspeed_lines()
        return Library(name=lib.name, label=lib.label, pip_names=lib.pip_names, lines=lines,
                       default=lib.default, default_release=lib.default_release, optional=lib.optional)
    return lib


_VERSION = re.compile(r"^v?(\d+)\.(\d+)(?:\.(\d+))?([.\-+_a-zA-Z0-9]*)$")


def release_line(name: str, text: str, *, where: str) -> str | None:
    """The release line of ``text`` for library ``name``: ``'0.5.8'`` -> ``'0.5'``; ``None`` for a
    library given as not installed (``none``). Anything else is one MemfitError line naming ``where``
    the version came from and the lines memfit knows."""
    lib = library(name)
    raw = str(text).strip()
    if raw.lower() in NOT_INSTALLED:
        if not lib.optional:
            raise MemfitError(f"{where}: {lib.label} cannot be absent from a GPU training stack")
        return None
    base, _ = split_local(raw)
    m = _VERSION.match(base)
    if m is None:
        raise MemfitError(f"{where}: unknown {lib.label} version {raw!r} (not a version number such as "
                          f"{lib.lines[-1]}); memfit knows {lib.label} {lib.known_text()}")
    line = f"{int(m.group(1))}.{int(m.group(2))}"
    if not lib.knows(line):
        raise MemfitError(f"{where}: unknown {lib.label} version {raw!r}; memfit knows {lib.label} {lib.known_text()}")
    return line


def cuda_from_local(local: str) -> str | None:
    """The CUDA of a torch wheel's local version: ``cu113`` -> ``11.3``, ``cu121`` -> ``12.1``
    (``cpu``/``rocm*``: None)."""
    m = re.fullmatch(r"cu(\d{2,3})", local.strip().lower())
    if not m:
        return None
    digits = m.group(1)
    return f"{digits[:-1]}.{digits[-1]}"
