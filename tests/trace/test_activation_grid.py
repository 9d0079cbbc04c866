"""The standing grid (issue 26): the analytic activations against the executed code of the same step.

Every family of ``test_family_activations.CONFIGS`` (small configs of the real shapes: hidden 64, 4
heads, 3 layers, vocabulary 1000) crossed with the precision modes (fp32; AMP bf16 and fp16: an fp32
model under ``torch.autocast``; pure bf16 and fp16) and the PEFT methods memfit plans (full, LoRA on
peft's default targets, prefix and prompt tuning), plus eager attention, gradient checkpointing and
encoder-decoders with short (4) and long (80) targets. Each cell traces one training step on fake
tensors (``memfit.trace.step.trace_training_step``: transformers' and peft's own code) and compares
the activations alive at the end of the forward with ``estimate_activation_bytes`` of the ArchSpec
the pure builder makes from the same config.

Kernel sets: both sides model the CUDA kernels. The trace runs ``trace/cuda_kernels.py``
(``cuda_like_kernels``): sdpa's backend choice (flash / memory-efficient / math, with the tensors
each saves), LayerNorm's fp32 statistics, and ``torch.autocast`` with CUDA's op lists and its cast
cache of leaf weights (``autocast_region``); the analytic side counts the same kernels' saved tensors
(``core/activations``). The cast cache's weight copies are parameter casts, not activations, on both
sides. The fused cross-entropy of some stacks is not on the grid (transformers 5.24 runs
``ForCausalLMLoss``: ``logits.float()`` then ``cross_entropy``; both sides model that).

Cells the analytic model does not reach are listed in ``OFF`` with their reason (strict xfail: a fix
makes them fail until they move to the grid), cells transformers itself cannot run in ``CANNOT_RUN``.
"""

from __future__ import annotations

import pytest

from memfit.core.activations.analytic import estimate_activation_bytes
from memfit.core.catalog import source_from_config
from memfit.core.families.attention import resolve
from memfit.core.peft.spec import PeftSpec
from memfit.core.shapes import build_model_shape

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from tests.trace.test_family_activations import CONFIGS  # noqa: E402

TOLERANCE = 0.005
"""The README's claim (within 0.5% of traces on the test grid). Worst observed on the passing cells:
+0.46% (umT5 short target 4 with checkpointing: +348 B of 76,148 B, the decoder's held inputs at 4
tokens); every other cell within +-0.09% (T5 LoRA +0.03%, T5 prompt +0.04%)."""

PRECISIONS = {  # name: (model dtype, autocast dtype)
    "fp32": ("fp32", None),
    "amp-bf16": ("fp32", "bf16"),
    "amp-fp16": ("fp32", "fp16"),
    "bf16": ("bf16", None),
    "fp16": ("fp16", None),
}

LORA_TARGETS = {
    "phi3": ("qkv_proj",), "deepseek_v3": ("q_a_proj", "kv_a_proj_with_mqa"), "t5": ("q", "v"), "mt5": ("q", "v"),
    "umt5": ("q", "v"), "gpt_neox": ("query_key_value",), "falcon-7b-style": ("query_key_value",),
    "falcon-40b-style": ("query_key_value",), "bert": ("query", "value"), "roberta": ("query", "value"),
    "deberta-v2": ("query_proj", "value_proj"),
}
"""peft's default LoRA targets per family (``TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING``),
written out so the trace's peft and the analytic side get the same modules."""

ENCODER_DECODERS = ("t5", "mt5", "umt5")

_MOE = ("mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v3")
_GROUPED_MM = ("the trace cannot run it: transformers 5.24's MoE experts call torch._grouped_mm, which the CPU build "
               "of torch 2.13 takes in bf16 only ('Expected inputs of BF16 type'); memfit plans it, unchecked here")
CANNOT_RUN = {
    **{f"{n}-{p}-full": _GROUPED_MM for n in _MOE for p in ("fp32", "amp-bf16")},
    **{f"mixtral-{p}": _GROUPED_MM for p in ("amp-fp16-full", "fp16-full", "amp-bf16-lora", "amp-bf16-prefix",
                                              "amp-bf16-prompt", "fp32-lora")},
    **{f"{n}-bf16-prefix": "transformers 5.24's T5 attention cannot take peft 0.21's prefix cache (the forward raises "
       "'Sizes of tensors must match' in the cross-attention's cat)" for n in ENCODER_DECODERS},
    "t5-amp-bf16-prefix": "as t5-bf16-prefix (transformers 5.24's T5 attention and peft 0.21's prefix cache)",
    **{f"{n}-bf16-prefix": "the model's own forward fails with peft 0.21's prefix cache ('Sizes of tensors must match': "
       "a cache of one key head per layer against the model's heads)" for n in ("deepseek_v3", "falcon-7b-style")},
    **{f"deberta-v2-{p}-prefix": "DeBERTa-v2 ignores peft's past_key_values: nothing trains ('element 0 of tensors does "
       "not require grad')" for p in ("bf16", "amp-bf16")},
    **{f"{n}-{p}-prompt": "peft 0.21 prepends the virtual tokens to a masked LM's inputs but not to its labels: the "
       "model's loss raises 'Expected input batch_size (68) to match target batch_size (48)'"
       for n in ("bert", "roberta", "deberta-v2") for p in ("bf16", "amp-bf16")},
}
"""Cells transformers/peft (or the CPU trace) cannot run, by test id: skipped with the reason."""

