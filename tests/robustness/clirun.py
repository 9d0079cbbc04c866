"""Run ``memfit`` in this process (fast) and check the one-line-error contract."""

from __future__ import annotations

import contextlib
import io
import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class Run:
    rc: int
    out: str
    err: str


def cli(*args: str, stdin: bytes = b"") -> Run:
    """``memfit ARGS`` through ``memfit.cli.main`` (the console script's entry point), in-process.

    Anything ``main`` lets escape other than ``SystemExit`` propagates (a traceback fails the test)."""
    from memfit import cli as memfit_cli

    out, err = io.StringIO(), io.StringIO()
    old_argv, old_stdin = sys.argv, sys.stdin
    sys.argv = ["memfit", *args]
    sys.stdin = io.TextIOWrapper(io.BytesIO(stdin))
    rc = 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                memfit_cli.main()
            except SystemExit as e:
                rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        sys.argv, sys.stdin = old_argv, old_stdin
    return Run(rc, out.getvalue(), err.getvalue())


def assert_one_line_error(r: Run, *fragments: str) -> str:
    """Exit 2, exactly one line on stderr (``memfit: error: ...``), no traceback; returns the line."""
    lines = [ln for ln in r.err.splitlines() if ln.strip() and not ln.startswith("memfit: warning:")]
    assert r.rc == 2, f"exit {r.rc}; stderr: {r.err[-500:]!r}"
    assert len(lines) == 1, f"{len(lines)} lines on stderr: {r.err[-800:]!r}"
    assert lines[0].startswith("memfit: error: "), lines[0]
    assert "Traceback" not in r.err and "Traceback" not in r.out
    for f in fragments:
        assert f in lines[0], f"{f!r} not in {lines[0]!r}"
    return lines[0]
