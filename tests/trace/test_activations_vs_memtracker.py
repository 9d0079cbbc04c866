"""The analytic activations against torch's own tracker (issue 26's independent reference).

``torch.distributed._tools.mem_tracker.MemTracker`` runs the model's real transformers/peft code
under FakeTensorMode and counts every tensor it sees by kind. What a forward leaves alive (its
current total after the forward, less its total before: the batch and the parameters cancel) is
what ``estimate_activation_bytes`` counts: the tensors saved for backward and the outputs (logits,
loss, cache). Small configs of the real shapes (``test_family_activations.CONFIGS``), full
fine-tuning and LoRA, fp32 and pure bf16.

Kernel sets: the step runs under ``memfit.trace.cuda_kernels.cuda_like_kernels`` (CUDA's sdpa
backends and their saved tensors, LayerNorm's fp32 statistics), which the analytic side models. AMP
is left to test_activation_grid.py: the tracker files autocast's cached weight copies with the
activations, which memfit counts as parameter casts.

The tracker's two limits are worked around here, not in memfit: it registers a gradient hook on
every parameter and a frozen one refuses it (so on any PEFT model): hooks go on trainable ones only;
``Module.to_empty`` under FakeTensorMode fails on peft models: parameters are made fake by
``memfit.trace.model_build.materialize_fake`` instead.
"""

from __future__ import annotations

import pytest

from memfit.core.activations.analytic import estimate_activation_bytes
from memfit.core.catalog import source_from_config
from memfit.core.families.attention import resolve
from memfit.core.peft.spec import PeftSpec
from memfit.core.shapes import build_model_shape
from tests.installed_stack import TRANSFORMERS_LINE

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from tests.trace.test_activation_grid import LORA_TARGETS  # noqa: E402
from tests.trace.test_family_activations import CONFIGS  # noqa: E402

TOLERANCE = 0.005
"""The README's claim. Worst observed: Falcon-40B-style LoRA -0.012%, the rest within -0.001% (T5 LoRA fp32
-8 B of 1,935,320 B; +376 B, +0.019%, before issue 26's decoder_input_ids saved only when the embedding trains). The tracker's forward bytes equal memfit's own trace's on every cell
(both see the same fake tensors); fp32 LoRA on Llama is +1.668% against both (memfit.core.activations.unreached.OFF_KINDS)."""


def _forward_bytes(config: dict, spec: PeftSpec, *, dtype: str, seq: int, b: int, attention: str, task=None) -> int:
    from torch._subclasses.fake_tensor import FakeTensorMode

    from memfit.trace.cuda_kernels import cuda_like_kernels
    from memfit.trace.model_build import TORCH_DTYPES, apply_peft, build_meta_model, materialize_fake
    from memfit.trace.results import TraceOptions
    from memfit.trace.step import quiet_libraries, task_inputs, unpacked_sequences

    from memfit.trace.memtracker import PeftMemTracker

    def total(snapshot) -> int:
        return sum(d.get("Total", 0) for d in snapshot.values())

    with quiet_libraries():
        model = apply_peft(build_meta_model(config, attention=attention, task=task), spec)
        model.train()
        fm = FakeTensorMode()
        materialize_fake(model, fm, TORCH_DTYPES[dtype] if dtype != "fp32" else None)
        with fm:
            inputs = task_inputs(model, TraceOptions(seq_len=seq, micro_batch=b, dtype=dtype, task=task))
            mt = PeftMemTracker()
            mt.track_external(model, *inputs.values())
            with unpacked_sequences(True), cuda_like_kernels(True), mt:
                before = total(mt.get_tracker_snapshot())
                out = model(**inputs)
                after = total(mt.get_tracker_snapshot())
                del out
    return after - before


CELLS = [("llama", "bf16", "full"), ("llama", "bf16", "lora"), ("gpt_neox", "bf16", "full"), ("bert", "fp32", "full"),
         ("bert", "bf16", "lora"), ("t5", "fp32", "lora"), ("mt5", "bf16", "full"), ("falcon-40b-style", "bf16", "lora")]


@pytest.mark.slow
@pytest.mark.parametrize(("name", "dtype", "method"), CELLS, ids=["-".join(c) for c in CELLS])
def test_analytic_activations_match_torch_memtracker(name, dtype, method):
    config = CONFIGS[name]
    attention = resolve(config["model_type"], None)
    spec = PeftSpec(method=method, **({"target_modules": LORA_TARGETS.get(name, ("q_proj", "v_proj"))}
                                      if method == "lora" else {}))
    theirs = _forward_bytes(config, spec, dtype=dtype, seq=48, b=1, attention=attention)
    arch = build_model_shape(source_from_config(config), transformers_line=TRANSFORMERS_LINE).arch
    ours = estimate_activation_bytes(arch, spec, seq_len=48, micro_batch=1, dtype_bytes=4 if dtype == "fp32" else 2,
                                     attention=attention).total_bytes
    err = (ours - theirs) / theirs
    print(f"{name:17s} {dtype} {method:5s} MemTracker (CUDA kernels) {theirs:>10,} B "
          f"analytic (CUDA kernels) {ours:>10,} B {err:+.3%}")
    assert abs(err) <= TOLERANCE, f"{err:+.3%}"
