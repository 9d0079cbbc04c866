"""The optimizers people use outside DeepSpeed, named as the Trainer's ``optim`` strings, reduced to
what they allocate: the state tensors each trained parameter gets at the first ``step()`` and the
temporaries a ``step()`` makes.

Each is read from the code it mirrors (torch 2.13, transformers 5.24, bitsandbytes 0.50.2):

- ``adamw_torch``/``adamw_torch_fused``: ``torch.optim.AdamW`` (``transformers/trainer_optimizer.py:
  _get_adamw_torch``; fused adds ``fused=True``). ``Adam._init_group``: per param ``step`` (a 0-d fp32
  tensor on the *host* unless fused or capturable, then on the param's device), ``exp_avg`` and
  ``exp_avg_sq`` (``torch.zeros_like(p)``: the param's dtype, so a bf16 model has bf16 states).
  ``foreach`` is torch's default where every param is on CUDA (``optimizer.py:
  _default_to_fused_or_foreach``; never on CPU): ``adam.py:_multi_tensor_adam`` allocates
  ``exp_avg_sq_sqrt = torch._foreach_sqrt(exp_avg_sqs)``, one tensor per param of the group, all
  alive until the group's update is done. The single-tensor path (``_single_tensor_adam``) makes
  ``denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)`` per param: two param-sized
  tensors at once, and the previous param's ``denom`` is still bound while the next is computed.
  Fused: one kernel, no temporaries.
- ``adamw_hf``: transformers' own ``AdamW`` (``transformers/optimization.py:AdamW``, the Trainer's
  default until 4.31; read in 4.26.0): ``state["step"] = 0`` (a Python int, no tensor),
  ``exp_avg``/``exp_avg_sq`` ``torch.zeros_like(p)``; ``step`` per param: ``denom =
  exp_avg_sq.sqrt().add_(eps)`` (one param-sized tensor, the previous param's still bound while it
  is made), then in-place updates.
- torch's ``foreach`` default: torch 1.10-1.13 ``adamw.py:adamw`` turns ``foreach=None`` into
  False (single tensor); torch 2.0 added ``optimizer.py:_default_to_fused_or_foreach`` (foreach
  where every param is on CUDA): ``resolve_optimizer`` follows the stack's torch.
- ``sgd``: ``torch.optim.SGD`` (``_get_sgd``): ``momentum_buffer = grad.clone()`` at the first step
  when momentum != 0, nothing otherwise; weight decay != 0 adds a grad-sized copy
  (``grad.add(param, alpha=wd)``: per param, or the whole group under foreach).
- ``adafactor``: ``transformers.optimization.Adafactor`` (``scale_parameter=False,
  relative_step=False``, ``beta1=None``): factored ``exp_avg_sq_row`` (shape[:-1]) and
  ``exp_avg_sq_col`` (shape[:-2] + shape[-1:]) for params of 2+ dims, ``exp_avg_sq`` (param shape)
  for 1-D params, ``exp_avg`` only with ``beta1``; states in the gradient's dtype after
  ``grad.float()``, so fp32; ``RMS``, a 0-d fp32 tensor made later in the same ``step`` (``step`` is a
  Python int). ``step`` per param: ``grad**2`` then ``+ eps`` (two fp32 param-sized
  tensors at once), the factored estimate ``torch.mul(r_factor, c_factor)`` while the old ``update``
  is alive, ``-update`` for the final ``add_``; 16-bit params add ``grad.float()`` and
  ``p.float()`` copies. The previous param's ``update`` stays bound until the next one is made.
- ``adamw_bnb_8bit`` (alias ``adamw_8bit``), ``paged_adamw_8bit``, ``paged_adamw_32bit``,
  ``lion_32bit``, ``lion_8bit``, ``paged_lion_*``: ``bitsandbytes.optim.AdamW``/``Lion``
  (``_get_bitsandbytes_optimizer``: ``optim_bits`` 8 or 32, ``is_paged``). ``optimizer.py:
  Optimizer2State.init_state`` (AdamW) / ``Optimizer1State.init_state`` (Lion): 8-bit states are
  ``uint8`` (1 B per element) with an fp32 ``absmax`` per block of 256 (``blocks = ceil(n/256)``)
  and a shared 256-entry fp32 quantization map per state on the device (``name2qmap``, created on
  the host in ``__init__`` by ``fill_qmap``); params with fewer than ``min_8bit_size`` = 4096
  elements keep fp32 states. Paged states (``get_state_buffer``: ``is_paged`` and ``numel >= 1e5``)
  come from ``F.get_paged`` (``cudaMallocManaged``): unified memory outside torch's caching
  allocator, resident on the GPU while there is room and evicted to host RAM by the driver when the
  GPU runs short. The CUDA kernels (``optimizer_update_8bit_blockwise``, ``_32bit``) update in
  place: no temporaries. On the CPU bitsandbytes runs a pure-torch reference
  (``backends/cpu/ops.py``) with fp32 temporaries the CUDA kernels do not have; paged falls back to
  ordinary tensors there.
- ``adagrad``: ``torch.optim.Adagrad``: ``sum`` (param-sized, the param's dtype) and a host ``step``.
"""

