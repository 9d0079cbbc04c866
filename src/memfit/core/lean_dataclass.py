"""``dataclass``: the standard library's, with ``__repr__``, ``__eq__`` and ``__hash__`` made by closures
instead of compiled source.

Python 3.11's ``dataclasses.dataclass`` writes each method it adds as source text and ``exec``s it: six
per frozen class (``__init__``, ``__repr__``, ``__eq__``, ``__setattr__``, ``__delattr__``, ``__hash__``).
For the ~100 classes a plan imports that is 316 KB of source parsed and compiled at start-up, a quarter
of the whole ``memfit plan`` process (callgrind: 441 M of 1,786 M instructions in the parser and the
compiler). Here the standard decorator runs with ``repr=False, eq=False`` and the three methods that need
no per-class code are closures over the fields' names, with the same results as the generated ones:

- ``__repr__``: ``Name(a=1, b='x')`` over the ``repr=True`` fields, ``...`` on recursion (``reprlib``);
- ``__eq__``: the tuples of the ``compare=True`` fields when the classes are the same, else
  ``NotImplemented``;
- ``__hash__``: as the table in ``dataclasses._hash_action`` decides for ``unsafe_hash=False``: the hash
  of the tuple of the hashed fields (``hash=True``, or ``hash=None`` and ``compare=True``) for a frozen
  class, ``None`` (unhashable) otherwise, a class's own ``__hash__`` kept.

A class's own ``__repr__`` or ``__eq__`` is kept, as the standard decorator keeps it. ``__init__`` and the
frozen ``__setattr__``/``__delattr__`` are the standard library's. ``tests/core/test_lean_dataclass.py`` compares
each method with the standard library's on twin classes."""

from __future__ import annotations

import dataclasses
from operator import attrgetter
from reprlib import recursive_repr

__all__ = ["dataclass"]


def dataclass(cls=None, /, *, init=True, repr=True, eq=True, order=False, unsafe_hash=False, frozen=False,
              match_args=True, kw_only=False, slots=False):
    """``dataclasses.dataclass`` with the same arguments and results (``order`` and ``unsafe_hash``
    go to the standard decorator unchanged, with its own ``__eq__`` and ``__hash__``)."""

    def wrap(cls):
        if order or unsafe_hash:
            return dataclasses.dataclass(cls, init=init, repr=repr, eq=eq, order=order, unsafe_hash=unsafe_hash,
                                         frozen=frozen, match_args=match_args, kw_only=kw_only, slots=slots)
        own = cls.__dict__
        class_hash = own.get("__hash__", dataclasses.MISSING)
        explicit_hash = not (class_hash is dataclasses.MISSING or (class_hash is None and "__eq__" in own))
        add_repr = repr and "__repr__" not in own
        add_eq = eq and "__eq__" not in own
        out = dataclasses.dataclass(cls, init=init, repr=False, eq=False, frozen=frozen, match_args=match_args,
                                    kw_only=kw_only, slots=slots)
        fields = dataclasses.fields(out)
        if add_repr:
            out.__repr__ = _repr([f.name for f in fields if f.repr], out)
        if add_eq:
            out.__eq__ = _eq(_values([f.name for f in fields if f.compare]), out)
        if eq and not explicit_hash:
            out.__hash__ = _hash(_values([f.name for f in fields if (f.compare if f.hash is None else f.hash)]),
                                 out) if frozen else None
        return out

    return wrap if cls is None else wrap(cls)


def _values(names: list[str]):
    """The tuple of ``names``' values of an instance (``attrgetter`` gives a bare value for one name)."""
    if not names:
        return lambda self: ()
    if len(names) == 1:
        get = attrgetter(names[0])
        return lambda self: (get(self),)
    return attrgetter(*names)


def _named(fn, name: str, cls):
    fn.__name__ = name
    fn.__qualname__ = f"{cls.__qualname__}.{name}"
    fn.__module__ = cls.__module__
    return fn


def _repr(names: list[str], cls):
    template = "{}(" + ", ".join(f"{n}={{!r}}" for n in names) + ")"
    values = _values(names)

    @recursive_repr()
    def __repr__(self, _format=template.format, _values=values):
        return _format(self.__class__.__qualname__, *_values(self))

    return _named(__repr__, "__repr__", cls)


def _eq(values, cls):
    def __eq__(self, other, _values=values):
        if other.__class__ is self.__class__:
            return _values(self) == _values(other)
        return NotImplemented

    return _named(__eq__, "__eq__", cls)


def _hash(values, cls):
    def __hash__(self, _values=values):
        return hash(_values(self))

    return _named(__hash__, "__hash__", cls)
