"""Editing a user's JSON or YAML file the way a person would: the keys a recommendation changes,
and nothing else, so the unified diff against the original shows only them.

- JSON (a TrainingArguments ``to_json_file``, a DeepSpeed config): parsed, changed and written back
  with the original's indentation and key order (JSON has no comments to lose).
- YAML (an ``accelerate config`` file, a TRL recipe): each changed scalar is replaced on its own
  line, so comments and layout stay; a missing key is added under its parent. The edited text is
  parsed back and must equal the intended mapping; where a line edit cannot do that (flow style,
  multi-line values), the whole file is written with ``yaml.safe_dump`` instead, and a note says so.

A change is ``(key path, value)``; the value ``DELETE`` removes the key. Pure: no file is read or
written here.
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any

DELETE = object()
"""A change's value that removes the key."""

Changes = tuple[tuple[tuple[str, ...], Any], ...]


def apply_changes(raw: dict[str, Any], changes: Changes) -> dict[str, Any]:
    """``raw`` with every change applied (parents created as mappings where missing)."""
    out = copy.deepcopy(raw)
    for path, value in changes:
        node = out
        for k in path[:-1]:
            if not isinstance(node.get(k), dict):
                node[k] = {}
            node = node[k]
        if value is DELETE:
            node.pop(path[-1], None)
        else:
            node[path[-1]] = value
    return out


def json_indent(text: str) -> int:
    """The indentation of the first nested line (2 for ``TrainingArguments.to_json_file``)."""
    for line in text.splitlines()[1:]:
        stripped = line.lstrip(" ")
        if stripped.startswith('"'):
            return max(len(line) - len(stripped), 1)
    return 2


def _object_span(lines: list[str], path: tuple[str, ...]) -> tuple[int, int] | None:
    """(line of ``"key": {``, line of its closing brace) for the object at ``path`` (the whole file
    for ``()``), when each key on the way occurs once in the file."""
    if not path:
        opens = [i for i, ln in enumerate(lines) if ln.strip() == "{"]
        closes = [i for i, ln in enumerate(lines) if ln.strip() == "}"]
        return (opens[0], closes[-1]) if opens and closes else None
    key = path[-1]
    hits = [i for i, ln in enumerate(lines) if f'"{key}"' in ln]
    if len(hits) != 1 or not re.match(r'^\s*"' + re.escape(key) + r'"\s*:\s*\{\s*$', lines[hits[0]]):
        return None
    depth = 0
    for j in range(hits[0], len(lines)):
        depth += lines[j].count("{") - lines[j].count("}")
        if depth == 0:
            return hits[0], j
    return None


def _json_line_edit(lines: list[str], path: tuple[str, ...], value: Any, indent: int) -> bool:
    """Replace a scalar whose key occurs once in the file, or add a key (a scalar or an object)
    before the closing brace of its parent; False otherwise (the caller then re-dumps the file)."""
    key = path[-1]
    pat = re.compile(r'^(?P<lead>\s*"' + re.escape(key) + r'"\s*:\s*)(?P<value>[^{}\[\],]*?)(?P<comma>,?)\s*$')
    hits = [i for i, ln in enumerate(lines) if f'"{key}"' in ln]
    if len(hits) == 1 and (m := pat.match(lines[hits[0]])) and not isinstance(value, (dict, list)):
        i = hits[0]
        if value is DELETE:
            del lines[i]
            if not m.group("comma") and i > 0:  # it was the last entry: the one before loses its comma
                lines[i - 1] = lines[i - 1].rstrip().removesuffix(",")
            return True
        lines[i] = f"{m.group('lead')}{json.dumps(value)}{m.group('comma')}"
        return True
    if hits or value is DELETE:
        return not hits and value is DELETE
    span = _object_span(lines, path[:-1])
    if span is None:
        return False
    start, close = span
    pad = " " * (len(lines[close]) - len(lines[close].lstrip()) + indent)
    body = json.dumps(value, indent=indent).splitlines()
    entry = [f'{pad}"{key}": {body[0]}'] + [pad + ln for ln in body[1:]]
    prev = close - 1
    if prev > start:
        lines[prev] = lines[prev].rstrip() + ","
    lines[close:close] = entry
    return True


