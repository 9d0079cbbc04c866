"""``transformers env`` and ``accelerate env`` output: the versions they print.

Both print ``- key: value`` lines (transformers ``commands/env.py`` (4.x) / ``cli/system.py`` (5.x)
``format_dict``; accelerate ``commands/env.py:env_command``). Read here:

- transformers: ``- `transformers` version: 4.15.0``; ``- PyTorch version (GPU?): 1.10.1+cu113 (True)``
  (``(accelerator?)`` in 5.x; the ``+cuXYZ`` local version gives CUDA); ``- Accelerate version: 0.27.2``
  and ``- DeepSpeed version: 0.13.1`` (newer releases; ``not installed`` is read as absent);
- accelerate: ``- `Accelerate` version: 0.27.2``; ``- PyTorch version (GPU?): 2.2.0+cu121 (True)``
  (``- PyTorch version: ...`` in 1.x).

Everything else they print (platform, Python, the GPU type, the default accelerate config) is not
a library version and is not read.
"""

from __future__ import annotations

import re

from memfit.core.inputs.stack_reading import StackReading, clean_lines

_ITEM = re.compile(r"^\s*-\s+(.+?):\s*(.*)$")
_TORCH = re.compile(r"^PyTorch version(?: \((?:GPU\?|accelerator\?)\))?$")
_FIRST = re.compile(r"^(\S+)")

TRANSFORMERS_MARK = "- `transformers` version:"
ACCELERATE_MARK = "- `Accelerate` version:"


def read_env_report(path: str, text: str) -> StackReading:
    lines = clean_lines(text)
    kind = "transformers env" if any(ln.strip().startswith(TRANSFORMERS_MARK) for ln in lines) else "accelerate env"
    out = StackReading(path=path, kind=kind)
    for i, ln in enumerate(lines, 1):
        m = _ITEM.match(ln)
        if m is None:
            continue
        key, value = m.group(1).strip(), m.group(2).strip()
        first = _FIRST.match(value)
        if first is None:
            continue
        version = first.group(1)
        if version.lower() in ("not", "n/a", "na"):  # "not installed"
            continue
        if key == "`transformers` version":
            out.put("transformers", version, i)
        elif key == "`Accelerate` version" or key == "Accelerate version":
            out.put("accelerate", version, i)
        elif key == "DeepSpeed version":
            out.put("deepspeed", version, i)
        elif _TORCH.match(key):
            out.put("torch", version, i)
            if "+" in version:
                from memfit.core.stack.releases import cuda_from_local, split_local

                cuda = cuda_from_local(split_local(version)[1])
                if cuda:
                    out.put("cuda", cuda, i)
    return out
