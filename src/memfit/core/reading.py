"""Reading untrusted input files: bounded, typed, one ``MemfitError`` line for anything wrong.

Every file memfit reads from a user (scenario YAML, DeepSpeed JSON, config.json,
adapter_config.json, logs) goes through here, so the same limits hold everywhere:

- a size cap per kind of file (named in the message), checked before reading;
- UTF-8 text (logs excepted: their undecodable bytes are replaced, as terminals do);
- JSON and YAML trees of JSON types only (no YAML tags, dates, sets or bytes), string keys,
  finite numbers, at most ``MAX_DEPTH`` levels deep and ``MAX_NODES`` values in all;
- YAML aliases may not expand the document beyond ``MAX_NODES`` values (an "alias bomb" of a
  few hundred bytes would otherwise expand to billions), checked on the composed node graph before
  any Python object is built.

Nothing here executes input: YAML goes through PyYAML's ``SafeLoader`` (no ``!!python`` tags).
"""

from __future__ import annotations

import re

import json
import math
import os
import stat
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from memfit.errors import MemfitError

MiB = 2**20
MAX_CONFIG_BYTES = 4 * MiB
"""Scenario YAML, DeepSpeed JSON, config.json, adapter_config.json (the largest real config.json
files, with long id2label tables, are a few hundred KiB)."""
MAX_LOG_BYTES = 16 * MiB
"""A pasted log for ``memfit diagnose`` (the failure is in its last lines; ``tail -c`` cuts one)."""
MAX_LOG_LINES = 250_000
"""Lines of a log (carriage returns of progress bars count): each is parsed, so this bounds the
time and memory a log can take (about a second and 100 MiB at the limit)."""
MAX_DEPTH = 64
"""Nesting levels of a JSON/YAML document (real configs have fewer than 6)."""
MAX_NODES = 200_000
"""Values in a JSON/YAML document, counting every alias expansion."""


def _size_text(n: int) -> str:
    return f"{n / MiB:.0f} MiB" if n >= MiB else f"{n:,} bytes"


def read_bytes(path: str | Path, *, what: str, max_bytes: int = MAX_CONFIG_BYTES) -> bytes:
    """The bytes of a regular file of at most ``max_bytes``; ``MemfitError`` for anything else
    (missing, a directory, unreadable, a name too long, too large)."""
    p = Path(path)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        raise MemfitError(f"{what} not found: {_show(p)}") from None
    except OSError as e:
        raise MemfitError(f"cannot read {what} {_show(p)}: {e.strerror or type(e).__name__}") from None
    except ValueError as e:  # an embedded NUL byte
        raise MemfitError(f"cannot read {what} {_show(p)}: {e}") from None
    if stat.S_ISDIR(st.st_mode):
        raise MemfitError(f"{what} {_show(p)} is a directory, not a file")
    if not stat.S_ISREG(st.st_mode):
        raise MemfitError(f"{what} {_show(p)} is not a regular file")
    if st.st_size > max_bytes:
        raise MemfitError(f"{what} {_show(p)} is {_size_text(st.st_size)}; memfit reads at most "
                          f"{_size_text(max_bytes)} for a {what}")
    try:
        with open(p, "rb") as f:
            data = f.read(max_bytes + 1)
    except OSError as e:
        raise MemfitError(f"cannot read {what} {_show(p)}: {e.strerror or type(e).__name__}") from None
    if len(data) > max_bytes:  # it grew while we looked
        raise MemfitError(f"{what} {_show(p)} is over {_size_text(max_bytes)}; memfit reads at most that")
    return data


def read_text(path: str | Path, *, what: str, max_bytes: int = MAX_CONFIG_BYTES) -> str:
    """A UTF-8 text file (see ``read_bytes``); a byte that is not UTF-8 is an error naming its offset."""
    data = read_bytes(path, what=what, max_bytes=max_bytes)
    return decode_text(data, what=f"{what} {_show(Path(path))}")


def decode_text(data: bytes, *, what: str) -> str:
    if b"\x00" in data[:4096]:
        raise MemfitError(f"cannot read {what}: not a text file (it holds NUL bytes)")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise MemfitError(f"cannot read {what}: not UTF-8 text (byte {e.start} is {data[e.start:e.start + 1]!r})") from None


def _show(p: Path) -> str:
    """The path as given when it prints as one short line; else quoted and shortened."""
    s = str(p)
    if s.isprintable() and len(s) <= 200:
        return s
    return repr(s if len(s) <= 200 else s[:120] + "..." + s[-40:])


# ------------------------------------------------------------------------------------------ JSON

