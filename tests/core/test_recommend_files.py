"""``memfit recommend --out``: the user's own files changed, a diff of each, and a scenario that
``memfit plan`` runs as written and that gives the figures recommend printed (issue 23 items 6-8).

Every written scenario is planned again here (through ``read_scenario_file``, as ``memfit plan
FILE`` reads it) and its verdict figures (``memfit.core.figures``) must equal the recommendation's
to the byte: both are the same ledger of the same configuration, so any difference is a bug in the
files. The inputs are written as users have them: a TRL SFTConfig JSON, an ``accelerate config``
YAML, a TrainingArguments YAML with comments, Trainer-style DeepSpeed JSONs full of ``"auto"``, and
user files of the public-runs corpus (``tests/fixtures/public_runs/``).
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest
import yaml
from conftest import EXAMPLES, FIXTURES, SEED

from memfit.core.figures import headline
from memfit.core.plan import make_plan
from memfit.core.recommend import recommend
from memfit.core.recommend.files import write_recommendations
from memfit.core.recommend.scenario_file import FIELD_KEYS, NOT_WRITTEN, SPECIAL, scenario_document
from memfit.core.scenario.build import build_scenario
from memfit.core.scenario.inputs import ScenarioInputs
from memfit.core.scenario.read import read_scenario_file

PUBLIC = FIXTURES / "public_runs"
LLAMA2_AUTO = EXAMPLES / "deepspeed" / "llama2_7b_lora_zero2_auto.json"


def apply_unified_diff(original: str, diff: str) -> str:
    """Apply a unified diff (as difflib writes it) to ``original``; fails on a hunk that does not match."""
    src = original.splitlines(True)
    out: list[str] = []
    pos = 0
    lines = diff.splitlines(True)
    i = 0
    while i < len(lines):
        ln = lines[i]
        if not ln.startswith("@@"):
            i += 1
            continue
        start = int(ln.split()[1].split(",")[0][1:]) - (0 if ln.split()[1].endswith(",0") else 1)
        out += src[pos:start]
        pos = start
        i += 1
        while i < len(lines) and not lines[i].startswith("@@"):
            body = lines[i]
            if body.startswith(" ") or body.startswith("-"):
                assert src[pos] == body[1:], (src[pos], body)
                if body.startswith(" "):
                    out.append(src[pos])
                pos += 1
            elif body.startswith("+"):
                out.append(body[1:])
            i += 1
    return "".join(out + src[pos:])


def public_case(tmp: Path, case: str) -> Path:
    """A public-runs case's scenario as its own file (its user files referenced where they are), with
    the case's own stack as ``memfit compare`` plans it (``compare/public_run.py:case_stack``)."""
    from memfit.core.compare.public_run import case_stack
    from memfit.core.records.public_run import public_run_from_mapping

    raw = yaml.safe_load((PUBLIC / f"{case}.yaml").read_text())
    doc, _ = case_stack(public_run_from_mapping(raw, PUBLIC / f"{case}.yaml"))
    for key in ("deepspeed", "training_args", "accelerate_config", "bnb_config"):
        if isinstance(doc.get(key), str) and not os.path.isabs(doc[key]):
            doc[key] = str((PUBLIC / doc[key]).resolve())
    if str(doc.get("model", "")).startswith(("./", "../")):
        doc["model"] = str((PUBLIC / doc["model"]).resolve())
    path = tmp / f"{case}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def user_case(tmp: Path, name: str) -> Path:
    """The users' files of issue 23, written as each library writes or documents them."""
    if name == "trainer-zero2-auto-accum":  # TrainingArguments' values, a ZeRO-2 JSON of "auto" (item 6)
        (tmp / "ds_zero2.json").write_text(LLAMA2_AUTO.read_text())
        (tmp / "case.yaml").write_text(
            "name: Trainer + ZeRO-2 auto, gradient accumulation 8\nmodel: meta-llama/Llama-2-7b-hf\npeft: lora\n"
            "deepspeed: ds_zero2.json\nhardware: {gpus: 1xrtx3090, cpu_ram: 64GB}\n"
            "train: {seq_len: 2048, micro_batch: 4, grad_accum: 8}\n")
    elif name == "sft-yaml-with-comments":  # a TRL recipe YAML: the comments must survive the edit
        (tmp / "sft.yaml").write_text(
            "# recipe for Llama-3-8B QLoRA\noutput_dir: out\nper_device_train_batch_size: 1   # fits on a 4090\n"
            "gradient_accumulation_steps: 16\ngradient_checkpointing: true\nmax_length: 2048\npacking: true\n"
            "optim: paged_adamw_32bit\nbf16: true\n")
        (tmp / "case.yaml").write_text(
            "name: SFT YAML\nmodel: meta-llama/Meta-Llama-3-8B\npeft: {method: lora, lora_r: 16, target_modules: all-linear}\n"
            f"training_args: sft.yaml\nbnb_config: {EXAMPLES / 'frameworks' / 'bnb_nf4.json'}\n"
            "hardware: {gpus: 1xrtx4090, cpu_ram: 64GB}\nload: {dtype: bf16}\n")
    elif name == "accelerate-ddp-trainer":  # `accelerate config` output + TrainingArguments JSON, 2 GPUs
        (tmp / "default_config.yaml").write_text(
            "compute_environment: LOCAL_MACHINE\ndebug: false\ndistributed_type: MULTI_GPU\ndowncast_bf16: 'no'\n"
            "enable_cpu_affinity: false\ngpu_ids: all\nmachine_rank: 0\nmain_training_function: main\n"
            "mixed_precision: bf16\nnum_machines: 1\nnum_processes: 2\nrdzv_backend: static\nsame_network: true\n"
            "tpu_env: []\ntpu_use_cluster: false\ntpu_use_sudo: false\nuse_cpu: false\n")
        (tmp / "training_args.json").write_text(json.dumps({
            "output_dir": "out", "per_device_train_batch_size": 8, "gradient_accumulation_steps": 1,
            "learning_rate": 2e-4, "num_train_epochs": 3, "logging_steps": 10, "optim": "adamw_torch"}, indent=2) + "\n")
        (tmp / "case.yaml").write_text(
            "name: accelerate DDP + Trainer\nmodel: meta-llama/Llama-2-7b-hf\npeft: lora\n"
            "training_args: training_args.json\naccelerate_config: default_config.yaml\n"
            "hardware: {gpus: 2xrtx4090, cpu_ram: 128GB}\ntrain: {seq_len: 2048}\n")
    return tmp / "case.yaml"


