"""The README's examples of the four users' own inputs run as written (issue 23, "Done when"): every
``memfit`` line of the "Your files in, your files out" block (plan, recommend --out, diagnose),
``\\`` continuations joined, from the checkout's root, exit status 0 (a plan that does not fit is still
exit 0). ``fixes/`` is made a temporary folder; nothing else is changed. (The other README input
examples: tests/cli/test_readme_examples.py.)"""

from __future__ import annotations

import os
import re
import shlex

import pytest
from conftest import ROOT
from robustness.clirun import cli

SECTIONS = ("### Your files in, your files out",)


def commands(section: str) -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    body = text[text.index(section):]
    block = re.search(r"```bash\n(.*?)```", body, re.DOTALL).group(1)
    joined = re.sub(r"\\\n\s*", " ", block)
    return [re.sub(r"\s+#.*$", "", ln).strip() for ln in joined.splitlines() if ln.startswith("memfit ")]


CASES = [(s, c) for s in SECTIONS for c in commands(s)]


def test_the_blocks_are_found():
    assert len(commands(SECTIONS[0])) >= 6


@pytest.mark.parametrize("section, command", CASES, ids=[c[:70] for _, c in CASES])
def test_readme_example_runs(section, command, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # the README's paths are the checkout's
    args = [str(tmp_path / "fixes") if a == "fixes/" else a for a in shlex.split(command)[1:]]
    r = cli(*args)
    assert r.rc == 0, f"{command}: {r.err[-800:]}"
    assert r.out.strip()
    if args[0] == "recommend" and "--out" in args:
        assert any((tmp_path / "fixes").rglob("scenario.yaml"))
    assert os.getcwd() == str(ROOT)