def parse_json(text: str, *, what: str,
               object_pairs_hook: Callable[[list[tuple[str, Any]]], Any] | None = None,
               allow_non_finite: bool = False, max_nodes: int = MAX_NODES) -> Any:
    """Strict JSON (no NaN/Infinity) checked by ``check_tree``. ``allow_non_finite``: Python's
    NaN/Infinity extension is read (transformers writes and reads it in config.json; the fields
    memfit uses are then checked by name where they are read). ``max_nodes``: a record file's own
    cap instead of ``MAX_NODES`` (``core/records/bounded.py``)."""
    def no_constant(name: str) -> Any:
        raise MemfitError(f"{what} holds {name}, which is not a JSON number")

    try:
        value = json.loads(text, object_pairs_hook=object_pairs_hook,
                           parse_constant=None if allow_non_finite else no_constant)
    except json.JSONDecodeError as e:
        raise MemfitError(f"{what} is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    except RecursionError:
        raise MemfitError(f"{what} is nested too deeply (memfit reads at most {MAX_DEPTH} levels)") from None
    except ValueError as e:  # int() of a number over sys.int_info's digit limit
        if isinstance(e, MemfitError):
            raise
        raise MemfitError(f"{what}: {str(e).splitlines()[0]}") from None
    check_tree(value, what=what, finite=not allow_non_finite, max_nodes=max_nodes)
    return value


# ------------------------------------------------------------------------------------------ YAML

def parse_yaml(text: str, *, what: str, dates_as_text: bool = False) -> Any:
    """YAML through a ``SafeLoader`` that refuses alias expansion past ``MAX_NODES`` values and any
    tag outside the JSON types; then ``check_tree``. ``dates_as_text``: a bare date (``2023-02-13``)
    is kept as the string it is written as (documents that date their sources)."""
    import yaml

    class Loader(yaml.SafeLoader):  # one class per call: PyYAML keeps resolver state on the class
        def compose_document(self):  # type: ignore[no-untyped-def]
            node = super().compose_document()
            _check_expansion(node, what)
            return node

    if dates_as_text:
        Loader.add_constructor("tag:yaml.org,2002:timestamp", lambda loader, node: loader.construct_scalar(node))

    try:
        value = yaml.load(text, Loader=Loader)  # noqa: S506 (a SafeLoader subclass)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise MemfitError(f"{what} is not valid YAML{where}: {problem}") from None
    except RecursionError:
        raise MemfitError(f"{what} is nested too deeply (memfit reads at most {MAX_DEPTH} levels)") from None
    except ValueError as e:
        if isinstance(e, MemfitError):
            raise
        if "integer string conversion" in str(e):  # Python's int-digit limit (sys.set_int_max_str_digits)
            m = re.search(r"value has (\d+) digits", str(e))
            digits = f"{m.group(1)} digits" if m else "more than 4,300 digits"
            raise MemfitError(f"{what}: a number of {digits} (more than 4,300); no memfit setting is that large") from None
        raise MemfitError(f"{what}: {str(e).splitlines()[0]}") from None
    check_tree(value, what=what)
    return value


def _check_expansion(root: Any, what: str) -> None:
    """Values the node graph expands to (aliases counted at every use), without expanding it."""
    from yaml.nodes import MappingNode, SequenceNode

    size: dict[int, int] = {}
    open_nodes: set[int] = set()
    """Nodes whose children are being counted: meeting one again below itself is a cycle (an alias
    inside the very node it names, ``&a [*a]``), which would expand without end."""
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        if id(node) in size:
            continue
        if isinstance(node, MappingNode):
            children = [n for pair in node.value for n in pair]
        elif isinstance(node, SequenceNode):
            children = list(node.value)
        else:
            size[id(node)] = 1
            continue
        if done:
            open_nodes.discard(id(node))
            total = 1 + sum(size.get(id(c), 0) for c in children)
            if total > MAX_NODES:
                raise MemfitError(f"{what}: YAML aliases expand it to over {MAX_NODES:,} values; memfit refuses "
                                  "(an alias bomb?)")
            size[id(node)] = total
        else:
            if id(node) in open_nodes:
                raise MemfitError(f"{what}: a YAML alias refers to a node that contains it (line "
                                  f"{node.start_mark.line + 1}), which expands without end; memfit refuses")
            open_nodes.add(id(node))
            stack.append((node, True))
            for c in children:
                if id(c) in open_nodes:
                    raise MemfitError(f"{what}: a YAML alias refers to a node that contains it (line "
                                      f"{c.start_mark.line + 1}), which expands without end; memfit refuses")
                if id(c) not in size:
                    stack.append((c, False))


# ------------------------------------------------------------------------------------ the trees

def check_tree(value: Any, *, what: str, finite: bool = True, max_nodes: int = MAX_NODES) -> None:
    """A JSON-typed tree: dict (string keys), list, str, int, float (finite unless ``finite`` is
    False), bool, None; at most ``MAX_DEPTH`` deep and ``MAX_NODES`` values. Iterative: no recursion
    limit to hit."""
    count = 0
    stack: list[tuple[Any, str, int]] = [(value, "", 0)]
    while stack:
        v, where, depth = stack.pop()
        count += 1
        if count > max_nodes:
            raise MemfitError(f"{what} holds over {max_nodes:,} values; memfit refuses")
        if depth > MAX_DEPTH:
            raise MemfitError(f"{what} is nested over {MAX_DEPTH} levels deep (at {where or 'the top'}); memfit "
                              "refuses")
        if isinstance(v, Mapping):
            for k, item in v.items():
                if not isinstance(k, str):
                    raise MemfitError(f"{what}: key {k!r} under {where or 'the top level'} must be a string")
                stack.append((item, f"{where}.{k}" if where else k, depth + 1))
        elif isinstance(v, (list, tuple)):
            stack.extend((item, f"{where}[{i}]", depth + 1) for i, item in enumerate(v))
        elif isinstance(v, float):
            if finite and not math.isfinite(v):
                raise MemfitError(f"{what}: {where or 'the value'} is {v!r}; numbers must be finite")
        elif v is None or isinstance(v, (str, int)):  # bool is an int
            pass
        else:
            raise MemfitError(f"{what}: {where or 'the value'} is a {type(v).__name__} ({v!r:.40}); only JSON types "
                              "(objects, lists, strings, numbers, booleans, null) are read")


TRUE_WORDS = ("true", "yes", "on")
FALSE_WORDS = ("false", "no", "off")


def parse_bool(value: Any, *, what: str) -> bool:
    """A real boolean, or one of the usual words (true/false, yes/no, on/off, any case); anything
    else (``"0"``, ``""``, ``"flase"``, numbers) is an error naming ``what``."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        word = value.strip().lower()
        if word in TRUE_WORDS:
            return True
        if word in FALSE_WORDS:
            return False
    raise MemfitError(f"{what} must be true or false (or yes/no), got {value!r}")
