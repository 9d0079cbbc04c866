"""``parse_deepspeed_config`` against DeepSpeed 0.19.8 and transformers themselves.

- Every fixture and variant is read by memfit and by ``deepspeed.runtime.config.DeepSpeedConfig``
  (CPU accelerator, a fake process group of the case's world size), and every memfit field is
  compared with what DeepSpeed reports: ZeRO fields, offload sections, fp16/bf16, dtypes, the batch
  triple, gradient clipping, the optimizer.
- memfit's field tables (names, ``stage3_`` aliases, defaults, nullability, bounds) equal
  DeepSpeed's pydantic models.
- Every config memfit refuses is refused by DeepSpeed too: by ``DeepSpeedConfig``, or later by the
  engine method that would refuse it (called on a stand-in engine that only reads the config), or
  is listed as a place where memfit is stricter, and then DeepSpeed is shown to accept it.
- ``"auto"`` is filled as transformers' ``HfTrainerDeepSpeedConfig.trainer_config_process`` and
  ``trainer_config_finalize`` fill it, mismatches included.
- Optimizer state counts equal the state tensors real ``torch.optim`` optimizers create, and those
  DeepSpeed's own optimizers allocate (read from their installed source).
"""

from __future__ import annotations

import copy
import dataclasses
import importlib.util
import json
import math
import os
import re
import sys
import types
from pathlib import Path

import pytest

os.environ.setdefault("DS_ACCELERATOR", "cpu")
torch = pytest.importorskip("torch")
deepspeed = pytest.importorskip("deepspeed")
transformers = pytest.importorskip("transformers")

import torch.distributed as tdist  # noqa: E402
from deepspeed.runtime.config import DeepSpeedConfig, DtypeEnum  # noqa: E402
from deepspeed.runtime.engine import DeepSpeedEngine  # noqa: E402
from torch.testing._internal.distributed.fake_pg import FakeStore  # noqa: E402

from memfit.core import dsconfig  # noqa: E402
from memfit.core.dsconfig import (  # noqa: E402
    AutoContext,
    optimizer_states_per_param,
    parse_deepspeed_config,
    resolve_auto,
)
from memfit.core.frameworks.deepspeed import Bf16Settings, Fp16Settings, OffloadSettings, ZeroSettings  # noqa: E402
from memfit.errors import MemfitError  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore")]

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "deepspeed"
TORCH_DTYPE = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
TRAINER = AutoContext(micro_batch_size=4, gradient_accumulation_steps=2, world_size=2, learning_rate=3e-5,
                      adam_betas=(0.9, 0.98), adam_epsilon=1e-6, weight_decay=0.01, warmup_steps=0.1,
                      total_steps=1000, precision="bf16", max_grad_norm=0.5, hidden_size=4096)


def _cases(name: str) -> dict:
    return {k: v for k, v in json.loads((FIXTURES / name).read_text()).items() if not k.startswith("_")}


def _file_cases() -> dict:
    out = {}
    for p in sorted(FIXTURES.glob("*.json")):
        if p.name in ("variants.json", "rejected.json"):
            continue
        ctx = TRAINER if "auto" in p.name else AutoContext(world_size=2)
        out[p.name] = (json.loads(p.read_text()), ctx)
    for name, case in _cases("variants.json").items():
        out[name] = (case["config"], AutoContext(world_size=case["world_size"], hidden_size=case.get("hidden_size")))
    return out


FILE_CASES = _file_cases()


# ---------------------------------------------------------------- DeepSpeed's side


@pytest.fixture(scope="module")
def ds_comm():
    """deepspeed.comm over torch's fake process group (no collective ever runs)."""
    import deepspeed.comm as dist

    ds_comm_state = importlib.import_module("deepspeed.comm.comm")
    ds_torch = importlib.import_module("deepspeed.comm.torch")  # the module, not deepspeed.comm's `torch`

    if tdist.is_initialized():
        pytest.skip("a process group is already initialized in this process")
    mp = pytest.MonkeyPatch()
    # TorchBackend compiles a shared-memory all-reduce op on CPU (minutes on a fresh machine); the
    # config code never uses it.
    mp.setattr(ds_torch, "build_shm_op", lambda: None)
    tdist.init_process_group("fake", store=FakeStore(), rank=0, world_size=1)
    dist.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
    yield
    tdist.destroy_process_group()
    ds_comm_state.cdb = None
    mp.undo()


