"""The optimizer recipes (``memfit.core.ledger.pytorch.optim``) against the real optimizers on this CPU.

Each case builds parameters of mixed shapes (2-D, 1-D, a 3-D one for Adafactor's factored states),
gives them gradients, constructs the optimizer exactly as the Trainer does
(``Trainer.get_optimizer_cls_and_kwargs(TrainingArguments(optim=...))``; a plain
``torch.optim.AdamW(foreach=True)`` for the foreach path, which torch never picks on CPU) and runs
two ``step()`` calls under torch's own allocation tracking (torch.profiler memory events, the
replays' ``HostTracker``). The ledger's simulation of the same steps must give:

- the state bytes: equal to the optimizer's own ``state`` tensors (unique storages), byte for byte;
- the live bytes at the end of each step: equal;
- the peak during each step: equal within ``SCALAR_SLACK_BYTES``.

``SCALAR_SLACK_BYTES``: torch's AdamW step makes a few 0-d fp64/fp32 scalars (observed: an 8-byte and
a 4-byte one alive together, 12 B) that the ledger does not list; the bound is 2x that, rounded up.
bitsandbytes runs its CPU backend here (``backends/cpu/ops.py``: fp32 temporaries the CUDA kernels do
not have); the ledger models it for ``accelerator='cpu'``, and the CUDA kernels (no temporaries)
otherwise.
"""

from __future__ import annotations

import math

import pytest

from memfit.core.frameworks.pytorch import TorchSettings
from memfit.core.ledger.timeline import Timeline
from memfit.core.ledger.pytorch.optim import declare_optimizer, record_optimizer_step, trainer_groups
from memfit.core.ledger.pytorch.params import TParam
from memfit.core.optimizers import resolve_optimizer

torch = pytest.importorskip("torch")

SCALAR_SLACK_BYTES = 24
"""The step's 0-d scalars the ledger does not list (AdamW: an 8-byte and a 4-byte one alive together):
observed 12 B; 2x that (module docstring)."""
SHAPES = [(300, 64), (64,), (128, 300), (128,), (50, 7), (3, 20, 30)]
CASES = [
    ("adamw_torch", "fp32", {}), ("adamw_torch", "bf16", {}), ("adamw_torch_fused", "fp32", {}),
    ("adamw_torch_fused", "bf16", {}), ("adamw_torch_foreach", "fp32", {}), ("adamw_torch_foreach", "bf16", {}),
    ("sgd", "fp32", {}), ("sgd", "fp32", {"momentum": 0.9}), ("sgd", "bf16", {"momentum": 0.9, "weight_decay": 0.1}),
    ("adafactor", "fp32", {}), ("adafactor", "bf16", {}), ("adafactor", "fp32", {"beta1": 0.9}),
    ("adamw_bnb_8bit", "fp32", {}), ("adamw_bnb_8bit", "bf16", {}), ("paged_adamw_8bit", "fp32", {}),
    ("paged_adamw_32bit", "bf16", {}), ("lion_32bit", "fp32", {}), ("lion_8bit", "bf16", {}),
]


def _real_optimizer(optim: str, params, kw: dict):
    if optim == "adamw_torch_foreach":
        return torch.optim.AdamW(params, foreach=True)
    from transformers import Trainer, TrainingArguments

    args = {"weight_decay": kw["weight_decay"]} if "weight_decay" in kw else {}
    optim_args = ",".join(f"{k}={v}" for k, v in kw.items() if k in ("momentum", "beta1"))
    targs = TrainingArguments(output_dir="unused", optim=optim, report_to=[], use_cpu=True,
                              optim_args=optim_args or None, **args)
    cls, kwargs = Trainer.get_optimizer_cls_and_kwargs(targs)
    if optim == "adafactor" and "beta1" in kw:
        kwargs["beta1"] = kw["beta1"]
    wd = kw.get("weight_decay", 0.0)
    return cls([{"params": params, "weight_decay": wd}], **kwargs)


