"""``ds_report`` output (DeepSpeed ``env_report.py``): the versions of its general environment info.

``debug_report`` prints ``name ..... value`` lines (0.5.8 and 0.19.8 alike): ``torch version ....
1.10.1+cu113``, ``torch cuda version .... 11.3``, ``deepspeed info .... 0.5.8, unknown, unknown``
(version, git hash, branch). Read: torch, CUDA (``torch cuda version``: the CUDA torch was built
with, what its kernels and context use) and DeepSpeed. The op table above it (``[OKAY]``/``[NO]``
in colour codes) and ``nvcc version`` (the compiler on the machine, for JIT ops only) are not
library versions of the run.
"""

from __future__ import annotations

import re

from memfit.core.inputs.stack_reading import StackReading, clean_lines

_ROW = re.compile(r"^(torch version|torch cuda version|deepspeed info)\s*\.{2,}\s*(\S+)")
MARK = "DeepSpeed general environment info"


def read_ds_report(path: str, text: str) -> StackReading:
    out = StackReading(path=path, kind="ds_report")
    for i, ln in enumerate(clean_lines(text), 1):
        m = _ROW.match(ln.strip())
        if m is None:
            continue
        key, value = m.group(1), m.group(2).rstrip(",")
        if value in ("None", "unknown"):
            continue
        if key == "torch version":
            out.put("torch", value, i)
        elif key == "torch cuda version":
            out.put("cuda", value, i)
        else:
            out.put("deepspeed", value, i)
    return out
