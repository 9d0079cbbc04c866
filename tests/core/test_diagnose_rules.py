"""``memfit diagnose``'s rules: traceback frames and progress lines mapped to ledger phases, each rule
naming a real phase and a DeepSpeed function that exists in 0.19.8 (installed) or 0.5.10 (its sdist)."""

import importlib.util
from pathlib import Path

import pytest

from memfit.core.diagnose import PROGRESS, RULES, Frame, locate_phase
from memfit.core.ledger_types import PHASES


def _source_root(package: str) -> Path:
    spec = importlib.util.find_spec(package)  # locates, does not import
    return Path(spec.origin).parent.parent


def F(path, func, code=""):
    return Frame(path=f"/usr/lib/python3/site-packages/{path}", line=1, function=func, code=code)


def test_rules_name_real_phases_and_real_deepspeed_functions(ds0510):
    """Every phase a rule names is a ledger phase, and every DeepSpeed function it names exists in
    0.19.8 (installed) or 0.5.10 (its sdist, the ``ds0510`` fixture)."""
    phases = {r.phase for r in RULES if r.phase} | {r.zero3_phase for r in RULES if r.zero3_phase}
    phases |= {p for r in RULES for _, p, _ in r.code if p}
    assert phases <= set(PHASES)
    assert {p for _, p, _ in PROGRESS} <= set(PHASES)
    root = _source_root("deepspeed")
    assert (ds0510 / "deepspeed/runtime/engine.py").is_file()
    checked = 0
    for r in RULES:
        if not r.path.startswith("deepspeed/") or not r.path.endswith(".py"):
            continue
        src = (root / r.path).read_text()
        old = (ds0510 / r.path).read_text() if (ds0510 / r.path).exists() else ""
        for fn in r.functions:
            assert f"def {fn}(" in src or f"def {fn}(" in old, f"{r.path} has no function {fn} in 0.19.8 or 0.5.10"
            checked += 1
    assert checked >= 50


def test_partition_inside_forward_is_forward_and_zero_init_in_load_is_load():
    fwd = (F("deepspeed/runtime/engine.py", "forward", "loss = self.module(*inputs, **kwargs)"),
           F("transformers/models/gptj/modeling_gptj.py", "forward", "outputs = self.transformer("),
           F("deepspeed/runtime/zero/partition_parameters.py", "_partition_param", "partitioned_tensor = ..."))
    assert locate_phase(fwd)[0] == "forward"
    load = (F("transformers/modeling_utils.py", "from_pretrained", "model = cls(config)"),
            F("deepspeed/runtime/zero/partition_parameters.py", "_post_init_method", "param.partition()"))
    phase, reason, frame = locate_phase(load)
    assert phase == "load" and "innermost: _post_init_method" in reason


def test_init_time_optimizer_step_of_0510_stays_in_initialize():
    frames = (F("deepspeed/__init__.py", "initialize", "engine = DeepSpeedEngine(args=args,"),
              F("deepspeed/runtime/zero/stage3.py", "initialize_optimizer_states", "self._optimizer_step(i)"),
              F("deepspeed/runtime/zero/stage3.py", "_optimizer_step", "self.optimizer.step()"),
              F("deepspeed/ops/adam/cpu_adam.py", "step", "state['exp_avg'] = torch.zeros_like(p.data)"))
    assert locate_phase(frames)[0] == "initialize.optimizer"


@pytest.mark.parametrize("code, phase", [("self.module.half()", "initialize.cast"),
                                          ("self._cast_module_mixed_precision(param_dtype, buffer_dtype)", "initialize.cast"),
                                          ("self.module.to(self.device)", "initialize.move"),
                                          ("self._broadcast_model()", "initialize.move")])
def test_configure_distributed_model_by_its_source_line(code, phase):
    frames = (F("deepspeed/runtime/engine.py", "__init__", "self._configure_distributed_model(model)"),
              F("deepspeed/runtime/engine.py", "_configure_distributed_model", code),
              F("torch/nn/modules/module.py", "_apply", "param_applied = fn(param)"))
    assert locate_phase(frames)[0] == phase


def test_checkpoint_recompute_is_backward_and_basic_optimizer_moves_under_zero3():
    frames = (F("deepspeed/runtime/engine.py", "backward", "loss.backward(**backward_kwargs)"),
              F("torch/utils/checkpoint.py", "backward", "outputs = ctx.run_function(*detached_inputs)"),
              F("transformers/models/llama/modeling_llama.py", "forward", "attn_output = self.o_proj(attn_output)"))
    assert locate_phase(frames)[0] == "backward"
    basic = (F("deepspeed/runtime/engine.py", "_configure_basic_optimizer", "optimizer = DeepSpeedCPUAdam("),)
    assert locate_phase(basic)[0] == "initialize.optimizer"
    assert locate_phase(basic, zero3=True)[0] == "initialize.partition"


def test_the_scripts_own_model_to_is_the_load_but_deepspeeds_is_the_move():
    mine = (F("train.py", "main", "model = model.to('cuda')"),
            F("torch/nn/modules/module.py", "to", "return self._apply(convert)"))
    assert locate_phase(mine)[0] == "load"
    ds = (F("deepspeed/runtime/engine.py", "_configure_distributed_model", "self.module.to(self.device)"),) + mine[1:]
    assert locate_phase(ds)[0] == "initialize.move"


def test_unknown_frames_give_no_phase():
    assert locate_phase((F("mylib/thing.py", "run", "x()"),))[0] is None
    only_init = (F("deepspeed/__init__.py", "initialize", "engine = DeepSpeedEngine("),
                 F("deepspeed/runtime/engine.py", "__init__", "self._do_sanity_check()"))
    phase, reason, _ = locate_phase(only_init)
    assert phase is None and "no frame narrows it" in reason
