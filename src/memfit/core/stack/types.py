"""The software stack of a run as typed values: each library's version, the release line memfit
models for it, and where that came from (given, read from a file, or assumed)."""

from __future__ import annotations


from memfit.core.lean_dataclass import dataclass
from memfit.core.stack.releases import ORDER, library


@dataclass(frozen=True, slots=True, kw_only=True)
class StackEntry:
    """One library of the stack."""

    library: str
    version: str | None
    """As given or read (``1.10.1+cu113``); None where memfit assumed it, or for ``none``."""
    line: str | None
    """The release line memfit models (``1.10``); None: not installed (``none``)."""
    source: str
    """Where it comes from: a flag or scenario key, a file and line, or the default's reason."""
    assumed: bool = False

    def describe(self, *, short: bool = False) -> str:
        lib = library(self.library)
        if self.line is None:
            return f"{lib.label} not installed" + ("" if short else f" ({self.source})")
        shown = self.version or self.line
        if short:
            return f"{lib.label} {shown}" + (" (assumed)" if self.assumed else "")
        return f"{lib.label} {shown}" + (f" (assumed: {self.source})" if self.assumed else f" ({self.source})")


@dataclass(frozen=True, slots=True, kw_only=True)
class Stack:
    """Every library of ``releases.ORDER``, once."""

    entries: tuple[StackEntry, ...]
    notes: tuple[str, ...] = ()
    """What reading the stack files left out, and why (ranges, editable installs)."""

    def __post_init__(self) -> None:
        names = [e.library for e in self.entries]
        if sorted(names) != sorted(ORDER):
            raise ValueError(f"a Stack needs exactly {', '.join(ORDER)}, got {', '.join(names)}")

    def entry(self, name: str) -> StackEntry:
        return next(e for e in self.entries if e.library == name)

    def line(self, name: str) -> str | None:
        return self.entry(name).line

    @property
    def torch(self) -> str:
        return self.line("torch") or ""

    @property
    def cuda(self) -> str:
        return self.line("cuda") or ""

    @property
    def deepspeed(self) -> str | None:
        return self.line("deepspeed")

    @property
    def transformers(self) -> str | None:
        return self.line("transformers")

    @property
    def peft(self) -> str | None:
        return self.line("peft")

    @property
    def bitsandbytes(self) -> str | None:
        """For the bitsandbytes recipes (``core/quant``): the release whose saved tensors apply."""
        return self.line("bitsandbytes")

    @property
    def accelerate(self) -> str | None:
        return self.line("accelerate")

    @property
    def trl(self) -> str | None:
        return self.line("trl")

    @property
    def assumed(self) -> tuple[StackEntry, ...]:
        return tuple(e for e in self.entries if e.assumed)

    def summary(self) -> str:
        """One line: every library, given or assumed, in ``ORDER``."""
        return "Software stack: " + ", ".join(self.entry(n).describe(short=True) for n in ORDER) + \
            (" (finding stack-assumed says why each assumed one)." if self.assumed else ".")

    def as_dict(self) -> dict[str, dict]:
        """For JSON output: per library its version, line, source and whether it was assumed."""
        return {e.library: {"version": e.version, "line": e.line, "source": e.source, "assumed": e.assumed}
                for e in (self.entry(n) for n in ORDER)}