def edit_json(text: str, raw: dict[str, Any], changes: Changes) -> str:
    """The JSON file ``text`` (parsed: ``raw``) with ``changes``: line by line where each key is
    plain, else the whole mapping written back in the file's own indentation."""
    want = apply_changes(raw, changes)
    indent = json_indent(text)
    lines = text.splitlines()
    if all(_json_line_edit(lines, path, value, indent) for path, value in changes):
        new = "\n".join(lines) + "\n"
        try:
            if json.loads(new) == want:
                return new
        except ValueError:
            pass
    return json.dumps(want, indent=indent) + "\n"


def _yaml_scalar(value: Any) -> str:
    import yaml

    dumped = yaml.safe_dump(value, default_flow_style=True, width=10_000).strip()
    return dumped[:-4].strip() if dumped.endswith("\n...") else dumped.removesuffix("...").strip()


_KEY = r"^(?P<indent>[ ]*)(?P<key>{key})[ ]*:(?P<sp>[ ]*)(?P<value>[^#\n]*?)(?P<comment>[ ]+#.*)?$"


def _find(lines: list[str], key: str, start: int, end: int, indent: int | None) -> int | None:
    pat = re.compile(_KEY.format(key=re.escape(key)))
    for i in range(start, end):
        m = pat.match(lines[i])
        if m and (indent is None or len(m.group("indent")) == indent):
            return i
    return None


def _block_end(lines: list[str], i: int, indent: int) -> int:
    """The line after the block of the key at line ``i`` (indent ``indent``)."""
    j = i + 1
    while j < len(lines):
        s = lines[j]
        if s.strip() and not s.lstrip().startswith("#") and len(s) - len(s.lstrip(" ")) <= indent:
            break
        j += 1
    return j


def _line_edit(lines: list[str], path: tuple[str, ...], value: Any) -> bool:
    """Edit one scalar in place (or add it, or delete it); False when the layout is not plain."""
    start, end, indent = 0, len(lines), 0
    for k in path[:-1]:
        i = _find(lines, k, start, end, indent)
        if i is None:
            return False
        m = re.match(_KEY.format(key=re.escape(k)), lines[i])
        if m.group("value").strip():  # an inline mapping: not a plain block
            return False
        end = _block_end(lines, i, indent)
        child = next((len(s) - len(s.lstrip(" ")) for s in lines[i + 1:end] if s.strip() and
                      not s.lstrip().startswith("#")), indent + 2)
        start, indent = i + 1, child
    key = path[-1]
    i = _find(lines, key, start, end, indent)
    if value is DELETE:
        if i is not None:
            if _block_end(lines, i, indent) != i + 1:
                return False
            del lines[i]
        return True
    if isinstance(value, (dict, list)):
        return False
    if i is None:
        at = end
        while at > start and not lines[at - 1].strip():
            at -= 1
        lines.insert(at, f"{' ' * indent}{key}: {_yaml_scalar(value)}")
        return True
    m = re.match(_KEY.format(key=re.escape(key)), lines[i])
    if not m.group("value").strip() and _block_end(lines, i, indent) != i + 1:
        return False  # a nested block where a scalar goes
    lines[i] = f"{m.group('indent')}{m.group('key')}:{m.group('sp') or ' '}{_yaml_scalar(value)}{m.group('comment') or ''}"
    return True


def edit_yaml(text: str, raw: dict[str, Any], changes: Changes) -> tuple[str, bool]:
    """The YAML file ``text`` (parsed: ``raw``) with ``changes``: (new text, whether every change
    was made line by line, keeping the file's comments and layout)."""
    import yaml

    want = apply_changes(raw, changes)
    lines = text.splitlines()
    ok = all(_line_edit(lines, path, value) for path, value in changes)
    if ok:
        new = "\n".join(lines) + "\n"
        try:
            if yaml.safe_load(new) == want:
                return new, True
        except yaml.YAMLError:
            pass
    return yaml.safe_dump(want, sort_keys=False, default_flow_style=False), False