OFF = {
    "llama-fp32-lora": "+1.668%: the LoRA q/k terms the frozen fp32 path drops (test_family_activations' "
                       "LORA_TOLERANCE names the same term in bf16 at +1.39%)",
    "qwen3-fp32-lora": "+1.560%: as llama-fp32-lora, plus its frozen q/k-norms",
    "t5-fp16-full": "-5.722%: not located yet; lead: pure fp16 T5 (T5LayerFF's clamp of fp16 hidden states and its isinf checks keep "
                    "tensors the analytic side does not count)",
    "t5-amp-bf16-full-attentioneager-b2": "-7.385%: not located yet; lead: eager T5Attention under AMP (fp32 scores from the fp32 position "
                                          "bias, softmax's copies) not modelled",
    "t5-bf16-lora-attentioneager-b2": "+7.362%: not located yet; lead: eager T5 with LoRA: the frozen path keeps less than the analytic "
                                      "scores and dropout terms",
    "mt5-amp-bf16-full-gcTrue": "+2.922%: not located yet; lead: checkpointed mT5 under AMP: the held inputs counted in the compute dtype",
    "mt5-bf16-lora-gcTrue": "-4.254%: not located yet; lead: checkpointed mT5 with LoRA: the recompute's frozen-path terms",
    "umt5-bf16-lora-gcTrue": "-5.047%: not located yet; lead: as mt5-bf16-lora-gcTrue",
    **{f"bert-{p}-full-b2-task{t}": f"{e}: not located yet; lead: BERT's classification heads under AMP (the pooler/classifier's "
       "autocast copies and the head's fp32 dropout counted per Linear)"
       for p in ("amp-bf16", "amp-fp16")
       for t, e in (("sequence-classification", "+3.554%"), ("token-classification", "+1.748%"),
                    ("question-answering", "+1.757%"))},
    **{f"roberta-{p}-full-b2-tasksequence-classification": f"{e}: not located yet; lead: RobertaClassificationHead (dropout, dense, tanh, "
       "dropout, out_proj on the first token) counted as BERT's pooler over every token"
       for p, e in (("fp32", "+2.286%"), ("bf16", "+2.153%"), ("amp-bf16", "+3.475%"), ("amp-fp16", "+3.475%"))},
    **{f"gpt_neox-{p}-full-b2-tasktoken-classification": "+15.107%: not located yet; lead: GPT-NeoX's token classifier under AMP (no "
       "cache; the fp32 rotary q/k the analytic side keeps for the cache)" for p in ("amp-bf16", "amp-fp16")},
    **{f"falcon-7b-style-{p}-full-b2-tasktoken-classification": "+1.262%: Falcon-7B's multi-query math kernel "
       "without a cache under AMP keeps fp32 copies of k and v the analytic side does not place yet"
       for p in ("amp-bf16", "amp-fp16")},
    **{f"t5-{p}-full-b2-tasktoken-classification": "+1.128%: not located yet; lead: T5's encoder-only token classifier under AMP (the "
       "final norm's output copy counted once more)" for p in ("amp-bf16", "amp-fp16")},
}
"""Cells the analytic model does not reach yet, by test id: the measured error and what is off (strict
xfail: a fix makes the cell pass and the xfail fail, until it leaves this list). The reasons after the
colon are the leads read off the traces, not all confirmed."""


