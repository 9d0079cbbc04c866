"""The CPU kernel set of the activation model (``memfit.core.activations.kernels``, ``kernels="cpu"``,
what plans of ``accelerator: cpu`` use) against torch itself:

- the sdpa backend ``cpu_sdpa`` picks equals ``torch._fused_sdp_choice`` on CPU tensors (the C++
  ``select_sdp_backend_cpp`` dispatch) over dtypes, grouped heads, masks, dropout and head widths;
- the flash kernel's saved tensors (read off the real autograd node) besides q, k, v and the output
  are the bytes ``cpu_sdpa`` counts: the fp32 logsumexp and the mask in the query's dtype;
- the analytic activations with ``kernels="cpu"`` equal a fake-tensor trace of the same step with the
  CPU kernels (``TraceOptions(kernels="cpu")``) for the Llama-style families; the same cells with
  ``kernels="cuda"`` equal the CUDA-kernel trace (both sides say which set they used).
"""

from __future__ import annotations

import itertools

import pytest

from memfit.core.activations.analytic import estimate_activation_bytes
from memfit.core.activations.kernels import cpu_sdpa
from memfit.core.catalog import source_from_config
from memfit.core.families.attention import resolve
from memfit.core.peft.spec import PeftSpec
from memfit.core.shapes import build_model_shape
from tests.installed_stack import TRANSFORMERS_LINE

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from tests.trace.test_family_activations import CONFIGS  # noqa: E402

TOLERANCE = 0.005
"""The README's claim (within 0.5% of traces). Worst observed -0.001% (8 B of 735,944 B and more:
the 0-d scalars the trace holds) on every cell below, with either kernel set."""

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def _choice(q, k, v, **kw) -> str:
    from torch.nn.attention import SDPBackend

    return {"FLASH_ATTENTION": "flash", "MATH": "math"}[SDPBackend(torch._fused_sdp_choice(q, k, v, **kw)).name]


SDPA_GRID = list(itertools.product(("fp32", "bf16", "fp16"), (4, 2), (False, True), (0.0, 0.1), (8, 7, 300),
                                   (False, True)))
"""dtype, key heads (of 4 query heads: 2 is grouped, called with ``enable_gqa``), a bool mask, dropout,
head width, a value width differing from q's."""


@pytest.mark.parametrize(("dtype", "kv", "masked", "dropout", "d", "other_dv"), SDPA_GRID)
def test_cpu_sdpa_choice_matches_torchs_dispatch(dtype, kv, masked, dropout, d, other_dv):
    b, heads, s = 2, 4, 16
    dt = _DTYPES[dtype]
    dv = d + 8 if other_dv else d
    q = torch.zeros(b, heads, s, d, dtype=dt)
    k = torch.zeros(b, kv, s, d, dtype=dt)
    v = torch.zeros(b, kv, s, dv, dtype=dt)
    kw = {"dropout_p": dropout, "enable_gqa": kv != heads}
    if masked:
        kw["attn_mask"] = torch.ones(b, 1, s, s, dtype=torch.bool).tril()
    got = cpu_sdpa(K=dt.itemsize, b=b, heads=heads, kv_heads=kv, d_qk=d, d_v=dv, s=s, skv=s, masked=masked,
                   repeat=False, enable_gqa=kv != heads, dropout=dropout, bias=None)
    assert got.kind == _choice(q, k, v, **kw)


@pytest.mark.parametrize(("dtype", "kv", "masked"), list(itertools.product(("fp32", "bf16"), (4, 2), (False, True))))
def test_cpu_flash_saves_what_the_model_counts(dtype, kv, masked):
    b, heads, s, d = 2, 4, 16, 8
    dt = _DTYPES[dtype]
    q = torch.randn(b, heads, s, d, dtype=dt, requires_grad=True)
    k = torch.randn(b, kv, s, d, dtype=dt, requires_grad=True)
    v = torch.randn(b, kv, s, d, dtype=dt, requires_grad=True)
    mask = torch.ones(b, 1, s, s, dtype=torch.bool).tril() if masked else None
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=not masked,
                                                           enable_gqa=kv != heads)
    node = out.grad_fn
    assert type(node).__name__ == "ScaledDotProductFlashAttentionForCpuBackward0"
    saved = {n: getattr(node, n) for n in dir(node) if n.startswith("_saved_")}
    extra = sum(t.numel() * t.element_size() for n, t in saved.items()
                if isinstance(t, torch.Tensor) and n not in ("_saved_query", "_saved_key", "_saved_value", "_saved_output"))
    assert saved["_saved_key"].shape == k.shape  # grouped heads unrepeated
    got = cpu_sdpa(K=dt.itemsize, b=b, heads=heads, kv_heads=kv, d_qk=d, d_v=d, s=s, skv=s, masked=masked,
                   repeat=False, enable_gqa=kv != heads, dropout=0.0, bias=None)
    assert (got.kind, got.kernel) == ("flash", extra)


CELLS = [("llama", "fp32", "full"), ("llama", "bf16", "full"), ("llama", "amp-bf16", "full"), ("qwen3", "fp32", "full"),
         ("phi3", "fp32", "full"), ("llama", "bf16", "lora"), ("mistral", "bf16", "full"), ("gemma2", "fp32", "full")]
FAST = {("llama", "fp32", "full"), ("llama", "bf16", "lora")}


@pytest.mark.parametrize("kernels", ["cpu", "cuda"])
@pytest.mark.parametrize(("name", "prec", "method"),
                         [pytest.param(*c, marks=[] if c in FAST else [pytest.mark.slow]) for c in CELLS])
def test_analytic_kernel_set_matches_the_trace(name, prec, method, kernels):
    from memfit.trace.results import TraceOptions
    from memfit.trace.step import trace_training_step

    config = CONFIGS[name]
    shape = build_model_shape(source_from_config(config), transformers_line=TRANSFORMERS_LINE)
    attention = resolve(config["model_type"], None)
    spec = PeftSpec(method=method, **({"target_modules": ("q_proj", "v_proj")} if method == "lora" else {}))
    dtype, autocast = {"fp32": ("fp32", None), "bf16": ("bf16", None), "amp-bf16": ("fp32", "bf16")}[prec]
    traced = trace_training_step(config, spec, TraceOptions(
        seq_len=48, micro_batch=1, dtype=dtype, autocast=autocast, attention=attention, granularity_bytes=1,
        kernels=kernels)).activation_bytes
    model = estimate_activation_bytes(shape.arch, spec, seq_len=48, micro_batch=1, dtype_bytes=4 if dtype == "fp32" else 2,
                                      compute_bytes=2 if autocast else None, attention=attention,
                                      kernels=kernels).total_bytes
    err = (model - traced) / traced
    print(f"{name} {prec} {method}: trace ({kernels} kernels) {traced:,} B, analytic ({kernels} kernels) {model:,} B "
          f"{err:+.3%}")
    assert abs(err) <= TOLERANCE, f"{err:+.3%}"
