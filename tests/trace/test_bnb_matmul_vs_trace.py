"""bitsandbytes' quantized matmuls per release (``memfit.core.quant_kernels``) against their source and,
where they run, against a CPU-kernel trace.

- The table against the source of every release tag 0.39.1 ... 0.50.1: ``tests/fixtures/bnb_sources/``
  holds each tag's ``MatMul4Bit`` and ``MatMul8bitLt`` classes verbatim
  (``scripts/extract_bnb_matmul_sources.py``); the test reads what their forwards put in
  ``ctx.tensors`` and how the 4-bit forward dequantizes.
- 4-bit, run: the releases' own ``MatMul4Bit`` classes are executed from those files over the
  installed 0.50.2 functional layer (``F.dequantize_4bit`` runs on its CPU backend), patched in for
  ``bnb.matmul_4bit``; a peft LoRA layer on an NF4 ``Linear4bit`` is traced with each (the layers of
  ``memfit.trace.adapters``) and compared with memfit's adapter + quantized-layer model.
- 8-bit, run (0.50.2 only: older releases call CUDA-only ops, ``F.double_quant``/``igemmlt``; their
  saves are checked against the source): ``MatMul8bitLt`` on the CPU keeps the input itself and,
  for a frozen weight, neither ``CAt`` nor ``SCAt``.
"""

from __future__ import annotations

import ast
import contextlib
import warnings
from math import prod
from pathlib import Path
from typing import Optional, Tuple

import pytest

torch = pytest.importorskip("torch")
bnb = pytest.importorskip("bitsandbytes")
pytest.importorskip("peft")

from memfit.core.activations.adapters import Quantization, QuantizedLayer  # noqa: E402
from memfit.core.quant_kernels import bnb_release  # noqa: E402
from memfit.trace.adapters import build_adapted_layer, trace_adapted_layer  # noqa: E402

from adapter_cases import TOLERANCE_BYTES, planned_layer  # noqa: E402

SOURCES = Path(__file__).resolve().parents[1] / "fixtures" / "bnb_sources"
RELEASES = sorted((p.name.removesuffix(".py.txt") for p in SOURCES.glob("*.py.txt")),
                  key=lambda v: tuple(int(x) for x in v.split(".")))
RUN_4BIT = ("0.41.0", "0.43.1", "0.43.2", "0.45.0", "0.49.0")


def _class(tree: ast.Module, name: str) -> ast.ClassDef:
    return next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name)


def _forward(cls: ast.ClassDef) -> ast.FunctionDef:
    return next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "forward")


def _tensors_when_grad(fn: ast.FunctionDef) -> list[str]:
    """The names put in ``ctx.tensors`` under ``if any(ctx.needs_input_grad[:2])``."""
    for node in ast.walk(fn):
        if isinstance(node, ast.If) and "needs_input_grad" in ast.unparse(node.test):
            for stmt in node.body:
                if isinstance(stmt, ast.Assign) and ast.unparse(stmt.targets[0]) == "ctx.tensors":
                    return [ast.unparse(e) for e in stmt.value.elts]
    raise AssertionError("no ctx.tensors assignment under needs_input_grad")


@pytest.mark.parametrize("tag", RELEASES)
def test_release_table_matches_the_source(tag):
    tree = ast.parse((SOURCES / f"{tag}.py.txt").read_text())
    release = bnb_release(tag)
    four = _forward(_class(tree, "MatMul4Bit"))
    saved4 = _tensors_when_grad(four)
    assert (saved4[0] == "A") == release.saves_4bit_input, (tag, saved4)
    calls = {ast.unparse(n.func) for n in ast.walk(four) if isinstance(n, ast.Call)}
    dequantizes = "F.dequantize_4bit" in calls or "F.dequantize_fp4" in calls  # 0.39 named it dequantize_fp4
    assert dequantizes == release.dequantize_in_state_dtype, (tag, sorted(calls))
    eight = _forward(_class(tree, "MatMul8bitLt"))
    assert _tensors_when_grad(eight) == ["CAt", "subA", "A"], tag  # A itself is always kept
    # up to 0.44 double_quant (CA and CAt) runs unconditionally; from 0.45 only when the weight needs a gradient
    conditional = any(isinstance(n, ast.If) and "needs_input_grad[1]" in ast.unparse(n.test)
                      and "double_quant" in ast.unparse(n) for n in ast.walk(eight))
    assert (not conditional) == release.int8_keeps_transposed, tag