def _cells() -> list[tuple[str, str, str, dict]]:
    cells = []
    for name in CONFIGS:
        for prec in ("fp32", "amp-bf16", "bf16"):  # full fine-tuning
            cells.append((name, prec, "full", {}))
        for method in ("lora", "prefix", "prompt"):  # every PEFT method in pure bf16
            cells.append((name, "bf16", method, {}))
    for name in ("llama", "gemma2", "qwen3", "mixtral", "gpt_neox", "falcon-40b-style", "bert", "deberta-v2", "t5"):
        cells += [(name, "amp-fp16", "full", {}), (name, "fp16", "full", {})]
        cells += [(name, "amp-bf16", method, {}) for method in ("lora", "prefix", "prompt")]
        cells.append((name, "fp32", "lora", {}))
    for name in ("llama", "gemma2", "gpt_neox", "bert", "t5"):
        cells += [(name, prec, "full", {"attention": "eager", "b": 2}) for prec in ("fp32", "amp-bf16")]
        cells.append((name, "bf16", "lora", {"attention": "eager", "b": 2}))
    for name in ("llama", "falcon-40b-style", "bert", "mt5", "umt5"):
        cells += [(name, prec, "full", {"gc": True}) for prec in ("fp32", "amp-bf16")]
        cells.append((name, "bf16", "lora", {"gc": True}))
    for name in ENCODER_DECODERS:
        for target in (4, 80):
            cells += [(name, prec, "full", {"target": target}) for prec in ("fp32", "amp-bf16", "bf16")]
            cells.append((name, "fp32", "lora", {"target": target, "b": 2}))
        cells.append((name, "bf16", "full", {"target": 4, "gc": True}))
    for name, task in (("bert", "sequence-classification"), ("bert", "token-classification"),
                       ("bert", "question-answering"), ("roberta", "sequence-classification"),
                       ("gpt_neox", "token-classification"), ("falcon-7b-style", "token-classification"),
                       ("llama", "sequence-classification"), ("t5", "token-classification")):
        cells += [(name, prec, "full", {"task": task, "b": 2}) for prec in ("fp32", "amp-bf16", "amp-fp16", "bf16")]
    return cells


FAST = {("llama", "amp-bf16", "full"), ("gpt_neox", "amp-bf16", "full"), ("bert", "amp-fp16", "full"),
        ("t5", "fp32", "lora"), ("llama", "bf16", "prompt"), ("qwen3", "bf16", "prefix"), ("falcon-7b-style", "fp32", "full")}
"""A CI-sized slice (one cell per axis the issue names), the rest are marked slow (``-m 'not slow'`` leaves them out)."""


def _id(cell) -> str:
    name, prec, method, kw = cell
    return "-".join([name, prec, method] + [f"{k}{v}" for k, v in sorted(kw.items())])


def _marks(cell):
    name, prec, method, kw = cell
    cid = _id(cell)
    if cid in CANNOT_RUN:
        return [pytest.mark.skip(reason=CANNOT_RUN[cid])]
    marks = [pytest.mark.xfail(strict=True, reason=OFF[cid])] if cid in OFF else []
    return marks + ([] if (name, prec, method) in FAST and not kw else [pytest.mark.slow])


CELLS = [pytest.param(*cell, id=_id(cell), marks=_marks(cell)) for cell in _cells()]


def compare(name: str, prec: str, method: str, *, b: int = 1, seq: int = 48, attention: str | None = None,
            gc: bool = False, task: str | None = None, target: int | None = None) -> float:
    from memfit.trace.results import TraceOptions
    from memfit.trace.step import trace_training_step

    config = CONFIGS[name]
    shape = build_model_shape(source_from_config(config), task=task)
    attention = attention or resolve(config["model_type"], None)
    spec = PeftSpec(method=method, **({"target_modules": LORA_TARGETS.get(name, ("q_proj", "v_proj"))}
                                      if method == "lora" else {}))
    dtype, autocast = PRECISIONS[prec]
    traced = trace_training_step(config, spec, TraceOptions(
        seq_len=seq, micro_batch=b, dtype=dtype, autocast=autocast, attention=attention, gradient_checkpointing=gc,
        granularity_bytes=1, task=task, target_len=target)).activation_bytes
    model = estimate_activation_bytes(shape.arch, spec, seq_len=seq, micro_batch=b,
                                      dtype_bytes=4 if dtype == "fp32" else 2,
                                      compute_bytes=2 if autocast else None, gradient_checkpointing=gc,
                                      attention=attention, target_len=target)
    err = (model.total_bytes - traced) / traced
    print(f"{name:17s} {prec:8s} {method:6s} {attention:6s} b={b} task={shape.arch.task} ckpt={gc} target={target}"
          f" trace (CUDA kernels) {traced:>10,} B analytic (CUDA kernels) {model.total_bytes:>10,} B {err:+.3%}")
    return err


@pytest.mark.parametrize(("name", "prec", "method", "kw"), CELLS)
def test_analytic_activations_match_the_trace(name, prec, method, kw):
    err = compare(name, prec, method, **kw)
    assert abs(err) <= TOLERANCE, f"{err:+.3%}"
