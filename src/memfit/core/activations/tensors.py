"""The activation model's bytes as the tensors they are: each layer's saved tensors one by one, in
the order its formula counts them (the order of the family's code), so the ledger can hand the CUDA
caching allocator one request per tensor instead of one per layer (issue 19 item 3).

The activation model (``analytic``, ``layout``, ``families``, ``stacks``) counts bytes tensor by tensor
and sums them: ``n += D * t * h`` is one tensor of the training dtype (``D`` bytes per element) over
``t`` tokens and ``h`` channels, ``n += 3 * D * t * i`` three (gate output, its activation, up output),
``n += 4 * t * h`` one fp32 tensor. ``split_estimate`` evaluates the same model once more on
``Sym`` numbers (ints that remember the sum of products they were made of) and reads the terms back:

- a term holding the dtype size ``D`` is ``coefficient`` tensors of the rest of the product
  (``3 * D * t * i``: 3 tensors of ``D t i``); a term without ``D`` (an fp32 or int64 tensor, whose
  element size is a literal 4 or 8 in the code) is one tensor of the whole product;
- a subtracted term removes such tensors (``n -= D * t * hq``); a division (``hq // a // 4``,
  ``ceil32(s)``) is an opaque width.

What this reading gets wrong is stated, not hidden: a literal width multiplier in a dtype term is read
as a tensor count (GPT-2's fused ``c_attn`` output, ``D * t * 3 * h``, becomes 3 tensors of ``D t h``), and
a literal-4 fp32 term of two tensors as one (cos and sin in fp32, a LayerNorm's mean and rstd as one
``8 t``). Every list is checked against the model's own byte figure: a part whose tensors do not sum to
it (a formula the reading cannot follow) stays one tensor, and ``ActivationTensors.notes`` says so.
Pure Python; evaluated once per plan (the recommender's estimator uses the sums).
"""

from __future__ import annotations

import dataclasses

from memfit.core.lean_dataclass import dataclass
from memfit.core.activations.estimate import ActivationEstimate

Term = tuple[int, tuple[tuple[str, int], ...]]
"""(coefficient, atoms): an atom is (name, value)."""


