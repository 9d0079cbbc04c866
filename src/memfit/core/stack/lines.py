"""Release lines as numbers: comparing ``major.minor`` lines, and a version's local part. Shared by
``releases`` and the per-library modules (so none of them imports another)."""

from __future__ import annotations


def split_local(text: str) -> tuple[str, str]:
    """``'1.10.1+cu113'`` -> ``('1.10.1', 'cu113')``."""
    base, _, local = str(text).strip().partition("+")
    return base, local


def line_key(line: str) -> tuple[int, int]:
    major, minor = line.split(".")
    return int(major), int(minor)


def at_least(line: str | None, since: str) -> bool:
    """``line`` is ``since`` or later (``None``, not installed: False)."""
    return line is not None and line_key(line) >= line_key(since)
