"""Every tolerance in tests/ is written next to its reason (issue 13: "grep finds no tolerance in
tests/ without a comment naming its reason").

A tolerance is an assignment to a name matching ``TOL*``, ``*TOLERANCE*`` or ``*SLACK*`` (upper
case: the suite's constants; lower case too when the value holds a number other than 0, 1 or 2); a
``pytest.approx`` given ``abs=``/``rel=`` as a literal; or an ``abs(...) < number`` bound. The reason
of an assignment is a trailing ``#`` comment on its line(s) or a docstring (a string statement) right
after it; of the other two, a comment on its line or the line above. A constant's reason must also
name what was observed (``observed``, ``seen``, ``measured``, ``worst``: the suite's rule is at most
2x the worst value observed); 0 needs none.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
NAME = re.compile(r"(?:^|_)(TOL|TOLERANCE|SLACK)(?:_|$)", re.IGNORECASE)
OBSERVED = re.compile(r"observ|seen|measur|worst", re.IGNORECASE)


def _comment_lines(source: str) -> set[int]:
    lines = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            lines.add(tok.start[0])
    return lines


def _has_number(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Constant) and isinstance(n.value, (int, float)) and not isinstance(n.value, bool)
               and n.value not in (0, 1, 2) for n in ast.walk(node))


def _docstring_after(body: list[ast.stmt], i: int) -> str | None:
    nxt = body[i + 1] if i + 1 < len(body) else None
    if isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str):
        return nxt.value.value
    return None


def _comments_of(source_lines: list[str], comments: set[int], first: int, last: int) -> str:
    text = []
    for line in range(first, last + 1):
        if line in comments:
            text.append(source_lines[line - 1].split("#", 1)[1])
    return " ".join(text)


def _shown(path: Path) -> str:
    return str(path.relative_to(TESTS.parent)) if path.is_relative_to(TESTS.parent) else path.name


def problems_in(path: Path) -> list[str]:
    source = path.read_text(encoding="utf-8")
    tree = ast.parse(source)
    comments = _comment_lines(source)
    lines = source.splitlines()
    out = []
    for node in ast.walk(tree):
        for field in ("body", "orelse", "finalbody"):
            body = getattr(node, field, None)
            if not isinstance(body, list):
                continue
            for i, stmt in enumerate(body):
                if isinstance(stmt, ast.Assign):
                    targets, value = stmt.targets, stmt.value
                elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
                    targets, value = [stmt.target], stmt.value
                else:
                    continue
                names = [t.id for t in targets if isinstance(t, ast.Name) and NAME.search(t.id)]
                if not names:
                    continue
                constant = names[0].isupper()
                if not constant and not _has_number(value):
                    continue  # a lower-case sum of named constants: their reasons are theirs
                reason = (_docstring_after(body, i) or "") + _comments_of(lines, comments, stmt.lineno, stmt.end_lineno)
                where = f"{_shown(path)}:{stmt.lineno} {names[0]}"
                if not reason.strip():
                    out.append(f"{where}: no comment or docstring naming its reason")
                elif constant and _has_number(value) and not OBSERVED.search(reason):
                    out.append(f"{where}: its reason names no observed value")
    for node in ast.walk(tree):
        what = None
        if isinstance(node, ast.Call) and ast.unparse(node.func) in ("pytest.approx", "approx"):
            if any(k.arg in ("abs", "rel") and _has_number(k.value) for k in node.keywords):
                what = "pytest.approx"
        elif isinstance(node, ast.Compare) and any(isinstance(o, (ast.Lt, ast.LtE)) for o in node.ops):
            sides = [node.left, *node.comparators]
            bounded = [x for x in sides if any(isinstance(n, ast.Call) and ast.unparse(n.func) == "abs" for n in ast.walk(x))]
            if bounded and any(_has_number(x) for x in sides if x not in bounded):
                what = "abs(...) bound"
        if what and not ({node.lineno, node.lineno - 1} & comments):
            out.append(f"{_shown(path)}:{node.lineno} {what}: no comment naming its reason on its line or the line above")
    return sorted(out, key=lambda p: int(p.split(":")[1].split(" ")[0]))


def test_every_tolerance_in_the_tests_has_its_reason_next_to_it():
    found = [p for f in sorted(TESTS.rglob("*.py")) if "fixtures" not in f.parts for p in problems_in(f)]
    assert not found, "\n".join(found)


def test_the_scan_finds_a_tolerance_without_a_reason(tmp_path):
    f = tmp_path / "test_x.py"
    f.write_text("TOL_A = 0.05\nTOL_B = 0.05  # the scalars: observed 0.02\nTOL_C = 3\n\"\"\"why, but no value\"\"\"\n"
                 "LOSS_TOLERANCE = 1e-3\n\"\"\"worst observed 4e-4; 2x that\"\"\"\n"
                 "def test():\n    tol = 0.002 * 5\n    assert 1 == pytest.approx(1, abs=0.5)\n"
                 "    slack = TOL_A + TOL_B\n    assert abs(3 - 2.9) < 0.2\n    assert abs(3 - 2.9) < TOL_B\n", encoding="utf-8")
    got = problems_in(f)
    assert [g.split(" ", 2)[1] for g in got] == ["TOL_A:", "TOL_C:", "tol:", "pytest.approx:", "abs(...)"], got
