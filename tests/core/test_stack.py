"""The stack input (``memfit.core.stack``): versions given as flags or under ``stack:``, read from the
files users paste (pip freeze, requirements, ``transformers env``, ``accelerate env``, ``ds_report``,
written in tests/fixtures/stack/ the way each tool prints them), a version memfit does not know as
one line and exit 2, and the defaults that follow the stack (each checked against the library
code it cites in tests/exact/test_stack_against_sources.py)."""

import dataclasses
import subprocess
import sys

import pytest

from conftest import FIXTURES, ROOT, SEED
from memfit.core.inputs.stack_file import read_stack_file
from memfit.core.scenario.build import build_scenario
from memfit.core.scenario.inputs import ScenarioInputs, merge_inputs
from memfit.core.scenario.read import read_scenario_file
from memfit.errors import MemfitError

STACK = FIXTURES / "stack"


def _versions(name: str) -> dict[str, str]:
    return {k: v for k, (v, _) in read_stack_file(str(STACK / name)).versions.items()}


def test_pip_freeze_is_read():
    r = read_stack_file(str(STACK / "seed-pip-freeze.txt"))
    assert r.kind == "pip freeze"
    assert {k: v for k, (v, _) in r.versions.items()} == {
        "deepspeed": "0.5.8", "torch": "1.10.1+cu113", "cuda": "11.3", "transformers": "4.15.0"}
    assert r.versions["transformers"][1].endswith("seed-pip-freeze.txt:22")


def test_requirements_file_reads_pins_only_and_says_what_it_ignored():
    r = read_stack_file(str(STACK / "requirements-ranges.txt"))
    assert r.kind == "requirements"
    assert {k: v for k, (v, _) in r.versions.items()} == {
        "transformers": "4.38.2", "bitsandbytes": "0.43.3", "cuda": "12.1"}
    said = " ".join(r.notes)
    assert "torch>=2.1 is a range" in said and "peft~=0.9.0 is a range" in said
    assert "deepspeed installed from a URL" in said and "trl is installed editable" in said


def test_transformers_env_is_read_old_and_new():
    assert _versions("seed-transformers-env.txt") == {"transformers": "4.15.0", "torch": "1.10.1+cu113", "cuda": "11.3"}
    assert _versions("today-transformers-env.txt") == {"transformers": "5.24.0", "accelerate": "1.15.0",
                                                        "deepspeed": "0.19.8", "torch": "2.13.0+cu128", "cuda": "12.8"}


def test_accelerate_env_is_read():
    assert _versions("fms-accelerate-env.txt") == {"accelerate": "1.15.0", "torch": "2.4.1+cu121", "cuda": "12.1"}


def test_ds_report_is_read_with_its_colour_codes():
    raw = (STACK / "seed-ds_report.txt").read_text()
    assert "\x1b[92m[OKAY]\x1b[0m" in raw  # as DeepSpeed prints it
    assert _versions("seed-ds_report.txt") == {"torch": "1.10.1+cu113", "cuda": "11.3", "deepspeed": "0.5.8"}
    assert _versions("today-ds_report.txt") == {"torch": "2.13.0+cu128", "cuda": "12.8", "deepspeed": "0.19.8"}


def test_a_file_that_states_no_version_is_one_line(tmp_path):
    f = tmp_path / "notes.txt"
    f.write_text("numpy==1.26.4\nscipy==1.11\n")
    with pytest.raises(MemfitError, match="no version of torch, CUDA, DeepSpeed"):
        read_stack_file(str(f))


def _seed(**kw) -> ScenarioInputs:
    return dataclasses.replace(read_scenario_file(SEED), **kw)


NO_STACK = dict(ds_version=None, torch_version=None, cuda_version=None, transformers_version=None, peft_version=None,
                bitsandbytes_version=None, accelerate_version=None, trl_version=None)
"""The seed scenario without the stack its file states."""


def test_stack_files_fill_the_scenario_and_its_views():
    sc = build_scenario(_seed(**NO_STACK, stack_files=(str(STACK / "seed-pip-freeze.txt"),
                                                       str(STACK / "seed-ds_report.txt"))))
    st = sc.versions
    assert (st.torch, st.cuda, st.deepspeed, st.transformers) == ("1.10", "11.3", "0.5", "4.15")
    assert not st.entry("torch").assumed and st.entry("torch").source.startswith("read: pip freeze")
    # ds_version and the runtime are views of the stack
    assert sc.ds_version == "0.5" and sc.runtime.torch_version == "1.10" and sc.runtime.cuda_version == "11.3"
    assert not sc.load.low_cpu_mem_usage  # transformers 4.15's default


