"""The ``optimizer`` section: which optimizer DeepSpeed builds and how many state tensors it keeps."""

from __future__ import annotations

from collections.abc import Mapping

from memfit.core.frameworks.deepspeed import OptimizerSettings, ZeroSettings
from memfit.core.dsconfig.validate import _as_bool, _as_float
from memfit.errors import MemfitError


# --------------------------------------------------------------------------------------------
# Optimizer
# --------------------------------------------------------------------------------------------

DEEPSPEED_OPTIMIZERS = ("adagrad", "adam", "adamw", "lamb", "muadam", "muadamw", "musgd", "lion", "muon")
"""Names DeepSpeed lower-cases and builds itself (``runtime/config.py: DEEPSPEED_OPTIMIZERS``);
any other ``type`` is looked up as ``getattr(torch.optim, type)``, case and all
(``engine.py: _configure_basic_optimizer``)."""

ZERO_TESTED_OPTIMIZERS = frozenset({"adam", "adamw", "muadam", "muadamw", "adagrad", "lion"})
"""Optimizers ZeRO accepts without ``zero_allow_untested_optimizer`` (``runtime/zero/utils.py:
ZERO_SUPPORTED_OPTIMIZERS``: torch Adam/AdamW (mup's MuAdam(W) return those), FusedAdam,
DeepSpeedCPUAdam, torch/CPU Adagrad, CPU/Fused Lion)."""

TORCH_OPTIMIZERS = ("SGD", "RMSprop", "Adamax", "NAdam", "RAdam", "Adadelta", "Rprop", "ASGD", "SparseAdam")
"""``torch.optim`` classes memfit models (reached by DeepSpeed's ``getattr(torch.optim, type)``)."""


def optimizer_states_per_param(kind: str, params: Mapping[str, object], *, cpu_optimizer: bool = False) -> int:
    """Tensors the optimizer keeps per trainable element (scalar ``step`` counters not counted).

    ``cpu_optimizer``: the optimizer is offloaded (``offload_optimizer.device`` cpu or nvme), so
    DeepSpeed builds its CPU variant (``engine.py: zero_use_cpu_optimizer``).

    Adam/AdamW (FusedAdam, DeepSpeedCPUAdam, torch): exp_avg, exp_avg_sq = 2, with torch's AMSGrad
    max_exp_avg_sq = 3; Lamb (FusedLamb): 2; Adagrad (torch ``sum``, DeepSpeedCPUAdagrad
    ``exp_avg_sq``): 1; Lion: FusedLion exp_avg = 1, but DeepSpeedCPULion allocates exp_avg and
    exp_avg_sq = 2 (``ops/lion/cpu_lion.py: step``); SGD/MuSGD: momentum_buffer if momentum != 0, else 0;
    RMSprop: square_avg + momentum_buffer (momentum > 0) + grad_avg (centered); Adamax: exp_avg,
    exp_inf; NAdam/RAdam: exp_avg, exp_avg_sq; Adadelta: square_avg, acc_delta; Rprop: prev,
    step_size; ASGD: ax; SparseAdam: exp_avg, exp_avg_sq.
    """
    if kind in ("adam", "adamw", "muadam", "muadamw"):
        return 3 if params.get("amsgrad") else 2
    if kind in ("lamb", "adamax", "nadam", "radam", "adadelta", "rprop", "sparseadam"):
        return 2
    if kind == "lion":
        return 2 if cpu_optimizer else 1
    if kind in ("adagrad", "asgd"):
        return 1
    if kind in ("sgd", "musgd"):
        return 1 if params.get("momentum", 0) else 0
    if kind == "rmsprop":
        return 1 + (1 if params.get("momentum", 0) else 0) + (1 if params.get("centered", False) else 0)
    raise MemfitError(f"optimizer {kind!r}: memfit does not know its state size")


def _freeze(value: object) -> object:
    """JSON lists and objects as tuples, so the settings stay hashable."""
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, Mapping):
        return tuple((k, _freeze(v)) for k, v in value.items())
    return value


def _read_optimizer(raw: dict, zero: ZeroSettings) -> OptimizerSettings:
    section = raw.get("optimizer")
    if section is None:
        return OptimizerSettings()
    if not isinstance(section, Mapping):
        raise MemfitError(f"DeepSpeed config optimizer must be an object, got {section!r}")
    name = section.get("type")
    params = section.get("params", {})
    if params is None:
        params = {}
    if not isinstance(params, Mapping):
        raise MemfitError(f"DeepSpeed config optimizer.params must be an object, got {params!r}")
    if name is None:  # get_optimizer_name: no type -> the client's optimizer
        return OptimizerSettings(params=_freeze(params))
    if not isinstance(name, str):
        raise MemfitError(f"DeepSpeed config optimizer.type must be a string, got {name!r}")
    if "max_grad_norm" in params:
        raise MemfitError("DeepSpeed config optimizer.params.max_grad_norm is refused by DeepSpeed; use the "
                          "top-level gradient_clipping")
    for key in ("momentum",):
        if key in params:
            _as_float(params[key], f"optimizer.params.{key}")
    if name.lower() in DEEPSPEED_OPTIMIZERS:
        kind = name.lower()
        if kind == "muon":
            raise MemfitError("DeepSpeed config optimizer Muon: memfit does not model its mixed Muon/Adam states yet")
    elif name in TORCH_OPTIMIZERS:
        kind = name.lower()
    elif name.lower() in (n.lower() for n in TORCH_OPTIMIZERS):
        right = next(n for n in TORCH_OPTIMIZERS if n.lower() == name.lower())
        raise MemfitError(f"DeepSpeed config optimizer.type {name!r}: DeepSpeed looks it up as torch.optim.{name}, "
                          f"which does not exist; write {right!r}")
    else:
        raise MemfitError(f"DeepSpeed config optimizer.type {name!r}: not one DeepSpeed 0.19.8 builds "
                          f"({', '.join(DEEPSPEED_OPTIMIZERS)}) nor a torch.optim class memfit models "
                          f"({', '.join(TORCH_OPTIMIZERS)})")
    adam_w_mode = params.get("adam_w_mode", True)
    torch_adam = params.get("torch_adam", False)
    if kind in ("adam", "adamw"):
        _as_bool(adam_w_mode, "optimizer.params.adam_w_mode")
        _as_bool(torch_adam, "optimizer.params.torch_adam")
        if params.get("amsgrad") and not torch_adam:
            raise MemfitError("DeepSpeed config optimizer.params.amsgrad: FusedAdam and DeepSpeedCPUAdam do not "
                              "support AMSGrad (set torch_adam true to use torch's Adam)")
    untested_ok = raw.get("zero_allow_untested_optimizer", False)
    if zero.stage > 0 and kind not in ZERO_TESTED_OPTIMIZERS and not untested_ok:
        raise MemfitError(f"DeepSpeed config optimizer {name!r} with ZeRO stage {zero.stage}: DeepSpeed refuses "
                          'an untested ZeRO optimizer unless "zero_allow_untested_optimizer": true')
    cpu = zero.offload_optimizer.device in ("cpu", "nvme")
    return OptimizerSettings(type=kind, states_per_param=optimizer_states_per_param(kind, params, cpu_optimizer=cpu),
                             params=_freeze(params), in_config=True,
                             adam_w_mode=(kind == "adamw" or bool(adam_w_mode)) if kind in ("adam", "adamw") else True,
                             torch_adam=bool(torch_adam) if kind in ("adam", "adamw") else False)