CASES = {
    "seed": lambda tmp: SEED,
    "trainer-zero2-auto-accum": lambda tmp: user_case(tmp, "trainer-zero2-auto-accum"),
    "sft-config-qlora-example": lambda tmp: EXAMPLES / "frameworks" / "qlora-llama3-8b-1x24gb.yaml",
    "accelerate-fsdp2-example": lambda tmp: EXAMPLES / "frameworks" / "fsdp2-offload-llama3-8b-8gpu.yaml",
    "sft-yaml-with-comments": lambda tmp: user_case(tmp, "sft-yaml-with-comments"),
    "accelerate-ddp-trainer": lambda tmp: user_case(tmp, "accelerate-ddp-trainer"),
    "public-ds-zero2-offload-t5": lambda tmp: public_case(tmp, "ds-zero2-offload-t5-3b-fp16-1x3090-bs30"),
    "public-ddp-gpt2-xl": lambda tmp: public_case(tmp, "ddp-gpt2-xl-fp32-2xtitanrtx-oom"),
}


NOT_FIXED: dict = {}
"""Cases known to be wrong, each a strict xfail with its reason. Empty."""


@pytest.mark.parametrize("case", [pytest.param(c, marks=NOT_FIXED[c]) if c in NOT_FIXED else c for c in sorted(CASES)])
def test_every_written_scenario_plans_to_the_figures_shown(case, tmp_path):
    path = CASES[case](tmp_path)
    r = write_recommendations(recommend(read_scenario_file(path), top=3), tmp_path / "out")
    assert r.recommendations, r.notes
    originals = {Path(p).name: Path(p) for p in _user_paths(read_scenario_file(path))}
    for rec in r.recommendations:
        assert not [n for n in rec.notes if "memfit bug" in n], rec.notes
        scenario = next(Path(f) for f in rec.files if f.endswith("scenario.yaml"))
        again = headline(make_plan(build_scenario(read_scenario_file(scenario))))
        shown = rec.headline
        assert (again.gpu.name, again.gpu.bytes, again.host.bytes) == (shown.gpu.name, shown.gpu.bytes, shown.host.bytes)
        for f in map(Path, rec.files):
            if f.name in originals:  # the user's file, changed: its diff turns the original into it
                diff = (f.parent / f"{f.name}.diff").read_text()
                assert apply_unified_diff(originals[f.name].read_text(), diff) == f.read_text()
            elif f.suffix == ".json" and f.name != "bnb_config.json":
                assert f.name == "ds_config.json"  # memfit's default config, written as a new file
        for name in {Path(f).name for f in rec.files} & set(originals):
            assert originals[name].read_text() != (scenario.parent / name).read_text()  # unchanged files are not copied