@contextlib.contextmanager
def _matmul4bit_of(tag: str):
    """That release's ``MatMul4Bit`` (executed from the vendored source) behind ``bnb.matmul_4bit``."""
    import bitsandbytes.functional as F
    from bitsandbytes.autograd import _functions as fn

    ns = {"torch": torch, "F": F, "prod": prod, "Optional": Optional, "Tuple": Tuple, "warnings": warnings,
          **{k: getattr(fn, k) for k in dir(fn) if not k.startswith("__")}}
    exec(compile((SOURCES / f"{tag}.py.txt").read_text(), f"bitsandbytes-{tag}", "exec"), ns)  # noqa: S102
    old = ns["MatMul4Bit"]

    class _Caller:  # those releases' Linear4bit passed weight.t() (0.50's passes the weight itself)
        @staticmethod
        def apply(A, B, out=None, bias=None, quant_state=None):  # noqa: N803
            return old.apply(A, B.t(), out, bias, quant_state)

    original = fn.MatMul4Bit
    fn.MatMul4Bit = _Caller
    try:
        yield
    finally:
        fn.MatMul4Bit = original


CASES_4BIT = {"lora": {"r": 8}, "lora-dropout": {"r": 4, "lora_dropout": 0.1}, "dora": {"r": 8, "use_dora": True}}


@pytest.mark.parametrize("stream", ["bf16", "fp32"])
@pytest.mark.parametrize("case", list(CASES_4BIT))
@pytest.mark.parametrize("tag", RUN_4BIT)
def test_4bit_lora_layer_matches_trace(tag, case, stream):
    """A LoRA layer on an NF4 base (compute dtype bf16, fp32 adapters) with ``tag``'s MatMul4Bit: the
    stream bf16 (a bf16 model) or fp32 (after prepare_model_for_kbit_training)."""
    config = CASES_4BIT[case]
    in_f, out_f = 48, 80
    release = bnb_release(tag)
    with _matmul4bit_of(tag):
        model = build_adapted_layer("LORA", config, in_features=in_f, out_features=out_f, dtype=stream,
                                    adapter_dtype="fp32", quantization="4bit", compute_dtype="bf16")
        for tokens in (16, 40):
            traced = trace_adapted_layer("LORA", config, in_features=in_f, out_features=out_f, tokens=tokens,
                                         dtype=stream, model=model)
            planned, keeps = planned_layer("LORA", config, in_f, out_f, tokens, "bf16+fp32-adapters" if stream == "bf16"
                                      else "fp32")
            q = Quantization(method="4bit", compute_bytes=2, release=release,
                             layers=(QuantizedLayer("proj", 0, in_f, out_f),))
            qs = q.saved(q.layers[0], 2 if stream == "bf16" else 4)
            planned += qs.per_token * tokens + qs.fixed
            # ctx.tensors is not a saved_tensors_hooks pack: the traced "keeps the input" sees the adapter only
            assert keeps == traced.keeps_input, (tag, case, stream)
            assert abs(planned - traced.saved_bytes) <= TOLERANCE_BYTES, (tag, case, stream, tokens, planned,
                                                                          traced.saved_bytes)


def test_int8_matmul_keeps_the_input_only():
    """0.50.2's ``MatMul8bitLt`` on the CPU, frozen int8 weight, no outliers (threshold 0)."""
    import bitsandbytes.functional as F
    from bitsandbytes.autograd._functions import MatMul8bitLt, MatmulLtState

    weight = torch.randn(80, 48, dtype=torch.float16)
    state = MatmulLtState()
    state.has_fp16_weights, state.threshold, state.is_training = False, 0.0, True
    state.CB, state.SCB, _ = F.int8_vectorwise_quant(weight)
    a = torch.randn(16, 48, dtype=torch.float16, requires_grad=True)
    seen = {}
    original = MatMul8bitLt.forward

    def forward(ctx, *args, **kwargs):
        out = original(ctx, *args, **kwargs)
        seen["tensors"] = ctx.tensors
        return out

    MatMul8bitLt.forward = staticmethod(forward)
    try:
        MatMul8bitLt.apply(a, state.CB, None, None, state).sum().backward()
    finally:
        MatMul8bitLt.forward = original
    cat, sub_a, kept = seen["tensors"]
    assert cat is None and sub_a is None and kept.untyped_storage().data_ptr() == a.untyped_storage().data_ptr()
    q = Quantization(method="8bit", compute_bytes=2, release=bnb_release(bnb.__version__),
                     layers=(QuantizedLayer("proj", 0, 48, 80),))
    s = q.saved(q.layers[0], 2)
    assert s.keeps_input and s.per_token == 0 and s.fixed == 0