def deepspeed_config(config: dict, world_size: int) -> DeepSpeedConfig:
    """DeepSpeed's own reading of ``config`` in a job of ``world_size`` data-parallel ranks."""
    tdist.destroy_process_group()
    tdist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    return DeepSpeedConfig(copy.deepcopy(config))


class EngineView:
    """``DeepSpeedEngine``'s own methods over a ``DeepSpeedConfig``, without building an engine:
    any attribute not set here is the engine's method (or property) bound to this object."""

    def __init__(self, config: DeepSpeedConfig) -> None:
        self._config = config
        self.client_optimizer = None
        self.zenflow = False
        self.module = torch.nn.Linear(2, 2)
        self.global_rank = 0
        self.pipeline_parallelism = False
        self.has_moe_layers = False

    def __getattr__(self, name):
        attr = getattr(DeepSpeedEngine, name)
        if isinstance(attr, property):
            return attr.fget(self)
        return types.MethodType(attr, self)


def _offload_fields(model, settings: OffloadSettings) -> None:
    for name, value in model.model_dump().items():
        if name in {f.name for f in dataclasses.fields(OffloadSettings)}:
            expected = None if value is None else (str(value) if name == "nvme_path" else value)
            assert getattr(settings, name) == expected, name


def assert_same(ds, c: DeepSpeedConfig) -> None:
    """Every memfit setting equals what DeepSpeed's config object reports."""
    from deepspeed.runtime.zero.offload_config import (
        DeepSpeedZeroOffloadOptimizerConfig,
        DeepSpeedZeroOffloadParamConfig,
    )

    z = c.zero_config
    for f in dataclasses.fields(ZeroSettings):
        if f.name not in ("offload_optimizer", "offload_param"):
            assert getattr(ds.zero, f.name) == getattr(z, f.name), f.name
    for ours, theirs, default in ((ds.zero.offload_param, z.offload_param, DeepSpeedZeroOffloadParamConfig()),
                                  (ds.zero.offload_optimizer, z.offload_optimizer,
                                   DeepSpeedZeroOffloadOptimizerConfig())):
        _offload_fields(theirs if theirs is not None else default, ours)
    assert ds.precision == ("fp16" if c.float16_config.enabled else "bf16" if c.bfloat16_config.enabled else "fp32")
    for f in dataclasses.fields(Fp16Settings):
        assert getattr(ds.fp16, f.name) == getattr(c.float16_config, f.name), f.name
    for f in dataclasses.fields(Bf16Settings):
        assert getattr(ds.bf16, f.name) == getattr(c.bfloat16_config, f.name), f.name
    for ours, theirs in ((ds.grad_accum_dtype, c.grad_accum_dtype), (ds.param_dtype, c.param_dtype)):
        assert (ours is None and theirs is None) or TORCH_DTYPE[ours] == DtypeEnum(theirs).value
    assert (None if ds.communication_data_type is None else TORCH_DTYPE[ds.communication_data_type]) \
        == c.communication_data_type
    assert (ds.train_batch_size, ds.train_micro_batch_size_per_gpu, ds.gradient_accumulation_steps) == \
        (c.train_batch_size, c.train_micro_batch_size_per_gpu, c.gradient_accumulation_steps)
    assert ds.world_size == c.world_size
    assert ds.gradient_clipping == c.gradient_clipping
    assert ds.optimizer.in_config == (c.optimizer_name is not None)
    if c.optimizer_name is not None:
        assert ds.optimizer.type == c.optimizer_name.lower()
    assert ds.zero_allow_untested_optimizer == c.zero_allow_untested_optimizer
    assert ds.scheduler_type == c.scheduler_name


