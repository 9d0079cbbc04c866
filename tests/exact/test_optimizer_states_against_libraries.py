"""Every optimizer memfit names, as the library creates its state: tensor by tensor.

For each ``optim`` string in ``memfit.core.frameworks.pytorch.OPTIMIZERS`` the real optimizer is built
the way the Trainer builds it (``Trainer.get_optimizer_cls_and_kwargs(TrainingArguments(optim=...))``;
torch's AdamW with ``foreach=True``/``False`` for memfit's ``adamw_torch_foreach``/``_single``, which
are not Trainer strings) on parameters of every shape class the rules tell apart:

- 1-D, 2-D and 3-D (Adafactor factors params of 2+ dims: ``exp_avg_sq_row``/``_col``);
- below and above bitsandbytes' ``min_8bit_size`` (4096 elements: smaller params keep fp32 states);
- above the 1e5 elements bitsandbytes pages (``get_state_buffer``; on this CPU paged falls back to
  ordinary tensors, as memfit's ``accelerator='cpu'`` says);

in fp32 and bf16, takes one ``step()``, and compares each state tensor the library made (its name,
and its storage's bytes and bytes per element) with ``memfit.core.optimizers.param_states`` for the
same shape. The per-param comparison is exact: no tolerance. The shared 8-bit quantization maps
(``qmap1``/``qmap2``, one storage per map for the whole optimizer) are compared with ``qmaps()``.

The ledger's optimizer recipe (``core/ledger/pytorch/optim.py``) allocates the states from
``param_states``; ``tests/replay/test_optimizers_vs_torch.py`` checks the whole step's allocations.
"""

from __future__ import annotations

import math

import pytest

from memfit.core.frameworks.pytorch import OPTIMIZERS, TorchSettings
from memfit.core.optimizers import BNB_QMAP_BYTES, param_states, qmaps, resolve_optimizer

torch = pytest.importorskip("torch")

SHAPES = {
    "1-D": (64,),
    "2-D below min_8bit_size": (50, 7),
    "2-D above min_8bit_size": (300, 64),
    "3-D below min_8bit_size": (3, 20, 30),
    "3-D above min_8bit_size": (4, 40, 50),
    "2-D above the paging threshold": (400, 300),
}
MIN_8BIT_SIZE = 4096
"""bitsandbytes' ``min_8bit_size`` default (checked against the installed library below)."""
PAGED_MIN_NUMEL = 100_000
"""bitsandbytes' ``get_state_buffer``: ``numel < 1e5`` is never paged."""


def test_the_shapes_straddle_the_librarys_thresholds():
    bnb = pytest.importorskip("bitsandbytes")
    import inspect

    assert inspect.signature(bnb.optim.AdamW).parameters["min_8bit_size"].default == MIN_8BIT_SIZE
    assert math.prod(SHAPES["2-D below min_8bit_size"]) < MIN_8BIT_SIZE <= math.prod(SHAPES["2-D above min_8bit_size"])
    assert math.prod(SHAPES["3-D below min_8bit_size"]) < MIN_8BIT_SIZE <= math.prod(SHAPES["3-D above min_8bit_size"])
    assert math.prod(SHAPES["2-D above the paging threshold"]) >= PAGED_MIN_NUMEL
VARIANTS = {"sgd": [{}, {"momentum": 0.9}], "adafactor": [{}, {"beta1": 0.9}]}
NOT_BUILDABLE = {"adamw_hf": "transformers' own AdamW (the Trainer's default up to 4.31) is gone from the installed "
                             "transformers 5.24, so it cannot be built here; its states are read from 4.26's source "
                             "(core/optimizers.py: exp_avg, exp_avg_sq zeros_like(p), step a Python int)"}
"""Optimizers memfit names that the installed libraries cannot build, with the reason."""
CASES = [(o, d, kw) for o in OPTIMIZERS if o not in NOT_BUILDABLE for d in ("fp32", "bf16") for kw in VARIANTS.get(o, [{}])]


def _real(optim: str, params, kw: dict):
    if optim in ("adamw_torch_foreach", "adamw_torch_single"):
        return torch.optim.AdamW(params, foreach=optim.endswith("foreach"))
    from transformers import Trainer, TrainingArguments

    optim_args = ",".join(f"{k}={v}" for k, v in kw.items() if k == "momentum")
    targs = TrainingArguments(output_dir="unused", optim=optim, report_to=[], use_cpu=True,
                              optim_args=optim_args or None)
    cls, kwargs = Trainer.get_optimizer_cls_and_kwargs(targs)
    if "beta1" in kw:
        kwargs["beta1"] = kw["beta1"]
    return cls(params, **kwargs)


def _library_states(optim: str, dtype: str, kw: dict):
    torch.manual_seed(0)
    td = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
    params = {k: torch.nn.Parameter(torch.randn(s, dtype=td)) for k, s in SHAPES.items()}
    for p in params.values():
        p.grad = torch.randn_like(p)
    opt = _real(optim, list(params.values()), kw)
    opt.step()
    per_param, qmap_storages = {}, {}
    for key, p in params.items():
        got = {}
        for name, v in opt.state[p].items():
            if not torch.is_tensor(v):
                continue  # a Python int step (Adafactor, bitsandbytes)
            st = v.untyped_storage()
            if name.startswith("qmap"):
                qmap_storages[st.data_ptr()] = st.nbytes()
                continue
            got[name] = (st.nbytes(), v.element_size())
        per_param[key] = got
    return per_param, sum(qmap_storages.values())


@pytest.mark.parametrize("optim,dtype,kw", CASES, ids=[f"{o}-{d}{'-' + '-'.join(k) if k else ''}" for o, d, k in CASES])
def test_each_state_tensor_matches_the_library(optim, dtype, kw):
    if "bnb" in optim or "8bit" in optim or "32bit" in optim:
        pytest.importorskip("bitsandbytes")
    lib, lib_qmaps = _library_states(optim, dtype, kw)
    opt = resolve_optimizer(TorchSettings(optim=optim, momentum=kw.get("momentum", 0.0), beta1=kw.get("beta1")), "cpu")
    elem = {"fp32": 4, "bf16": 2}[dtype]
    for key, shape in SHAPES.items():
        mine = {s.name: s.nbytes for s in param_states(opt, shape, elem, "cpu")}
        theirs = {name: nbytes for name, (nbytes, _) in lib[key].items()}
        assert mine == theirs, f"{key} {shape}: memfit {mine} vs the library {theirs}"
        for name, (nbytes, esize) in lib[key].items():  # bytes per element: the state's dtype
            numel = nbytes // esize
            assert mine[name] == numel * esize, (key, name)
    assert qmaps(opt) * BNB_QMAP_BYTES == lib_qmaps


def test_every_named_optimizer_is_compared():
    assert {o for o, _, _ in CASES} | set(NOT_BUILDABLE) == set(OPTIMIZERS)
