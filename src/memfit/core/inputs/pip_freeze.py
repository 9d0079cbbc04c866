"""``pip freeze`` output and requirements files: the pinned versions of the stack's libraries.

``pip freeze`` prints one ``name==version`` per installed distribution (``pip/_internal/operations/
freeze.py``: ``f"{req.name}=={req.version}"``), ``name @ URL`` for direct URL installs and
``-e ...#egg=name`` for editable ones (neither has a version: said, not read). A requirements file
(PEP 508 lines, pip's ``-r``/``--index-url`` options, comments) pins a version only with ``==`` or
``===``; a range (``>=``, ``~=``, ``<``) is not a version of the run and is said as ignored. Names
compare as PEP 503 normalizes them (case, ``-``, ``_`` and ``.`` alike). torch's local version gives
its CUDA (``torch==1.10.1+cu113``), as do the ``nvidia-cuda-runtime-cu12`` wheels torch >= 2.1 pulls.
"""

from __future__ import annotations

import re

from memfit.core.inputs.stack_reading import StackReading, clean_lines

_NAME = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?\s*(.*)$")
_PIN = re.compile(r"^===?\s*([^\s;,]+)\s*(?:;.*)?$")
_CUDA_RUNTIME = re.compile(r"^nvidia-cuda-runtime-cu(\d+)$")


def normalize(name: str) -> str:
    """PEP 503: ``re.sub(r"[-_.]+", "-", name).lower()``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_pip_freeze(path: str, text: str) -> StackReading:
    from memfit.core.stack.releases import ORDER, library

    names = {normalize(p): lib for lib in ORDER for p in library(lib).pip_names}
    lines = clean_lines(text)
    kind = "pip freeze" if all("==" in ln or ln.startswith(("-e ", "#")) or " @ " in ln or not ln.strip()
                              for ln in lines) else "requirements"
    out = StackReading(path=path, kind=kind)
    for i, raw in enumerate(lines, 1):
        ln = raw.split(" #", 1)[0].strip()
        if not ln or ln.startswith("#"):
            continue
        if ln.startswith("-e ") or ln.startswith("--editable"):
            egg = re.search(r"#egg=([A-Za-z0-9._-]+)", ln)
            if egg and normalize(egg.group(1)) in names:
                out.notes.append(f"{path}:{i}: {egg.group(1)} is installed editable (no version): not read")
            continue
        if ln.startswith("-"):
            continue  # -r other.txt, --index-url ...: pip options, no versions
        m = _NAME.match(ln)
        if m is None:
            continue
        name, rest = normalize(m.group(1)), m.group(3).strip()
        cu = _CUDA_RUNTIME.match(name)
        if cu is not None:
            pin = _PIN.match(rest)
            if pin:
                major_minor = ".".join(pin.group(1).split(".")[:2])
                out.put("cuda", major_minor, i)
            continue
        if name not in names:
            continue
        lib = names[name]
        if rest.startswith("@"):
            out.notes.append(f"{path}:{i}: {m.group(1)} installed from a URL (no version): not read")
            continue
        pin = _PIN.match(rest)
        if pin is None:
            if rest:
                out.notes.append(f"{path}:{i}: {m.group(1)}{rest} is a range, not the version the run had: ignored")
            continue
        version = pin.group(1)
        out.put(lib, version, i)
        if lib == "torch" and "+" in version:
            from memfit.core.stack.releases import cuda_from_local, split_local

            cuda = cuda_from_local(split_local(version)[1])
            if cuda:
                out.put("cuda", cuda, i)
    return out
