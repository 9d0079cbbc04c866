"""No test asserts on wall time (issue 24 item 10: a loaded machine stretches wall time  # time-ok
tenfold, and a suite that passes only on an idle one fails in CI). Speed targets are printed by the
scripts in benchmarks/.

What counts, found in the syntax tree of every file under tests/:

- a wall clock: a call of ``time.perf_counter``, ``time.monotonic``, ``time.time`` (or their ``_ns``
  forms); a name assigned from an expression that holds one, or holds such a name (``took = now() -
  start``), or a list such a value is appended to;
- an ``assert`` that orders one of those (``<``, ``<=``, ``>``, ``>=``: a time, or a rate made of one)
  unless a comment on its line or the line above says it is a ``lower bound`` on time (``gone >=
  grace`` cannot fail because a machine is slow); a hang guard that gives up (``wait_until(...,
  timeout)`` returning None) is no comparison;
- a child process that prints its own ``perf_counter`` figure, read back with ``float(...)`` in an
  assert's comparison.

CPU time (``time.process_time``, ``ru_utime``) is allowed as a complexity guard with a wide margin: it
is the work, which other processes on the machine do not add to.
"""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
CLOCKS = {"perf_counter", "monotonic", "time", "perf_counter_ns", "monotonic_ns", "time_ns"}
ORDER = (ast.Lt, ast.LtE, ast.Gt, ast.GtE)


def _own(scope: ast.AST):
    """The nodes of a module or function, not those of the functions defined in it (each its own scope)."""
    stack = list(ast.iter_child_nodes(scope))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            stack.extend(ast.iter_child_nodes(node))


def _is_clock(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call):
        return False
    f = node.func
    if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "time":
        return f.attr in CLOCKS
    return isinstance(f, ast.Name) and f.id in {"perf_counter", "monotonic"}


def _timed(node: ast.AST, names: set[str]) -> bool:
    return any(_is_clock(n) or (isinstance(n, ast.Name) and n.id in names) for n in ast.walk(node))


def _targets(node: ast.AST) -> list[str]:
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    return [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]


def _timed_names(func: ast.AST) -> set[str]:
    names: set[str] = set()
    assigns = [n for n in _own(func) if isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and n.value is not None]
    grows = [n for n in _own(func) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
             and n.func.attr in ("append", "extend", "add") and isinstance(n.func.value, ast.Name)]
    while True:
        new = ({t for a in assigns if _timed(a.value, names) for t in _targets(a)}
               | {g.func.value.id for g in grows if any(_timed(arg, names) for arg in g.args)}) - names
        if not new:
            return names
        names |= new


def _orders_time(test: ast.AST, timed) -> bool:
    for cmp in (n for n in ast.walk(test) if isinstance(n, ast.Compare)):
        operands = [cmp.left, *cmp.comparators]
        if any(isinstance(op, ORDER) and (timed(operands[i]) or timed(operands[i + 1])) for i, op in enumerate(cmp.ops)):
            return True
    return False


def _lower_bound_comments(source: str) -> set[int]:
    return {tok.start[0] for tok in tokenize.generate_tokens(io.StringIO(source).readline)
            if tok.type == tokenize.COMMENT and "lower bound" in tok.string.lower()}


def problems_in(path: Path) -> list[str]:
    source = path.read_text(encoding="utf-8")
    tree = ast.parse(source)
    allowed = _lower_bound_comments(source)
    out = []
    for func in [tree, *(n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))]:
        names = _timed_names(func)
        child_clock = any(isinstance(n, ast.Constant) and isinstance(n.value, str) and "perf_counter" in n.value
                          for n in _own(func))

        def timed(node: ast.AST) -> bool:
            return _timed(node, names) or (child_clock and any(
                isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "float" for n in ast.walk(node)))

        for a in (n for n in _own(func) if isinstance(n, ast.Assert)):
            if _orders_time(a.test, timed) and not allowed & {a.lineno - 1, a.lineno}:
                out.append(f"{path.relative_to(TESTS.parent)}:{a.lineno}: an assertion on wall time")  # time-ok
    return sorted(set(out))


def test_no_test_asserts_on_wall_time():  # time-ok: the scan itself, it times nothing
    problems = [p for f in sorted(TESTS.rglob("*.py")) for p in problems_in(f)]
    assert not problems, "\n".join(problems)


def test_the_scan_finds_what_it_looks_for(tmp_path):
    """The scan's own check: each pattern it exists for is found, and what is allowed is not."""
    bad = tmp_path / "test_bad.py"
    bad.write_text(
        "import time, subprocess, sys\n"
        "def test_a():\n    start = time.perf_counter()\n    f()\n    took = time.perf_counter() - start\n    assert took < 1.0\n"
        "def test_b():\n    t0 = time.monotonic()\n    assert 5 > time.monotonic() - t0\n"
        "def test_c():\n    best = 0\n    n, start = 3, time.perf_counter()\n    best = max(best, n / (time.perf_counter() - start))\n"
        "    assert best > 10 and 0.5 >= best\n"
        "def test_d():\n    r = subprocess.run([sys.executable, '-c', 't = time.perf_counter(); print(time.perf_counter() - t)'])\n"
        "    assert float(r.stdout) < 0.25\n"
        "def test_e():\n    runs = []\n    start = time.perf_counter()\n    runs.append(time.perf_counter() - start)\n"
        "    assert min(runs) < 0.05\n")
    ok = tmp_path / "test_ok.py"
    ok.write_text(
        "import time\n"
        "def test_lower_bound():\n    t0 = time.monotonic()\n    gone = time.monotonic() - t0\n    assert gone >= 3  # a lower bound\n"
        "def test_cpu():\n    start = time.process_time()\n    assert time.process_time() - start < 0.5\n"
        "def test_other():\n    x = len('abc')\n    assert x < 4\n")
    global TESTS
    saved, TESTS = TESTS, tmp_path.parent
    try:
        found = problems_in(bad)
        assert sorted(int(p.split(":")[1]) for p in found) == [6, 9, 14, 17, 22], found
        assert problems_in(ok) == []
    finally:
        TESTS = saved