def _user_paths(inputs: ScenarioInputs) -> list[str]:
    from memfit.core.recommend.user_files import read_user_files

    return [f.path for f in read_user_files(inputs).values() if f.path]


def test_auto_accumulation_is_recommended_not_refused(tmp_path):
    """Issue 23 item 6: an "auto" config with gradient accumulation exited 2 ("gradient_accumulation_steps=16
    vs --grad-accum 8; set these config values to 'auto'") for memfit's own candidate."""
    inputs = read_scenario_file(user_case(tmp_path, "trainer-zero2-auto-accum"))
    r = write_recommendations(recommend(inputs, top=5), tmp_path / "out")
    changed = [rec for rec in r.recommendations if rec.candidate.grad_accum != 8]
    assert changed, "the search keeps the global batch: some configuration changes the accumulation"
    for rec in changed:
        folder = Path(rec.files[0]).parent
        written = read_scenario_file(folder / "scenario.yaml")
        ds = json.loads(Path(written.deepspeed).read_text())
        assert ds["gradient_accumulation_steps"] == "auto" and ds["train_micro_batch_size_per_gpu"] == "auto"
        assert (written.grad_accum, written.micro_batch) == (rec.candidate.grad_accum, rec.candidate.micro_batch)


def test_comments_and_layout_of_a_yaml_file_are_kept(tmp_path):
    r = write_recommendations(recommend(read_scenario_file(user_case(tmp_path, "sft-yaml-with-comments")), top=3),
                              tmp_path / "out")
    edited = [Path(f) for rec in r.recommendations for f in rec.files if Path(f).name == "sft.yaml"]
    assert edited
    for f in edited:
        text = f.read_text()
        assert text.startswith("# recipe for Llama-3-8B QLoRA\n") and "# fits on a 4090" in text
        diff = (f.parent / "sft.yaml.diff").read_text()
        assert sum(ln.startswith("-") and not ln.startswith("---") for ln in diff.splitlines()) <= 3


def test_what_changes_lists_every_setting_the_files_change(tmp_path):
    """Issue 23 item 7: the written scenarios changed the load dtype and added DDP settings that "what
    changes" did not list. Each written user-file key maps to a listed change."""
    r = write_recommendations(recommend(read_scenario_file(EXAMPLES / "frameworks" / "qlora-llama3-8b-1x24gb.yaml"),
                                        top=3), tmp_path / "out")
    for rec in r.recommendations:
        scenario = yaml.safe_load(Path(next(f for f in rec.files if f.endswith("scenario.yaml"))).read_text())
        assert "ddp" not in scenario and "load" not in scenario  # the user's files say those; nothing is added
        listed = {c.setting for c in rec.changes}
        for name, diff in rec.file_diffs:
            keys = {ln[1:].split(":")[0].strip().strip('"') for ln in diff.splitlines()
                    if ln.startswith("+") and not ln.startswith("+++")}
            known = {"per_device_train_batch_size": "micro_batch", "gradient_accumulation_steps": "gradient_accumulation_steps",
                     "gradient_checkpointing": "gradient_checkpointing", "optim": "optim", "bf16": "precision",
                     "fp16": "precision"}
            assert {known.get(k, k) for k in keys} <= listed | {"precision"}, (keys, listed)


