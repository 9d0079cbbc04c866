"""The fresh-machine guard: memfit's tests and sources read nothing outside the checkout, the Python
installation (the venv: ``sys.prefix``, its site-packages) and the temporary directories the test
session creates itself.

Two layers, because either alone misses cases:

- ``static_findings``: an absolute path written into a test or source file and handed to something
  that touches the filesystem (``Path("/tmp/ds0510")``, ``open("/data/x")``, ``os.path.exists(...)``):  # fresh-ok: examples in a docstring
  caught even when the test would have skipped on a machine without it.
- ``OpenGuard``: an audit hook (``sys.addaudithook``) installed by tests/conftest.py for the whole
  session, recording every ``open`` made by code of the checkout (the innermost caller that is not
  the standard library is a file of the checkout) of a path outside those roots. Temporary
  directories count only when this session created them (the ``tempfile.mkdtemp`` /
  ``tempfile.mkstemp`` audit events, and pytest's own base temporary directory): a test reading
  another run's leftovers in /tmp (how ``/tmp/ds0510`` hid) is caught. Libraries reading their own
  files (torch, transformers, the Hugging Face cache when a test points it there) are not ours.

/proc, /sys and /dev are the running kernel's interfaces, present on every Linux machine, and
allowed. A literal a test uses only as text (a path inside a pasted log) is not a read.
"""

from __future__ import annotations

import ast
import os
import tempfile
import site
import sys
import sysconfig
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SYSTEM = ("/proc/", "/sys/", "/dev/")
_FS_CALLS = {"Path", "PurePath", "PosixPath", "open", "exists", "is_file", "is_dir", "isfile", "isdir", "listdir",
             "scandir", "stat", "lstat", "read_text", "read_bytes", "glob", "iglob", "walk", "copy", "copyfile",
             "copytree", "rmtree", "load", "expanduser", "chdir", "access", "realpath"}


def _absolute(value: object) -> str | None:
    if isinstance(value, str) and (value.startswith("/") or value.startswith("~")) and len(value) > 1 \
            and not (value + "/").startswith(SYSTEM):
        return value
    return None


def _first_literal(node: ast.AST) -> str | None:
    if isinstance(node, ast.Constant):
        return _absolute(node.value)
    if isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
        return _absolute(node.values[0].value)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):  # Path("/x") / "y"
        return _first_literal(node.left)
    return None


def _func_name(func: ast.AST) -> str:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return ""


def static_findings(files: list[Path]) -> list[str]:
    """``file:line: literal`` for every absolute path literal handed to a filesystem call."""
    out = []
    for f in files:
        try:
            tree = ast.parse(f.read_text(encoding="utf-8"))
        except SyntaxError as e:  # pragma: no cover - the suite would fail anyway
            out.append(f"{f}: cannot parse ({e})")
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and _func_name(node.func) in _FS_CALLS:
                for arg in [*node.args, *(k.value for k in node.keywords)]:
                    lit = _first_literal(arg)
                    if lit:
                        out.append(f"{f.relative_to(ROOT) if f.is_relative_to(ROOT) else f}:{node.lineno}: {lit!r}")
            elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
                lit = _first_literal(node.left)
                if lit:
                    out.append(f"{f.relative_to(ROOT) if f.is_relative_to(ROOT) else f}:{node.lineno}: {lit!r}")
    return sorted(set(out), key=lambda s: (s.split(":")[0], int(s.split(":")[1])))


def source_files() -> list[Path]:
    return sorted(p for base in ("src", "tests", "scripts", "benchmarks") for p in (ROOT / base).rglob("*.py")
                  if "fixtures" not in p.parts)


class OpenGuard:
    """The audit hook (see the module docstring). ``violations`` holds ``(path, caller)`` pairs."""

    def __init__(self) -> None:
        paths = sysconfig.get_paths()
        self.stdlib = tuple({os.path.realpath(paths["stdlib"]), os.path.realpath(paths["platstdlib"])})
        self.allowed = [str(ROOT), *{os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)},
                        *(os.path.realpath(p) for p in site.getsitepackages() + [site.getusersitepackages()])]
        self.session_temp: list[str] = []
        self.violations: list[tuple[str, str]] = []
        self.tempdir = tempfile.gettempdir().rstrip("/")  # here, never inside the hook (it opens files)
        self._busy = threading.local()

    def allow_temp(self, path: str | os.PathLike) -> None:
        self.session_temp.append(os.path.realpath(os.fspath(path)))

    def _inside(self, path: str) -> bool:
        return any(path == r or path.startswith(r.rstrip("/") + "/") for r in (*self.allowed, *self.session_temp))

    def hook(self, event: str, args: tuple) -> None:
        if event in ("tempfile.mkdtemp", "tempfile.mkstemp"):
            self.allow_temp(args[0])
            return
        if event != "open" or getattr(self._busy, "on", False):
            return
        path = args[0]
        if isinstance(path, bytes):
            path = os.fsdecode(path)
        if not isinstance(path, str) or not path.startswith("/") or path.startswith(SYSTEM):
            return
        if path.rstrip("/") == self.tempdir:
            return  # tempfile.TemporaryFile opens the temp directory itself (O_TMPFILE: an unnamed file)
        self._busy.on = True
        try:
            real = os.path.realpath(path)
            if self._inside(path) or self._inside(real):
                return
            caller = self._our_caller()
            if caller:
                self.violations.append((path, caller))
        finally:
            self._busy.on = False

    def _our_caller(self) -> str | None:
        """``file:line`` of the innermost caller outside the standard library, if it is in the checkout."""
        frame = sys._getframe(2)
        here = os.path.realpath(__file__)
        while frame is not None:
            name = os.path.realpath(frame.f_code.co_filename)
            if name == here or name.startswith(self.stdlib) and "site-packages" not in name or name.startswith("<"):
                frame = frame.f_back
                continue
            return f"{name}:{frame.f_lineno}" if name.startswith(str(ROOT) + "/") else None
        return None
