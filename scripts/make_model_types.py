"""Regenerate src/memfit/core/families/transformers_types.py from the installed transformers.

Under memfit's default release (``TRANSFORMERS_VERSION``) it rewrites ``DEFAULT_RELEASE_MODEL_TYPES``;
under a later one its ``ADDED_IN`` entry (the types that release's ``CONFIG_MAPPING`` has beyond the
default's; a type it dropped is an error, which the per-release lists cannot say). Run it with each
interpreter: ``python scripts/make_model_types.py`` (5.24.0), ``/tmp/v525/bin/python
scripts/make_model_types.py`` (5.25.0).
"""

from __future__ import annotations

import importlib.util
import textwrap
from pathlib import Path

import transformers

OUT = Path(__file__).resolve().parents[1] / "src" / "memfit" / "core" / "families" / "transformers_types.py"
START = "TRANSFORMERS_VERSION = "
END = '"""Types ``CONFIG_MAPPING`` gained'


def _set(names, indent: str) -> str:
    body = ", ".join(repr(k) for k in sorted(names))
    return textwrap.fill(body, width=100, initial_indent=indent, subsequent_indent=indent, break_on_hyphens=False)


def main() -> None:
    text = OUT.read_text()
    head, _, rest = text.partition(START)
    region, _, tail = rest.partition(END)
    spec = importlib.util.spec_from_file_location("_types", OUT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    default_version = module.TRANSFORMERS_VERSION
    default = set(module.DEFAULT_RELEASE_MODEL_TYPES)
    added = {v: set(t) for v, t in module.ADDED_IN.items()}
    installed = set(transformers.CONFIG_MAPPING.keys())
    if transformers.__version__ == default_version:
        default = installed
    else:
        dropped = default - installed
        if dropped:
            raise SystemExit(f"transformers {transformers.__version__} dropped {sorted(dropped)}: the lists cannot say so")
        added[transformers.__version__] = installed - default
    entries = "".join(f'    "{v}": frozenset({{\n{_set(t, " " * 8)},\n    }}),\n'
                      for v, t in sorted(added.items(), key=lambda kv: tuple(int(x) for x in kv[0].split(".")[:3])))
    OUT.write_text(
        f'{head}{START}"{default_version}"\n\n# fmt: off\n'
        f"DEFAULT_RELEASE_MODEL_TYPES: frozenset[str] = frozenset({{\n{_set(default, '    ')},\n}})\n# fmt: on\n\n"
        f"# fmt: off\nADDED_IN: dict[str, frozenset[str]] = {{\n{entries}}}\n# fmt: on\n{END}{tail}"
    )


if __name__ == "__main__":
    main()
