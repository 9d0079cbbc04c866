"""The README's command-line examples of memfit's inputs, run as written (those that name only shipped
files: the SCENARIO.yaml placeholders, traces, replays and reports are exercised by their own tests)."""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "robustness"))
from clirun import cli  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def _examples() -> list[list[str]]:
    text = (ROOT / "README.md").read_text()
    out = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for command in block.replace("\\\n", " ").splitlines():
            command = command.split("  #")[0].strip()
            args = shlex.split(command)
            if len(args) < 3 or args[0] != "memfit" or args[1] not in ("plan", "recommend"):
                continue
            if any(a in ("--exact", "--report", "--out") or a.endswith(("SCENARIO.yaml", ".html")) for a in args):
                continue
            out.append(args[1:])
    return out


EXAMPLES = _examples()


def test_the_readme_has_input_examples():
    assert sum("--training-args" in e for e in EXAMPLES) >= 2 and any("--accelerate-config" in e for e in EXAMPLES)
    assert any(e[0] == "recommend" and "--model" in e for e in EXAMPLES)


@pytest.mark.parametrize("args", EXAMPLES, ids=[" ".join(e)[:80] for e in EXAMPLES])
def test_a_readme_example_runs(args, monkeypatch):
    monkeypatch.chdir(ROOT)
    r = cli(*args, *(["--top", "1"] if args[0] == "recommend" else []))
    assert r.rc == 0, r.err[-600:]
    assert "Traceback" not in r.err