from __future__ import annotations

import math

from memfit.core.lean_dataclass import dataclass
from memfit.core.frameworks.pytorch import TorchSettings

BNB_BLOCKSIZE = 256
"""bitsandbytes/optim/optimizer.py: ``blocksize = 256`` for the 8-bit blockwise states."""
BNB_MIN_8BIT_SIZE = 4096
"""bitsandbytes/optim/optimizer.py: ``min_8bit_size=4096`` (smaller params keep fp32 states)."""
BNB_PAGED_MIN_NUMEL = 100_000
"""bitsandbytes/optim/optimizer.py:get_state_buffer: ``p.numel() < 1e5`` is never paged."""
BNB_QMAP_BYTES = 256 * 4
"""``F.create_dynamic_map``: 256 fp32 entries."""

TORCH = "torch 2.13"
BNB = "bitsandbytes 0.50.2"
TF = "transformers 5.24"


@dataclass(frozen=True, slots=True, kw_only=True)
class OptimizerModel:
    """One optimizer as memfit models it."""

    optim: str
    """The Trainer ``optim`` string."""
    family: str
    """``adamw``, ``sgd``, ``adafactor``, ``lion`` or ``adagrad``."""
    impl: str
    """``foreach``, ``single`` or ``fused`` (torch), ``bnb`` (bitsandbytes), ``adafactor``."""
    state_bits: int = 32
    """bitsandbytes: 8 or 32."""
    paged: bool = False
    momentum: float = 0.0
    beta1: float | None = None
    weight_decay: float = 0.0
    label: str
    source: str

    @property
    def bnb(self) -> bool:
        return self.impl == "bnb"


def resolve_optimizer(ts: TorchSettings, accelerator: str, torch_line: str = "2.13") -> OptimizerModel:
    """The optimizer ``ts.optim`` builds, as it runs on ``accelerator`` (``cuda`` or ``cpu``) under the
    stack's torch release line (``foreach=None`` defaults to foreach on CUDA from torch 2.0)."""
    name = ts.optim
    wd = ts.weight_decay
    foreach_default = accelerator == "cuda" and int(torch_line.split(".")[0]) >= 2
    if name == "adamw_hf":
        return OptimizerModel(optim=name, family="adamw", impl="hf", weight_decay=wd,
                              label="transformers AdamW (adamw_hf)",
                              source="transformers/optimization.py:AdamW.step (transformers 4.26)")
    if name in ("adamw_torch", "adamw_torch_fused", "adamw_torch_foreach", "adamw_torch_single"):
        if name == "adamw_torch_fused":
            impl = "fused"
        elif name == "adamw_torch_foreach":
            impl = "foreach"
        elif name == "adamw_torch_single":
            impl = "single"
        else:  # foreach=None: torch's default for the params' device (and release)
            impl = "foreach" if foreach_default else "single"
        return OptimizerModel(optim=name, family="adamw", impl=impl, weight_decay=wd,
                              label=f"torch.optim.AdamW ({impl})",
                              source=f"torch/optim/adam.py:_{'fused' if impl == 'fused' else 'multi_tensor' if impl == 'foreach' else 'single_tensor'}_adam ({TORCH})")
    if name == "sgd":
        impl = "foreach" if foreach_default else "single"
        return OptimizerModel(optim=name, family="sgd", impl=impl, momentum=ts.momentum, weight_decay=wd,
                              label=f"torch.optim.SGD (momentum {ts.momentum:g}, {impl})",
                              source=f"torch/optim/sgd.py:_{'multi' if impl == 'foreach' else 'single'}_tensor_sgd ({TORCH})")
    if name == "adagrad":
        impl = "foreach" if foreach_default else "single"
        return OptimizerModel(optim=name, family="adagrad", impl=impl, weight_decay=wd,
                              label=f"torch.optim.Adagrad ({impl})", source=f"torch/optim/adagrad.py ({TORCH})")
    if name == "adafactor":
        return OptimizerModel(optim=name, family="adafactor", impl="adafactor", beta1=ts.beta1, weight_decay=wd,
                              label="transformers Adafactor (scale_parameter=False, relative_step=False)",
                              source=f"transformers/optimization.py:Adafactor.step ({TF})")
    bits = 8 if "8bit" in name else 32
    paged = name.startswith("paged")
    family = "lion" if "lion" in name else "adamw"
    cls = "Lion" if family == "lion" else "AdamW"
    return OptimizerModel(optim=name, family=family, impl="bnb", state_bits=bits, paged=paged, weight_decay=wd,
                          label=f"bitsandbytes.optim.{cls}(optim_bits={bits}{', is_paged=True' if paged else ''})",
                          source=f"bitsandbytes/optim/optimizer.py:Optimizer{'1' if family == 'lion' else '2'}State.init_state ({BNB})")


