"""Write tests/fixtures/bnb_sources/<release>.py: the ``MatMul4Bit`` and ``MatMul8bitLt`` classes of
each bitsandbytes release tag, verbatim from ``bitsandbytes/autograd/_functions.py``.

``tests/trace/test_bnb_matmul_vs_trace.py`` reads them to check ``memfit.core.quant_kernels`` against
the source of the releases that cannot run here (no CUDA). Usage:

    git clone https://github.com/bitsandbytes-foundation/bitsandbytes /tmp/bnb
    python scripts/extract_bnb_matmul_sources.py /tmp/bnb
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

RELEASES = ("0.39.1", "0.40.0", "0.41.0", "0.42.0", "0.43.0", "0.43.1", "0.43.2", "0.43.3", "0.44.0", "0.44.1",
            "0.45.0", "0.45.5", "0.46.0", "0.47.0", "0.48.0", "0.49.0", "0.50.0", "0.50.1")
OUT = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "bnb_sources"


def classes(source: str, names: tuple[str, ...]) -> str:
    lines = source.splitlines()
    tree = ast.parse(source)
    parts = []
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name in names:
            parts.append("\n".join(lines[node.lineno - 1:node.end_lineno]))
    return "\n\n\n".join(parts) + "\n"


def main(repo: str) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for tag in RELEASES:
        src = subprocess.run(["git", "-C", repo, "show", f"{tag}:bitsandbytes/autograd/_functions.py"], check=True,
                             capture_output=True, text=True).stdout
        text = classes(src, ("MatMul8bitLt", "MatMul4Bit"))
        header = f"# bitsandbytes {tag}: bitsandbytes/autograd/_functions.py, classes MatMul8bitLt and MatMul4Bit (verbatim)\n"
        (OUT / f"{tag}.py.txt").write_text(header + text)
        print(tag, len(text))


if __name__ == "__main__":
    main(sys.argv[1])