@pytest.mark.parametrize("name", list(FILE_CASES))
def test_settings_equal_what_deepspeed_reports(ds_comm, name):
    raw, ctx = FILE_CASES[name]
    resolved = resolve_auto(raw, ctx)
    ds = parse_deepspeed_config(raw, context=ctx)
    assert_same(ds, deepspeed_config(resolved, ctx.world_size))


def test_the_seed_config_as_deepspeed_reads_it(ds_comm):
    """The seed's verbatim config on its two RTX 3090s: named fields, for the record."""
    raw = json.loads((FIXTURES / "seed_kogpt_zero3_offload.json").read_text())
    ds = parse_deepspeed_config(raw, context=AutoContext(world_size=2))
    c = deepspeed_config(raw, 2)
    assert_same(ds, c)
    z = c.zero_config
    assert (z.stage, z.overlap_comm, z.offload_param.device, z.offload_optimizer.pin_memory) == (3, True, "cpu", True)
    assert (ds.zero.prefetch_bucket_size, ds.zero.param_persistence_threshold) == (z.prefetch_bucket_size,
                                                                                   z.param_persistence_threshold)
    assert ds.zero.gather_16bit_weights_on_model_save is z.gather_16bit_weights_on_model_save is True


# ---------------------------------------------------------------- the field tables


def _bounds(field) -> dict:
    out = {}
    for m in field.metadata:
        for key in ("gt", "ge", "le"):
            if getattr(m, key, None) is not None:
                out[key] = getattr(m, key)
    return out


@pytest.mark.parametrize("table,model_path", [
    ("ZERO_FIELDS", "deepspeed.runtime.zero.config.DeepSpeedZeroConfig"),
    ("OFFLOAD_PARAM_FIELDS", "deepspeed.runtime.zero.offload_config.DeepSpeedZeroOffloadParamConfig"),
    ("OFFLOAD_OPTIMIZER_FIELDS", "deepspeed.runtime.zero.offload_config.DeepSpeedZeroOffloadOptimizerConfig"),
    ("FP16_FIELDS", "deepspeed.runtime.precision_config.DeepSpeedFP16Config"),
    ("BF16_FIELDS", "deepspeed.runtime.precision_config.DeepSpeedBF16Config"),
])
def test_field_tables_equal_deepspeeds_models(table, model_path):
    module, cls = model_path.rsplit(".", 1)
    model = getattr(importlib.import_module(module), cls)
    ours = {f.name: f for f in getattr(dsconfig, table)}
    assert set(ours) == set(model.model_fields)
    for name, theirs in model.model_fields.items():
        f = ours[name]
        assert f.alias == theirs.alias, name
        if f.kind != "opaque":
            default = theirs.get_default(call_default_factory=True)
            assert f.default == default, name
        assert f.nullable == (type(None) in getattr(theirs.annotation, "__args__", ())), name
        bounds = _bounds(theirs)
        if (table, name) == ("FP16_FIELDS", "loss_scale"):
            bounds = {"ge": 0.0}  # DeepSpeedFP16Config._validate_loss_scale (case fp16_negative_loss_scale)
        assert {k: v for k, v in (("gt", f.gt), ("ge", f.ge), ("le", f.le)) if v is not None} == bounds, name


def test_deprecated_zero_keys_and_targets_equal_deepspeeds():
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    theirs = []
    for name, field in DeepSpeedZeroConfig.model_fields.items():
        extra = field.json_schema_extra or {}
        if extra.get("deprecated"):
            target = extra.get("new_param") if extra.get("set_new_param", True) else None
            theirs.append((name, target))
    assert tuple(theirs) == dsconfig.ZERO_DEPRECATED


