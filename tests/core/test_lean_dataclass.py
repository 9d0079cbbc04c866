"""``memfit.core.lean_dataclass.dataclass`` against the standard library's ``dataclasses.dataclass``: twin
classes, one made by each, give the same repr, equality, hash (or unhashability), frozenness, fields
and ``replace``, over every combination of the flags memfit uses and of the field options."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import field

import pytest

from memfit.core import lean_dataclass

FLAGS = [dict(), dict(slots=True), dict(frozen=True), dict(frozen=True, slots=True),
         dict(frozen=True, slots=True, kw_only=True), dict(eq=False), dict(frozen=True, eq=False),
         dict(repr=False, frozen=True)]


def _twins(flags, body):
    """The class ``body(decorator)`` builds, once with each decorator."""
    return body(dataclasses.dataclass(**flags)), body(lean_dataclass.dataclass(**flags))


def _plain(deco):
    @deco
    class Item:
        name: str
        size: int = 0
        tags: tuple = ()
        note: str = field(default="", compare=False)
        secret: str = field(default="s", repr=False)
        weight: float = field(default=1.0, hash=False)
        extra: list = field(default_factory=list, compare=False, hash=False)
    return Item


def _one(deco):
    @deco
    class One:
        x: float
    return One


def _none(deco):
    @deco
    class Empty:
        pass
    return Empty


def _nested(deco):
    @deco
    class Node:
        label: str
        child: object = None
    return Node


def _own(deco):
    @deco
    class Own:
        a: int

        def __repr__(self):
            return "own"

        def __eq__(self, other):
            return True

        __hash__ = object.__hash__
    return Own


def _check(std, ours, *make):
    for args, kwargs in make:
        a, b = std(*args, **kwargs), ours(*args, **kwargs)
        a2, b2 = std(*args, **kwargs), ours(*args, **kwargs)
        if std.__repr__ is object.__repr__:  # repr=False
            assert ours.__repr__ is object.__repr__
        else:
            assert repr(a) == repr(b)
        assert (a == a2) == (b == b2) and (a != a2) == (b != b2)
        assert (a == object()) == (b == object())
        assert type(std).__eq__ is type(ours).__eq__
        if std.__hash__ is None:
            assert ours.__hash__ is None
            with pytest.raises(TypeError):
                hash(b)
        elif std.__hash__ is object.__hash__:  # eq=False: identity
            assert ours.__hash__ is object.__hash__
        else:
            assert ours.__hash__ not in (None, object.__hash__) and hash(a) == hash(b)
        assert [(f.name, f.repr, f.compare, f.hash) for f in dataclasses.fields(a)] == \
               [(f.name, f.repr, f.compare, f.hash) for f in dataclasses.fields(b)]
        assert hasattr(a, "__dict__") == hasattr(b, "__dict__")
        assert getattr(std, "__match_args__", None) == getattr(ours, "__match_args__", None)
        frozen = std.__dataclass_params__.frozen
        assert ours.__dataclass_params__.frozen == frozen
        if frozen:
            name = dataclasses.fields(a)[0].name if dataclasses.fields(a) else "z"
            raised = []
            for obj in (a, b):
                try:
                    setattr(obj, name, 0)
                except Exception as e:  # FrozenInstanceError (a field), or what the standard library raises
                    raised.append(type(e))
            assert len(raised) == 2 and raised[0] is raised[1], raised
        fields = dataclasses.fields(a)
        if fields:
            changed = {fields[0].name: kwargs[fields[0].name] if fields[0].name in kwargs else args[0]}
            a3, b3 = dataclasses.replace(a, **changed), dataclasses.replace(b, **changed)
            assert [getattr(a3, f.name) for f in fields] == [getattr(b3, f.name) for f in fields] or math.isnan(
                getattr(a3, fields[0].name))


@pytest.mark.parametrize("flags", FLAGS, ids=lambda f: ",".join(f) or "default")
def test_same_methods_as_the_standard_library(flags):
    kw = flags.get("kw_only", False)
    std, ours = _twins(flags, _plain)
    _check(std, ours, ((), dict(name="a", size=2, tags=(1, 2), note="n", secret="x", weight=0.5, extra=[1])),
           ((), dict(name="a")))
    a, b = std(name="a", note="x"), ours(name="a", note="x")
    assert (a == std(name="a", note="y")) == (b == ours(name="a", note="y"))  # note: compare=False
    assert (a == std(name="a", size=3)) == (b == ours(name="a", size=3))
    if std.__hash__ is not None:
        assert (hash(std(name="a", weight=2.0)) == hash(std(name="a"))) == \
               (hash(ours(name="a", weight=2.0)) == hash(ours(name="a")))  # weight: hash=False
    std, ours = _twins(flags, _one)
    nan = math.nan
    _check(std, ours, ((), dict(x=nan)), ((), dict(x=1.5)))
    assert (std(x=nan) == std(x=nan)) == (ours(x=nan) == ours(x=nan))
    assert (std(x=nan) == std(x=float("nan"))) == (ours(x=nan) == ours(x=float("nan")))
    std, ours = _twins(flags, _none)
    _check(std, ours, ((), {}))
    if not kw:
        std, ours = _twins(flags, _one)
        _check(std, ours, ((2.0,), {}))


@pytest.mark.parametrize("flags", [f for f in FLAGS if not f.get("frozen")], ids=str)
def test_recursion_and_own_methods(flags):
    std, ours = _twins(flags, _nested)
    a, b = std(label="a"), ours(label="a")
    a.child, b.child = a, b
    assert repr(a).split("(", 1)[1] == repr(b).split("(", 1)[1]
    std, ours = _twins(flags, _own)
    assert repr(std(a=1)) == repr(ours(a=1)) and (std(a=1) == 5) == (ours(a=1) == 5)
    assert (std.__hash__ is object.__hash__) == (ours.__hash__ is object.__hash__)


def test_inheritance_and_undecorated_subclasses():
    for deco in (dataclasses.dataclass(frozen=True, slots=True), lean_dataclass.dataclass(frozen=True, slots=True)):
        @deco
        class Base:
            a: int

        @deco
        class Child(Base):
            b: int = 2

        class Plain(Child):
            pass

        assert repr(Child(1)).endswith("Child(a=1, b=2)") and repr(Plain(1)).endswith("Plain(a=1, b=2)")
        assert Child(1) != Plain(1) and Child(1) == Child(1) and Base(1) != Child(1)
        assert hash(Child(1)) == hash((1, 2)) and hash(Base(1)) == hash((1,))


def test_the_core_takes_its_dataclass_from_lean_dataclass():
    """A core module that imported ``dataclasses.dataclass`` itself would compile its methods again at
    start-up (the plan imports the whole core it needs)."""
    import re
    from pathlib import Path

    core = Path(lean_dataclass.__file__).parent
    stdlib = [str(p.relative_to(core)) for p in sorted(core.rglob("*.py")) if p.name != "lean_dataclass.py"
              and re.search(r"^from dataclasses import .*\bdataclass\b|@dataclasses\.dataclass", p.read_text(), re.M)]
    assert not stdlib, f"use memfit.core.lean_dataclass's dataclass: {stdlib}"
