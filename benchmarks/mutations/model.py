"""One mutation: a textual change to one file and the tests expected to catch it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Mutation:
    id: str
    area: str
    path: str
    find: str
    replace: str
    tests: tuple[str, ...]
    why: str
    """The bug it stands for, and the measured comparison expected to catch it."""
