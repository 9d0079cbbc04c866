"""Regenerate src/memfit/core/families/transformers_types.py from the installed transformers."""

from __future__ import annotations

import textwrap
from pathlib import Path

import transformers

OUT = Path(__file__).resolve().parents[1] / "src" / "memfit" / "core" / "families" / "transformers_types.py"


def main() -> None:
    text = OUT.read_text()
    head, _, _ = text.partition("TRANSFORMERS_VERSION = ")
    body = ", ".join(repr(k) for k in sorted(transformers.CONFIG_MAPPING.keys()))
    wrapped = textwrap.fill(body, width=100, initial_indent="    ", subsequent_indent="    ", break_on_hyphens=False)
    OUT.write_text(
        f'{head}TRANSFORMERS_VERSION = "{transformers.__version__}"\n\n# fmt: off\n'
        f"TRANSFORMERS_MODEL_TYPES: frozenset[str] = frozenset({{\n{wrapped},\n}})\n# fmt: on\n"
    )


if __name__ == "__main__":
    main()