def test_a_given_version_overrides_a_file_and_two_files_disagreeing_are_one_line():
    # stack files are the precedence layer's "stack", just above the defaults: a version given (flag,
    # scenario) wins over one read, said in a note; two files that disagree name both
    given = _seed(**{**NO_STACK, "ds_version": "0.19"}, stack_files=(str(STACK / "seed-pip-freeze.txt"),))
    sc = build_scenario(dataclasses.replace(given, origins={**given.origins, "ds_version": "--deepspeed-version"}))
    assert sc.ds_version == "0.19" and sc.versions.entry("deepspeed").source == "given"
    assert sc.versions.entry("torch").source.startswith("read: pip freeze")
    assert any(n.startswith("--deepspeed-version = '0.19' overrides ") and
               n.endswith("seed-pip-freeze.txt:3: DeepSpeed (pip freeze) = '0.5.8'") for n in sc.input_notes)
    with pytest.raises(MemfitError, match=r"seed-pip-freeze.txt:20: torch \(pip freeze\) = '1.10.1\+cu113' "
                                          r"contradicts .*today-ds_report.txt:3: torch \(ds_report\)"):
        build_scenario(_seed(**NO_STACK, stack_files=(str(STACK / "seed-pip-freeze.txt"),
                                                      str(STACK / "today-ds_report.txt"))))


def test_cuda_contradicting_the_torch_build_is_one_line():
    with pytest.raises(MemfitError, match=r"CUDA 12.1 contradicts the torch build 1.10.1\+cu113"):
        build_scenario(_seed(**{**NO_STACK, "torch_version": "1.10.1+cu113", "cuda_version": "12.1"}))


@pytest.mark.parametrize("field,value,known", [
    ("transformers_version", "3.5.1", "transformers 4.0-4.57, 5.0-5.25"),
    ("torch_version", "1.6.0", "torch 1.10-1.13, 2.0-2.15"),
    ("peft_version", "0.30", "peft 0.1-0.21"),
    ("trl_version", "2.0", "TRL 0.1-0.29, 1.0-1.16"),
    ("ds_version", "0.2.0", "DeepSpeed 0.3, 0.5-0.8, 0.13-0.19"),
])
def test_an_unknown_version_names_what_memfit_knows(field, value, known):
    with pytest.raises(MemfitError) as e:
        build_scenario(_seed(**{field: value}))
    msg = str(e.value)
    assert "\n" not in msg and known in msg and value in msg


