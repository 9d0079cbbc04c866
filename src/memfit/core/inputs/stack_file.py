"""A file that states the stack, read by what it is: ``ds_report`` output, ``transformers env`` or
``accelerate env`` output, or a ``pip freeze`` / requirements file (``--stack FILE``, the scenario's
``stack.files``). Read through ``memfit.core.reading`` (a regular file of at most 4 MiB, UTF-8);
nothing in it is executed. A file that is none of these, or that names none of the stack's
libraries, is one error line. ``stack_sourced`` gives its versions to the precedence layer
(``precedence.LAYERS``' ``stack``, just above the defaults: a flag, the scenario or another file
overrides it; two stack files that disagree are one line naming both)."""

from __future__ import annotations

from memfit.core.inputs.common import Sourced
from memfit.core.inputs.stack_reading import KIND_NAMES, StackReading, clean_lines, read_from
from memfit.errors import MemfitError

KINDS = "pip freeze / requirements file, `transformers env` or `accelerate env` output, or `ds_report` output"


def read_stack_file(path: str) -> StackReading:
    from memfit.core.inputs.ds_report import MARK, read_ds_report
    from memfit.core.inputs.env_report import ACCELERATE_MARK, TRANSFORMERS_MARK, read_env_report
    from memfit.core.inputs.pip_freeze import read_pip_freeze
    from memfit.core.reading import read_text

    text = read_text(path, what="stack file")
    lines = [ln.strip() for ln in clean_lines(text)]
    if any(MARK in ln for ln in lines) or any(ln.startswith("deepspeed info ..") for ln in lines):
        out = read_ds_report(str(path), text)
    elif any(ln.startswith((TRANSFORMERS_MARK, ACCELERATE_MARK)) for ln in lines):
        out = read_env_report(str(path), text)
    else:
        out = read_pip_freeze(str(path), text)
    if not out.versions:
        raise MemfitError(f"{path}: no version of torch, CUDA, DeepSpeed, transformers, peft, bitsandbytes, accelerate "
                          f"or TRL in it (memfit reads a {KINDS})")
    return out


def stack_sourced(path: str) -> Sourced:
    """The file's versions as ``ScenarioInputs`` settings (``torch_version``, ``ds_version``, ...),
    each with the file, line and library it was read from, and the file's kind (``read_from``)."""
    from memfit.core.stack.releases import library
    from memfit.core.stack.resolve import FIELDS

    r = read_stack_file(path)
    out = Sourced(layer="stack", notes=list(r.notes))
    for lib, (version, where) in r.versions.items():
        out.set(FIELDS[lib], version, f"{where}: {library(lib).label} ({r.kind})")
    return out


__all__ = ["StackReading", "read_stack_file", "stack_sourced", "read_from", "KINDS", "KIND_NAMES"]