def _measure_real(optim: str, dtype: str, kw: dict):
    from memfit.replay.host_tracker import HostTracker

    torch.manual_seed(0)
    td = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
    params = [torch.nn.Parameter(torch.randn(s, dtype=td)) for s in SHAPES]
    for p in params:
        p.grad = torch.randn_like(p)
    opt = _real_optimizer(optim, params, kw)
    tracker = HostTracker()
    tracker.start()
    for _ in range(2):
        tracker.mark()
        opt.step()
    tracker.mark()
    result = tracker.stop()
    seen, state = set(), 0
    for st in opt.state.values():
        for v in st.values():
            if torch.is_tensor(v) and v.untyped_storage().data_ptr() not in seen:
                seen.add(v.untyped_storage().data_ptr())
                state += v.untyped_storage().nbytes()
    # bitsandbytes' shared quantization maps are in the state dicts too: count them once, as seen
    w = result.windows
    return [(w[i].host_peak_bytes - w[i].host_live_start_bytes, w[i].host_live_end_bytes - w[i].host_live_start_bytes)
            for i in range(2)], state


def _ledger(optim: str, dtype: str, kw: dict):
    ts = TorchSettings(optim=optim, momentum=kw.get("momentum", 0.0), beta1=kw.get("beta1"),
                       weight_decay=kw.get("weight_decay", 0.0))
    opt = resolve_optimizer(ts, "cpu")
    params = [TParam(name=f"layers.0.p{i}.weight", shape=s, numel=math.prod(s), trainable=True, adapter=False,
                     load_dtype=dtype, dtype=dtype, stage=1, linear=False, decay=True) for i, s in enumerate(SHAPES)]
    t = Timeline(ranks_per_node=1, accelerator="cpu")
    declare_optimizer(t, opt, len(params), 0)
    out = []
    for step in range(2):
        t.phase(f"step{step}", "")
        base = sum(t._dev_live.values())
        seen = [base]
        observe = t._observe

        def spy(observe=observe, seen=seen):
            observe()
            seen.append(sum(t._dev_live.values()))

        t._observe = spy
        record_optimizer_step(t, opt, trainer_groups(params, split=False), first=step == 0, accelerator="cpu",
                              grad_bytes=lambda p: p.numel * p.elem_bytes)
        t._observe = observe
        out.append((max(seen) - base, sum(t._dev_live.values()) - base))
    state = sum(t.live_bytes(k) for k in ("optimizer.states", "optimizer.step_counters", "optimizer.paged_states",
                                          "optimizer.qmaps"))
    return out, state


@pytest.mark.parametrize("optim,dtype,kw", CASES, ids=[f"{o}-{d}-{'-'.join(k)}" for o, d, k in CASES])
def test_optimizer_step_allocations_match_torch(optim, dtype, kw):
    if "bnb" in optim or "paged" in optim or "lion" in optim:
        pytest.importorskip("bitsandbytes")
    real, real_state = _measure_real(optim, dtype, kw)
    led, led_state = _ledger(optim, dtype, kw)
    qmap_bytes = 0
    if "8bit" in optim:  # name2qmap maps sit in the state dicts; on the CPU they stay where fill_qmap made them
        qmap_bytes = (1 if "lion" in optim else 2) * 1024
    assert led_state == real_state - qmap_bytes, (led_state, real_state)
    for step, ((rp, re), (lp, le)) in enumerate(zip(real, led)):
        assert le == re, f"step {step + 1}: live at the end: ledger {le} vs torch {re}"
        assert 0 <= rp - lp <= SCALAR_SLACK_BYTES, f"step {step + 1}: peak: ledger {lp} vs torch {rp}"


def test_trainer_weight_decay_groups_match_the_trainer():
    """``is_decay`` against ``Trainer.get_decay_parameter_names`` on real (meta) models."""
    transformers = pytest.importorskip("transformers")
    from memfit.core.catalog import resolve_model_config
    from memfit.core.ledger.pytorch.params import is_decay

    for name in ("gpt2", "meta-llama/Meta-Llama-3-8B", "facebook/opt-1.3b", "EleutherAI/gpt-j-6b",
                 "bigscience/bloom-7b1", "bert-large-uncased"):
        cfg = resolve_model_config(name).config_dict()
        cfg = {**cfg, "num_hidden_layers": 1, "n_layer": 1}
        config = transformers.AutoConfig.for_model(**cfg)
        cls = getattr(transformers, cfg["architectures"][0])
        with torch.device("meta"):
            model = cls(config)
        want = set(transformers.Trainer.get_decay_parameter_names(None, model))
        for n, _ in model.named_parameters():
            assert is_decay(n) == (n in want), (name, n)