def test_unknown_version_on_the_command_line_is_one_line_and_exit_2():
    r = subprocess.run([sys.executable, "-m", "memfit.cli", "plan", str(SEED), "--transformers-version", "3.5.1"],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "memfit knows transformers 4.0-4.57, 5.0-5.25" in lines[0], r.stderr


def test_yaml_stack_section_and_the_older_names(tmp_path):
    base = SEED.read_text()
    y = tmp_path / "s.yaml"
    head, _, rest = base.partition("stack:")
    tail = rest.split("\n# today's stack")[1]
    body = head.replace("deepspeed/seed", str(SEED.parent / "deepspeed/seed"))
    y.write_text(body + 'stack: {deepspeed: "0.5.8", torch: "1.10.1", transformers: "4.15.0", peft: none}\n# today' + tail)
    sc = build_scenario(read_scenario_file(y))
    assert sc.ds_version == "0.5" and sc.versions.peft is None and sc.runtime.torch_version == "1.10"
    y.write_text(body + 'deepspeed_version: "0.5"\nstack: {deepspeed: "0.19"}\n# today' + tail)
    with pytest.raises(MemfitError, match="deepspeed_version '0.5' contradicts stack.deepspeed '0.19'"):
        read_scenario_file(y)
    y.write_text(body + "stack: {torch: 1.10}\n# today" + tail)
    with pytest.raises(MemfitError, match="write the version as a string"):
        read_scenario_file(y)


def test_what_is_not_given_is_said_as_assumed():
    from memfit.core.plan import make_plan

    plan = make_plan(build_scenario(_seed(**NO_STACK)))
    f = next(f for f in plan.findings if f.id == "stack-assumed")
    assert "transformers 5.24 (memfit's default, the release whose source was read (transformers 5.24.0))" in f.message
    assert any(n.startswith("Software stack: torch 2.13 (assumed)") for n in plan.notes)
    given = build_scenario(_seed(ds_version="0.19", torch_version="2.13", transformers_version="5.24",
                                 peft_version="0.21", bitsandbytes_version="none", accelerate_version="none",
                                 trl_version="none", cuda_version="12.8"))
    assert not given.versions.assumed


@pytest.mark.parametrize("tf,quantized,fsdp,expected", [
    ("4.15", False, False, False), ("4.30", False, False, False), ("4.30", True, False, True),
    ("4.35", False, True, True), ("4.34", False, True, False), ("4.50", False, False, False),
    ("4.51", False, False, True), ("5.24", False, False, True),
])
def test_low_cpu_mem_usage_default_follows_transformers(tf, quantized, fsdp, expected):
    from memfit.core.stack.transformers import low_cpu_mem_usage_default

    assert low_cpu_mem_usage_default(tf, device_map=False, quantized=quantized, fsdp_efficient=fsdp)[0] is expected


def test_low_cpu_mem_usage_false_is_said_ignored_by_new_transformers():
    sc = build_scenario(_seed(**{**NO_STACK, "transformers_version": "4.51.0"}, low_cpu_mem_usage=False))
    assert sc.load.low_cpu_mem_usage and any("ignored by transformers 4.51" in n for n in sc.input_notes)
    assert not build_scenario(_seed(**{**NO_STACK, "transformers_version": "4.50.0"}, low_cpu_mem_usage=False)
                              ).load.low_cpu_mem_usage


def test_the_old_default_books_the_state_dict_next_to_the_model():
    from memfit.core.plan import make_plan

    old = make_plan(build_scenario(_seed(**{**NO_STACK, "transformers_version": "4.15.0"})))
    new = make_plan(build_scenario(_seed(**{**NO_STACK, "transformers_version": "5.24.0"})))
    held = sum(i.bytes for i in old.phase("load").items if i.key == "load.state_dict")
    assert held == 6_166_502_400 * 2  # kogpt's fp16 checkpoint, one file (transformers 4.12 did not shard)
    assert not any(i.key == "load.state_dict" for i in new.phase("load").items)


@pytest.mark.parametrize("tf,torch,optim", [("4.26", "1.13", "adamw_hf"), ("4.31", "2.0", "adamw_hf"),
                                            ("4.32", "2.0", "adamw_torch"), ("4.53", "2.8", "adamw_torch"),
                                            ("4.54", "2.4", "adamw_torch"), ("4.54", "2.8", "adamw_torch_fused"),
                                            ("5.24", "2.13", "adamw_torch_fused")])
def test_trainer_default_optim_follows_the_stack(tmp_path, tf, torch, optim):
    ta = tmp_path / "training_args.json"
    ta.write_text('{"per_device_train_batch_size": 1, "output_dir": "out"}')
    sc = build_scenario(ScenarioInputs(model="gpt2", gpus="1xa100-80gb", training_args=str(ta), transformers_version=tf,
                                       torch_version=torch))
    assert sc.torch.optim == optim
    assert any(n.startswith(f"optim {optim}: the Trainer's default optim in transformers {tf}") for n in sc.input_notes)


def test_torch_foreach_default_follows_torch():
    from memfit.core.frameworks.pytorch import TorchSettings
    from memfit.core.optimizers import resolve_optimizer

    ts = TorchSettings(optim="adamw_torch")
    assert resolve_optimizer(ts, "cuda", "1.13").impl == "single"  # adamw.py: foreach None -> False
    assert resolve_optimizer(ts, "cuda", "2.0").impl == "foreach"  # _default_to_fused_or_foreach
    assert resolve_optimizer(ts, "cpu", "2.13").impl == "single"


@pytest.mark.parametrize("release,allocation", [("0.3.10", "0.5"), ("0.5.8", "0.5"), ("0.7.7", "0.6"), ("0.8.0", "0.6"),
                                                ("0.13.1", "0.19"), ("0.19.8", "0.19")])
def test_deepspeed_releases_map_to_the_allocation_model_they_share(release, allocation):
    stage2 = {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}, "fp16": {"enabled": True},
              "train_micro_batch_size_per_gpu": 1}
    sc = build_scenario(ScenarioInputs(model="gpt2", gpus="1xa100-80gb", deepspeed_inline=stage2, ds_version=release))
    assert sc.ds_version == allocation


@pytest.mark.parametrize("release,pinned", [("0.5.8", False), ("0.8.0", False), ("0.19.4", False), ("0.19.5", True),
                                            ("0.19", True)])
def test_offload_pin_memory_default_follows_the_release(release, pinned):
    cfg = {"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}},
           "fp16": {"enabled": True}, "train_micro_batch_size_per_gpu": 1}
    sc = build_scenario(ScenarioInputs(model="gpt2", gpus="1xa100-80gb", deepspeed_inline=cfg, ds_version=release))
    z = sc.deepspeed.zero
    assert z.offload_param.pin_memory is pinned and z.offload_optimizer.pin_memory is pinned
    given = dict(cfg, zero_optimization={**cfg["zero_optimization"], "offload_param": {"device": "cpu", "pin_memory": True}})
    sc = build_scenario(ScenarioInputs(model="gpt2", gpus="1xa100-80gb", deepspeed_inline=given, ds_version=release))
    assert sc.deepspeed.zero.offload_param.pin_memory  # given: kept


def test_zero3_on_deepspeed_0_3_is_refused():
    cfg = {"zero_optimization": {"stage": 3}, "fp16": {"enabled": True}, "train_micro_batch_size_per_gpu": 1}
    with pytest.raises(MemfitError, match="DeepSpeed 0.3.10 has no ZeRO stage 3"):
        build_scenario(ScenarioInputs(model="gpt2", gpus="1xa100-80gb", deepspeed_inline=cfg, ds_version="0.3.10"))