class Sym(int):
    """An int that remembers the terms it is the sum of (see the module docstring)."""

    terms: tuple[Term, ...]

    def __new__(cls, value: int, terms: tuple[Term, ...]) -> Sym:
        obj = super().__new__(cls, value)
        obj.terms = terms
        return obj

    @classmethod
    def atom(cls, name: str, value: int) -> Sym:
        return cls(value, ((1, ((name, value),)),))

    @staticmethod
    def _terms(x: object) -> tuple[Term, ...] | None:
        if isinstance(x, Sym):
            return x.terms
        if isinstance(x, bool) or not isinstance(x, int):
            return None
        return ((x, ()),) if x else ()

    def __add__(self, other: object):  # noqa: ANN204
        o = Sym._terms(other)
        if o is None:
            return int(self) + other  # type: ignore[operator]
        return Sym(int(self) + int(other), self.terms + o)  # type: ignore[call-overload]

    __radd__ = __add__

    def __sub__(self, other: object):  # noqa: ANN204
        o = Sym._terms(other)
        if o is None:
            return int(self) - other  # type: ignore[operator]
        return Sym(int(self) - int(other), self.terms + tuple((-c, a) for c, a in o))  # type: ignore[call-overload]

    def __rsub__(self, other: object):  # noqa: ANN204
        o = Sym._terms(other)
        if o is None:
            return other - int(self)  # type: ignore[operator]
        return Sym(int(other) - int(self), o + tuple((-c, a) for c, a in self.terms))  # type: ignore[call-overload]

    def __neg__(self) -> Sym:
        return Sym(-int(self), tuple((-c, a) for c, a in self.terms))

    def __pos__(self) -> Sym:
        return self

    def __mul__(self, other: object):  # noqa: ANN204
        o = Sym._terms(other)
        if o is None:
            return int(self) * other  # type: ignore[operator]
        terms = tuple((c1 * c2, tuple(sorted(a1 + a2))) for c1, a1 in self.terms for c2, a2 in o)
        return Sym(int(self) * int(other), terms)  # type: ignore[call-overload]

    __rmul__ = __mul__

    def _opaque(self, value: int) -> Sym:
        if value == 0:
            return Sym(0, ())
        return Sym(value, ((1 if value > 0 else -1, ((f"~{abs(value)}", abs(value)),)),))

    def __floordiv__(self, other: object):  # noqa: ANN204
        if Sym._terms(other) is None:
            return int(self) // other  # type: ignore[operator]
        return self._opaque(int(self) // int(other))  # type: ignore[call-overload]

    def __rfloordiv__(self, other: object):  # noqa: ANN204
        if Sym._terms(other) is None:
            return other // int(self)  # type: ignore[operator]
        return self._opaque(int(other) // int(self))  # type: ignore[call-overload]

    def __truediv__(self, other: object) -> float:
        return int(self) / other  # type: ignore[operator]

    def __rtruediv__(self, other: object) -> float:
        return other / int(self)  # type: ignore[operator]


DTYPE = "D"


def tensors(value: object) -> tuple[int, ...] | None:
    """The tensors ``value`` (a ``Sym``, or a plain int: one tensor) stands for, in order; None when
    its terms do not read as tensors (a removal of a tensor never added, a negative size)."""
    if not isinstance(value, Sym):
        return (int(value),) if value else ()  # type: ignore[call-overload]
    out: list[int] = []
    terms: list[tuple] = []  # each tensor's term (its atoms): a removal takes its own term's tensor
    for coef, atoms in value.terms:
        rest = 1
        has_dtype = False
        for name, v in atoms:
            if name == DTYPE and not has_dtype:
                has_dtype = True
                rest *= v
            else:
                rest *= v
        if rest == 0 or coef == 0:
            continue
        size, count = (rest, coef) if has_dtype else (coef * rest, 1 if coef * rest > 0 else -1)
        if count > 0 and size > 0:
            out.extend([size] * count)
            terms.extend([atoms] * count)
            continue
        size = abs(size)
        for _ in range(abs(count)):  # a removal: the most recent tensor of its own term, else of that size
            # (by size alone, two terms that happen to be equal at one length, e.g. b*s*h and b*a*s*s at
            # s = h / a, would swap tensors there and nowhere else: the epoch template needs one order)
            hits = [k for k in range(len(out) - 1, -1, -1) if out[k] == size and terms[k] == atoms] or \
                [k for k in range(len(out) - 1, -1, -1) if out[k] == size]
            if not hits:
                return None
            del out[hits[0]]
            del terms[hits[0]]
    if sum(out) != int(value) or any(n <= 0 for n in out):  # type: ignore[call-overload]
        return None
    return tuple(out)


@dataclass(frozen=True, slots=True, kw_only=True)
class ActivationTensors:
    """An ``ActivationEstimate``'s parts as tensors; each tuple sums to the estimate's figure."""

    layers: tuple[tuple[int, ...], ...]
    """What each layer keeps, in execution order (``ActivationEstimate.per_layer_bytes``)."""
    recompute: tuple[tuple[int, ...], ...]
    """With checkpointing: what each layer's recompute rebuilds (``recompute_per_layer``)."""
    embedding: tuple[int, ...]
    head_rest: tuple[int, ...]
    """The head's tensors besides the logits the outputs hold and the loss's log-softmax."""
    notes: tuple[str, ...] = ()

    @property
    def split(self) -> bool:
        return not self.notes


def lumps(est: ActivationEstimate, note: str | None = None) -> ActivationTensors:
    """Every part one tensor (the ledger's granularity before this module)."""
    head_rest = est.head_bytes - est.logits_kept_bytes - est.loss_saved_bytes
    return ActivationTensors(
        layers=tuple((n,) if n else () for n in est.per_layer_bytes()),
        recompute=tuple((n,) if n else () for n in est.recompute_per_layer()),
        embedding=(est.embedding_bytes,) if est.embedding_bytes else (),
        head_rest=(head_rest,) if head_rest else (), notes=(note,) if note else ())


def _symbolic_arch(arch):  # noqa: ANN001, ANN202 (ArchSpec)
    fields = {f: Sym.atom(f, getattr(arch, f)) for f in ("hidden_size", "num_heads", "num_kv_heads", "head_dim",
                                                         "intermediate_size", "vocab_size", "num_experts",
                                                         "experts_per_token", "num_labels")}
    layout = arch.layout
    if layout is not None:
        lf = {}
        for f in dataclasses.fields(layout):
            v = getattr(layout, f.name)
            if isinstance(v, int) and not isinstance(v, bool) and f.name != "dense_layers":
                lf[f.name] = Sym.atom(f.name, v)
            elif f.name == "mla" and v:
                lf[f.name] = tuple(Sym.atom(f"mla{k}", x) for k, x in enumerate(v))
        fields["layout"] = dataclasses.replace(layout, **lf)
    return dataclasses.replace(arch, **fields)


def split_estimate(est: ActivationEstimate, arch, peft, *, seq_len: int, micro_batch: int,  # noqa: ANN001
                   dtype_bytes: int, **options) -> ActivationTensors:  # noqa: ANN003
    """``est`` (from ``estimate_activation_bytes(arch, peft, seq_len=..., micro_batch=...,
    dtype_bytes=..., **options)``) as tensors; a part the reading cannot split stays one tensor."""
    from memfit.core.activations.analytic import estimate_activation_bytes

    sym_peft = dataclasses.replace(peft, num_virtual_tokens=Sym.atom("P", peft.num_virtual_tokens),
                                   lora_r=Sym.atom("r", peft.lora_r))
    target = options.get("target_len")
    if target is not None:
        options = {**options, "target_len": Sym.atom("target", target)}
    try:
        sym = estimate_activation_bytes(_symbolic_arch(arch), sym_peft, seq_len=Sym.atom("s", seq_len),
                                        micro_batch=Sym.atom("b", micro_batch),
                                        dtype_bytes=Sym.atom(DTYPE, dtype_bytes), **options)
    except Exception as exc:  # noqa: BLE001 - a formula the numbers cannot pass through: no split
        return lumps(est, f"activations kept one tensor per layer: the activation model did not evaluate "
                          f"symbolically ({type(exc).__name__})")
    notes: list[str] = []

    def part(what: str, value: object, expected: int) -> tuple[int, ...]:
        got = tensors(value)
        if got is None or sum(got) != expected:
            if expected:
                notes.append(f"{what}: one tensor ({expected:,} B; its formula's terms do not read as tensors)")
            return (expected,) if expected else ()
        return got

    layers = tuple(part(f"layer {k}", v, int(e)) for k, (v, e) in
                   enumerate(zip(sym.per_layer_bytes(), est.per_layer_bytes())))
    recompute = tuple(part(f"layer {k} recompute", v, int(e)) for k, (v, e) in
                      enumerate(zip(sym.recompute_per_layer(), est.recompute_per_layer())))
    embedding = part("embeddings", sym.embedding_bytes, est.embedding_bytes)
    rest = sym.head_bytes - sym.logits_kept_bytes - sym.loss_saved_bytes
    head_rest = part("head", rest, est.head_bytes - est.logits_kept_bytes - est.loss_saved_bytes)
    if len(layers) != len(est.per_layer_bytes()):
        return lumps(est, "activations kept one tensor per layer: layer count differs symbolically")
    return ActivationTensors(layers=layers, recompute=recompute, embedding=embedding, head_rest=head_rest,
                             notes=tuple(notes))