@dataclass(frozen=True, slots=True)
class StateTensor:
    """One tensor of a param's optimizer state."""

    name: str
    nbytes: int
    where: str
    """``device`` (the param's device), ``host`` (a host tensor whatever the param's device) or
    ``paged`` (bitsandbytes unified memory)."""


def _prod(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


def param_states(opt: OptimizerModel, shape: tuple[int, ...], elem_bytes: int, accelerator: str
                 ) -> tuple[StateTensor, ...]:
    """The state tensors one trained param of ``shape`` (stored with ``elem_bytes`` per element) gets
    at its first ``step()``, in the order the code creates them."""
    n = _prod(shape)
    if opt.family == "adamw" and not opt.bnb:
        moments = (StateTensor("exp_avg", n * elem_bytes, "device"), StateTensor("exp_avg_sq", n * elem_bytes, "device"))
        if opt.impl == "hf":  # transformers' AdamW: state["step"] is a Python int
            return moments
        step_where = "device" if opt.impl == "fused" else "host"
        return (StateTensor("step", 4, step_where),) + moments
    if opt.family == "sgd":
        return (StateTensor("momentum_buffer", n * elem_bytes, "device"),) if opt.momentum else ()
    if opt.family == "adagrad":
        return (StateTensor("step", 4, "host"), StateTensor("sum", n * elem_bytes, "device"))
    if opt.family == "adafactor":
        out = []
        if opt.beta1 is not None:
            out.append(StateTensor("exp_avg", n * 4, "device"))
        if len(shape) >= 2:
            out.append(StateTensor("exp_avg_sq_row", _prod(shape[:-1]) * 4, "device"))
            out.append(StateTensor("exp_avg_sq_col", _prod(shape[:-2] + shape[-1:]) * 4, "device"))
        else:
            out.append(StateTensor("exp_avg_sq", n * 4, "device"))
        out.append(StateTensor("RMS", 4, "device"))  # state["RMS"] = self._rms(p_data_fp32): a 0-d fp32
        return tuple(out)
    # bitsandbytes
    two = opt.family == "adamw"
    eight = opt.state_bits == 8 and n >= BNB_MIN_8BIT_SIZE
    paged = opt.paged and accelerator == "cuda" and n >= BNB_PAGED_MIN_NUMEL
    where = "paged" if paged else "device"
    if not eight:
        s = (StateTensor("state1", n * 4, where),)
        return s + ((StateTensor("state2", n * 4, where),) if two else ())
    blocks = -(-n // BNB_BLOCKSIZE)
    if two:
        return (StateTensor("state1", n, where), StateTensor("state2", n, where),
                StateTensor("absmax1", blocks * 4, "device"), StateTensor("absmax2", blocks * 4, "device"))
    return (StateTensor("state1", n, where), StateTensor("absmax1", blocks * 4, "device"))


def qmaps(opt: OptimizerModel) -> int:
    """bitsandbytes 8-bit: quantization maps created by ``fill_qmap`` in ``__init__`` (both the signed
    and unsigned map, on the host) and moved to the device by the first 8-bit ``init_state``: one for
    Lion (``dynamic``), two for AdamW (``dynamic``, ``udynamic``)."""
    if not (opt.bnb and opt.state_bits == 8):
        return 0
    return 1 if opt.family == "lion" else 2


def state_bytes(opt: OptimizerModel, shape: tuple[int, ...], elem_bytes: int, accelerator: str) -> int:
    return sum(s.nbytes for s in param_states(opt, shape, elem_bytes, accelerator))