def test_removed_keys_and_optimizer_lists_equal_deepspeeds():
    from deepspeed.runtime import config as ds_config
    from deepspeed.runtime.zero.utils import ZERO_SUPPORTED_OPTIMIZERS

    assert dsconfig.REMOVED_TOP_LEVEL_KEYS == set(ds_config._REMOVED_TOP_LEVEL_CONFIG_KEYS)
    assert dsconfig.REMOVED_ZERO_KEYS == set(ds_config._REMOVED_ZERO_CONFIG_KEYS)
    assert dsconfig.DEEPSPEED_OPTIMIZERS == tuple(ds_config.DEEPSPEED_OPTIMIZERS)
    supported = {cls.__name__ for cls in ZERO_SUPPORTED_OPTIMIZERS}
    assert supported >= {"Adam", "AdamW", "Adagrad", "FusedAdam", "DeepSpeedCPUAdam", "DeepSpeedCPUAdagrad",
                         "DeepSpeedCPULion", "FusedLion"}
    assert not supported & {"SGD", "FusedLamb", "RMSprop"}
    assert all(hasattr(torch.optim, n) for n in dsconfig.TORCH_OPTIMIZERS)


# ---------------------------------------------------------------- refusals


REJECTED = _cases("rejected.json")


def _engine_refuses(check: str, c: DeepSpeedConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run the engine code that refuses this config; it must raise."""
    view = EngineView(c)
    p = [torch.nn.Parameter(torch.zeros(4))]
    if check == "legacy_stage1":
        view._configure_zero_optimizer(None)
    elif check == "zero_untested_optimizer":
        # is_zero_supported_optimizer first imports Muon, whose kernels take seconds to compile; a
        # stand-in class keeps the check itself (type(optimizer) in ZERO_SUPPORTED_OPTIMIZERS) intact.
        from deepspeed.runtime.zero import utils as zero_utils

        monkeypatch.setattr(zero_utils, "ZERO_SUPPORTED_OPTIMIZERS", list(zero_utils.ZERO_SUPPORTED_OPTIMIZERS))
        monkeypatch.setitem(sys.modules, "deepspeed.runtime.zero.muon.muon_optimizer",
                            types.SimpleNamespace(MuonWithAuxAdam=type("MuonWithAuxAdam", (), {})))
        if c.optimizer_name == "lamb":
            from deepspeed.ops.lamb import FusedLamb  # building it needs CUDA; only its type is checked
            optimizer = FusedLamb.__new__(FusedLamb)
        else:
            optimizer = getattr(torch.optim, c.optimizer_name)(p, **c.optimizer_params)
        view._do_optimizer_sanity_check(optimizer)
    elif check in ("torch_optim_lookup", "max_grad_norm", "fused_adam_amsgrad"):
        view._configure_basic_optimizer(p)
    elif check == "grad_accum_mix":
        view._do_optimizer_sanity_check(None)
    else:  # pragma: no cover
        raise AssertionError(f"unknown engine check {check}")


@pytest.mark.parametrize("name", list(REJECTED))
def test_refusals_match_deepspeed(ds_comm, monkeypatch, name):
    case = REJECTED[name]
    world = case.get("world_size", 1)
    with pytest.raises(MemfitError, match=re.escape(case["match"])):
        parse_deepspeed_config(case["config"], context=AutoContext(world_size=world))
    if case["deepspeed"] == "config":
        with pytest.raises(Exception):
            deepspeed_config(case["config"], world)
        return
    c = deepspeed_config(case["config"], world)  # DeepSpeedConfig accepts it
    if case["deepspeed"] == "engine":
        with pytest.raises(Exception):
            _engine_refuses(case["engine_check"], c, monkeypatch)
    else:
        assert case["deepspeed"] == "accepts" and case["why"]


# ---------------------------------------------------------------- "auto", against transformers


def _trainer_args(ctx: AutoContext) -> types.SimpleNamespace:
    """The ``TrainingArguments`` fields ``HfTrainerDeepSpeedConfig`` reads, from an AutoContext."""
    from transformers import TrainingArguments

    args = types.SimpleNamespace(
        world_size=ctx.world_size, per_device_train_batch_size=ctx.micro_batch_size,
        gradient_accumulation_steps=ctx.gradient_accumulation_steps, max_grad_norm=ctx.max_grad_norm,
        learning_rate=ctx.learning_rate, adam_beta1=ctx.adam_betas[0], adam_beta2=ctx.adam_betas[1],
        adam_epsilon=ctx.adam_epsilon, weight_decay=ctx.weight_decay, save_on_each_node=False,
        fp16=ctx.precision == "fp16", fp16_full_eval=False, bf16=ctx.precision == "bf16", bf16_full_eval=False,
        warmup_steps=ctx.warmup_steps)
    args.get_warmup_steps = types.MethodType(TrainingArguments.get_warmup_steps, args)
    return args


def transformers_resolution(raw: dict, ctx: AutoContext) -> dict:
    """What transformers' Trainer hands DeepSpeed, ``"auto"`` left in pydantic sections dropped
    (as DeepSpeedConfigModel drops them)."""
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig, unset_hf_deepspeed_config

    hf = HfTrainerDeepSpeedConfig(copy.deepcopy(raw))
    try:
        hf.trainer_config_process(_trainer_args(ctx))
        model = types.SimpleNamespace(config=types.SimpleNamespace(hidden_size=ctx.hidden_size))
        hf.trainer_config_finalize(_trainer_args(ctx), model, ctx.total_steps)
        return _drop_auto(hf.config)
    finally:
        unset_hf_deepspeed_config()


def _drop_auto(node):
    if isinstance(node, dict):
        return {k: _drop_auto(v) for k, v in node.items() if v != "auto"}
    return node


AUTO_CONFIGS = {
    "hf_fixture": json.loads((FIXTURES / "zero3_hf_trainer_auto.json").read_text()),
    "stage2_hidden_keys": {"train_micro_batch_size_per_gpu": "auto", "train_batch_size": "auto",
                           "gradient_accumulation_steps": 2, "fp16": {"enabled": "auto"},
                           "zero_optimization": {"stage": 2, "reduce_bucket_size": "auto",
                                                 "stage3_prefetch_bucket_size": "auto"}},
    "unprefixed_alias": {"train_micro_batch_size_per_gpu": 4, "zero_optimization": {
        "stage": 3, "prefetch_bucket_size": "auto", "stage3_param_persistence_threshold": "auto",
        "offload_param": {"device": "auto"}}},
    "warmup_ratio_zero": {"train_micro_batch_size_per_gpu": 4, "gradient_clipping": 0.5,
                          "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": "auto"}}},
}
CONTEXTS = {"trainer": TRAINER, "fp16_small": dataclasses.replace(TRAINER, precision="fp16", hidden_size=768,
                                                                    warmup_steps=0.0, world_size=8),
            "steps": dataclasses.replace(TRAINER, warmup_steps=250, precision="fp32", hidden_size=5)}


@pytest.mark.parametrize("ctx_name", list(CONTEXTS))
@pytest.mark.parametrize("name", list(AUTO_CONFIGS))
def test_auto_is_filled_as_transformers_fills_it(name, ctx_name):
    raw, ctx = AUTO_CONFIGS[name], CONTEXTS[ctx_name]
    assert resolve_auto(raw, ctx) == transformers_resolution(raw, ctx)


def test_trainer_mismatches_are_refused_by_both():
    raw = {**AUTO_CONFIGS["hf_fixture"], "train_micro_batch_size_per_gpu": 8, "gradient_clipping": 2.0}
    with pytest.raises(ValueError, match="mismatch TrainingArguments"):
        transformers_resolution(raw, TRAINER)
    with pytest.raises(MemfitError, match="train_micro_batch_size_per_gpu=8 vs --micro-batch 4"):
        resolve_auto(raw, TRAINER)


def test_missing_hidden_size_is_refused_by_both():
    raw = AUTO_CONFIGS["hf_fixture"]
    with pytest.raises(ValueError, match="hidden_size"):
        transformers_resolution(raw, dataclasses.replace(TRAINER, hidden_size=None))
    with pytest.raises(MemfitError, match="--model"):
        resolve_auto(raw, dataclasses.replace(TRAINER, hidden_size=None))


# ---------------------------------------------------------------- optimizer states


TORCH_CASES = [("SGD", {"lr": 0.1}), ("SGD", {"lr": 0.1, "momentum": 0.9}), ("RMSprop", {}),
               ("RMSprop", {"momentum": 0.9, "centered": True}), ("RMSprop", {"centered": True}),
               ("Adamax", {}), ("NAdam", {}), ("RAdam", {}), ("Adadelta", {}), ("Rprop", {}), ("ASGD", {}),
               ("SparseAdam", {}), ("Adagrad", {}), ("Adam", {}), ("AdamW", {"amsgrad": True})]


@pytest.mark.parametrize("name,params", TORCH_CASES, ids=[f"{n}-{p}" for n, p in TORCH_CASES])
def test_state_counts_equal_torch_optimizers(name, params):
    p = torch.nn.Parameter(torch.randn(6, 5))
    opt = getattr(torch.optim, name)([p], **params)
    p.grad = torch.randn(6, 5).to_sparse() if name == "SparseAdam" else torch.randn(6, 5)
    opt.step()
    real = sum(1 for v in opt.state[p].values() if torch.is_tensor(v) and v.numel() == p.numel())
    assert optimizer_states_per_param(name.lower(), params) == real


@pytest.mark.parametrize("module,kind,cpu", [
    ("deepspeed.ops.adam.fused_adam", "adam", False), ("deepspeed.ops.adam.cpu_adam", "adam", True),
    ("deepspeed.ops.lamb.fused_lamb", "lamb", False), ("deepspeed.ops.adagrad.cpu_adagrad", "adagrad", True),
    ("deepspeed.ops.lion.fused_lion", "lion", False), ("deepspeed.ops.lion.cpu_lion", "lion", True)])
def test_state_counts_equal_deepspeed_optimizers(module, kind, cpu):
    """DeepSpeed's own optimizers need compiled kernels (CUDA for the fused ones), so their state
    tensors are read from their installed source: ``state['name'] = torch.zeros_like(...)``."""
    source = Path(importlib.util.find_spec(module).origin).read_text()
    names = set(re.findall(r"state\[['\"](\w+)['\"]\]\s*=\s*torch\.zeros_like", source))
    assert optimizer_states_per_param(kind, {}, cpu_optimizer=cpu) == len(names)


def test_cpu_optimizer_choice_follows_deepspeeds_rule(ds_comm):
    """DeepSpeed builds the CPU optimizer whenever offload_optimizer.device is cpu or nvme."""
    for device, expected in (("cpu", True), ("nvme", True), ("none", False)):
        cfg = {"train_micro_batch_size_per_gpu": 1,
               "zero_optimization": {"stage": 2, "offload_optimizer": {"device": device, "nvme_path": "/x"}}}
        assert EngineView(deepspeed_config(cfg, 1)).zero_use_cpu_optimizer() is expected
        assert (parse_deepspeed_config(cfg).zero.offload_optimizer.device in ("cpu", "nvme")) is expected


def test_warmup_rounding_matches_transformers():
    from transformers import TrainingArguments

    args = types.SimpleNamespace(warmup_steps=0.07)
    assert dsconfig._trainer_warmup_steps(None, AutoContext(warmup_steps=0.07, total_steps=333)) == max(
        1, TrainingArguments.get_warmup_steps(args, 333)) == max(1, math.ceil(333 * 0.07))


def test_zero_settings_defaults_equal_deepspeeds():
    """``ZeroSettings()`` (what memfit assumes when nothing was read, e.g. in the recommender) against
    a default ``DeepSpeedZeroConfig()``; the parse path's own defaults are checked above."""
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    ours, theirs = ZeroSettings(), DeepSpeedZeroConfig()
    for f in dataclasses.fields(ZeroSettings):
        if f.name not in ("offload_optimizer", "offload_param"):
            assert getattr(ours, f.name) == getattr(theirs, f.name), f.name