def test_the_script_diff_opens_the_written_deepspeed_json(tmp_path):
    """Issue 23 item 7: the script diff kept the old DeepSpeed JSON's name."""
    r = write_recommendations(recommend(read_scenario_file(SEED), top=2), tmp_path / "out")
    for rec in r.recommendations:
        folder = Path(rec.files[0]).parent
        if (folder / "seed_kogpt_zero3_offload.json").exists() and rec.script_diff:
            assert f'+ds_config = "{folder / "seed_kogpt_zero3_offload.json"}"' in rec.script_diff


def test_torch_changes_say_where_they_go():
    """Issue 23 item 7: a non-DeepSpeed change printed "no change to the script"."""
    r = recommend(read_scenario_file(EXAMPLES / "frameworks" / "lora-ampbf16-llama2-7b-1gpu.yaml"), top=3)
    for rec in r.recommendations:
        if rec.changes:
            assert rec.file_diffs or rec.script_diff, rec.changes


def test_every_scenario_input_has_a_scenario_key():
    """A field added to ScenarioInputs must be written by recommend's scenario files (or say why not)."""
    names = {f.name for f in dataclasses.fields(ScenarioInputs)}
    assert names == set(FIELD_KEYS) | SPECIAL | set(NOT_WRITTEN)


def test_a_scenario_document_reads_back_as_the_same_inputs(tmp_path):
    inputs = dataclasses.replace(read_scenario_file(SEED), grad_accum=2, torch_version="2.13", max_grad_norm=0.5,
                                 eval_strategy="steps", eval_batch=4, eval_steps=50, host_reserve="8GB",
                                 epoch_steps=20, empty_cache_steps=10)
    doc = scenario_document(inputs)
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(doc))
    again = read_scenario_file(tmp_path / "s.yaml")
    for f in dataclasses.fields(ScenarioInputs):
        a, b = getattr(inputs, f.name), getattr(again, f.name)
        if f.name in ("deepspeed", "peft_method") and a and b:
            a, b = str(Path(a).resolve()), str(Path(b).resolve())
        if f.name in NOT_WRITTEN:
            continue
        assert a == b, f.name


def test_a_peft_adapter_config_is_found_from_the_written_scenario(tmp_path):
    """Issue 23 item 7: the written scenarios pointed at the wrong adapter_config folder. The adapter
    file is the one peft writes (``LoraConfig.save_pretrained``); the recommendations are written two
    folders away from it."""
    peft = pytest.importorskip("peft")
    project = tmp_path / "project"
    peft.LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM").save_pretrained(
        str(project / "adapter"))
    (project / "case.yaml").write_text(
        "name: adapter file\nmodel: meta-llama/Llama-2-7b-hf\npeft: {adapter_config: adapter/adapter_config.json}\n"
        "hardware: {gpus: 1xrtx4090, cpu_ram: 64GB}\nprecision: amp_bf16\ntrain: {seq_len: 1024, micro_batch: 2}\n")
    r = write_recommendations(recommend(read_scenario_file(project / "case.yaml"), top=2), tmp_path / "else" / "where")
    assert r.recommendations
    for rec in r.recommendations:
        scenario = next(Path(f) for f in rec.files if f.endswith("scenario.yaml"))
        doc = yaml.safe_load(scenario.read_text())
        assert Path(doc["peft"]["adapter_config"]) == (project / "adapter" / "adapter_config.json").resolve()
        again = headline(make_plan(build_scenario(read_scenario_file(scenario))))
        assert again.gpu.bytes == rec.headline.gpu.bytes
