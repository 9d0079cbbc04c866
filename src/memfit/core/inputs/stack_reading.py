"""What a stack file says: library versions with the file and line each came from.

Shared by the readers of ``pip freeze`` / requirements files (``pip_freeze``), ``transformers env``
and ``accelerate env`` output (``env_report``) and ``ds_report`` output (``ds_report``);
``stack_file.read_stack_file`` tells them apart.
"""

from __future__ import annotations

import re
from dataclasses import field

from memfit.core.lean_dataclass import dataclass
from memfit.errors import MemfitError

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
"""Terminal colour codes (``ds_report`` prints ``[OKAY]`` in green): removed before reading."""


def clean_lines(text: str) -> list[str]:
    """The text's lines without colour codes, carriage returns or trailing blanks."""
    return [ANSI.sub("", ln).replace("\r", "").rstrip() for ln in text.split("\n")]


@dataclass
class StackReading:
    """Versions read from one file: library -> (version as printed, where)."""

    path: str
    kind: str
    """``pip freeze``, ``requirements``, ``transformers env``, ``accelerate env`` or ``ds_report``."""
    versions: dict[str, tuple[str, str]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def put(self, library: str, version: str, line_no: int) -> None:
        """Record ``library``'s version printed on ``line_no`` (1-based); two different versions
        of one library in one file is an error naming both lines."""
        where = f"{self.path}:{line_no}"
        old = self.versions.get(library)
        if old is not None and old[0] != version:
            raise MemfitError(f"{where}: {library} {version} contradicts {library} {old[0]} at {old[1]} in the same "
                              f"{self.kind} output")
        if old is None:
            self.versions[library] = (version, where)


KIND_NAMES = ("pip freeze", "requirements", "transformers env", "accelerate env", "ds_report")
"""``StackReading.kind``: what a stack file is."""


def read_from(origin: str) -> str | None:
    """``'pip freeze f.txt:3'`` for the origin of a version read from a stack file
    (``'f.txt:3: DeepSpeed (pip freeze)'``); None for any other origin (a flag, the scenario)."""
    for kind in KIND_NAMES:
        if origin.endswith(f" ({kind})"):
            return f"{kind} {origin[:-len(kind) - 3].rsplit(': ', 1)[0]}"
    return None
