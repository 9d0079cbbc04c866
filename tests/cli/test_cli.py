"""The command line as a user meets it: exit codes, one-line errors, JSON, --help."""

import json
import subprocess
import sys

import pytest

from conftest import EXAMPLES, ROOT, SEED


def run(*args, cwd=ROOT, env=None):
    import os

    full_env = {**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})}  # CI has no model hub
    return subprocess.run([sys.executable, "-m", "memfit.cli", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=120, env=full_env)


def test_plan_seed_terminal():
    r = run("plan", str(SEED))
    assert r.returncode == 0, r.stderr
    assert "initialize.move" in r.stdout and "GiB" in r.stdout
    assert "moves the whole model to every GPU" in " ".join(r.stdout.split())


def test_plan_seed_json_schema():
    r = run("plan", str(SEED), "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert set(d["params"]) >= {"total", "trainable", "frozen", "largest"}
    assert d["params"]["total"] == 7_123_078_144
    ph = d["phases"][0]
    assert set(ph) >= {"name", "gpu_peak_bytes", "cpu_peak_bytes", "cpu_pinned_bytes", "node_cpu_peak_bytes", "items"}
    assert set(ph["items"][0]) >= {"name", "device", "bytes", "formula", "source"}
    assert set(d["peak"]) == {"gpu_bytes", "gpu_phase", "node_cpu_bytes", "cpu_phase", "gpu_oom_relevant_bytes",
                              "gpu_oom_relevant_phase", "gpu_reserved_bytes", "cpu_pinned_locked_bytes",
                              "node_cpu_locked_bytes", "node_cpu_locked_phase"}
    assert d["schema_version"] == 3
    for k in ("gpu_allocated_bytes", "gpu_reserved_bytes", "gpu_oom_relevant_bytes", "gpu_nvidia_smi_bytes",
              "gpu_outside_pytorch_bytes", "cpu_pinned_requested_bytes", "cpu_pinned_locked_bytes"):
        assert all(isinstance(p[k], int) for p in d["phases"]), k
    assert set(d["verdict"]) == {"fits", "level", "failures", "worst_failure", "risks", "margins", "gpu_figure",
                                 "host_figure"}
    assert d["verdict"]["level"] in ("fits", "at_risk", "does_not_fit")
    assert set(d["verdict"]["margins"]) == {"gpu", "host", "host_reserve_bytes", "shared_gpu", "source"}
    assert all(set(f) == {"id", "severity", "message"} for f in d["findings"])
    for p in d["phases"]:
        for k in ("gpu_peak_bytes", "cpu_peak_bytes", "cpu_pinned_bytes", "node_cpu_peak_bytes"):
            assert isinstance(p[k], int)
    assert [p["name"] for p in d["phases"]] == ["load", "initialize.cast", "initialize.move", "initialize.partition",
                                                "initialize.optimizer", "forward", "backward", "optimizer_step",
                                                "step2.forward", "step2.backward", "step2.optimizer_step", "save"]
    assert next(p for p in d["phases"] if p["name"] == "step2.forward")["label"] == "steady state (step 2+): forward"


def test_flags_override_the_file():
    a = json.loads(run("plan", str(SEED), "--json").stdout)
    b = json.loads(run("plan", str(SEED), "--json", "--gpus", "2xa100-80gb").stdout)
    assert b["scenario"]["gpu"] == "a100-80gb" and a["scenario"]["gpu"] == "rtx3090"


def test_help_lists_commands():
    r = run("--help")
    assert r.returncode == 0
    for cmd in ("plan", "models", "zero-paper"):
        assert cmd in r.stdout


def test_zero_paper_command():
    r = run("zero-paper", "--json")
    assert r.returncode == 0
    rows = json.loads(r.stdout)
    assert [round(x["bytes_per_gpu"] / 1e9, 2) for x in rows] == [120.0, 31.41, 16.64, 1.88]


@pytest.mark.parametrize("args,needle", [
    (["plan", "no/such/file.yaml"], "not found"),
    (["plan", "--model", "no-such-model-xyz", "--gpus", "1xa100"], "model"),
    (["plan", "--model", "gpt2", "--gpus", "2xwhatever"], "unknown GPU"),
    (["plan", "--model", "gpt2", "--seq-len", "-5"], "--seq-len"),
    (["plan", "--model", "gpt2", "--cpu-ram", "lots"], "cpu_ram"),
    (["plan", "--model", "gpt2", "--deepspeed", "missing.json"], "missing.json"),
    (["plan", "--model", "gpt2", "--peft", "dora"], "PEFT"),
    (["plan", "--bogus"], "no such option"),
    (["plan", "--model", "gpt2", "--seq-len", "abc"], "seq-len"),
])
def test_bad_input_is_one_line_and_nonzero(args, needle):
    r = run(*args)
    assert r.returncode != 0
    assert "Traceback" not in r.stderr
    lines = [line for line in r.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1, r.stderr
    assert needle.lower() in lines[0].lower()


def test_malformed_yaml_and_json(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [unclosed\n")
    r = run("plan", str(bad))
    assert r.returncode == 2 and "not valid YAML" in r.stderr and "Traceback" not in r.stderr
    ds = tmp_path / "ds.json"
    ds.write_text("{\"zero_optimization\": {\"stage\": 3,}")
    r = run("plan", "--model", "gpt2", "--deepspeed", str(ds))
    assert r.returncode == 2 and "JSON" in r.stderr and "Traceback" not in r.stderr


def test_plan_does_not_import_heavy_libraries():
    code = ("import sys; from memfit.core.scenario.build import build_scenario; from memfit.core.scenario.read import read_scenario_file; "
            "from memfit.core.plan import make_plan; "
            f"make_plan(build_scenario(read_scenario_file({str(SEED)!r}))); "
            "print(sorted(m for m in ('torch','deepspeed','transformers','peft','huggingface_hub') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_a_command_imports_only_its_own_module_and_the_app_still_has_every_command():
    """``main`` imports the running command's module only (issue 22: start-up); ``memfit.cli.app``
    afterwards is still the whole application, its commands in --help's order."""
    code = ("import sys, io, contextlib; sys.argv = ['memfit', 'recommend', '--help']; from memfit import cli\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    try: cli.main()\n"
            "    except SystemExit: pass\n"
            "print(sorted(m for m in sys.modules if m.startswith('memfit.cli.')))\n"
            "import typer.main; print(list(typer.main.get_command(cli.app).commands))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    loaded, commands = r.stdout.strip().splitlines()
    assert loaded == str(["memfit.cli.application", "memfit.cli.common", "memfit.cli.noise", "memfit.cli.recommend"])
    assert commands == str(["plan", "trace", "replay", "recommend", "diagnose", "compare", "models", "zero-paper"])


def test_a_plan_runs_no_garbage_collection_and_main_restores_the_schedule():
    """Issue 22 (start-up): the process's entry point raises the collector's first generation so that a
    plan scans nothing (``memfit.cli.GC_FIRST_GENERATION``: the seed allocates ~47,000 container
    objects, the default schedule ran 86 collections); ``main``, called in-process, gives the caller
    its own threshold back."""
    # As the console script runs it (``from memfit.cli import run; sys.exit(run())``). The count starts
    # at 0 after that import: what the interpreter's start-up and the compiling of memfit/__init__.py
    # and memfit/cli/__init__.py allocate is not the plan's. Without cached bytecode (an editable
    # install under PYTHONDONTWRITEBYTECODE, as CI has it) compiling them ran 4 collections first.
    code = ("import atexit, gc, sys\n"
            "from memfit.cli import run\n"
            "gc.collect()\n"
            "n = []\n"
            "gc.callbacks.append(lambda phase, info: n.append(info['generation']) if phase == 'start' else None)\n"
            "atexit.register(lambda: print('collections', n, file=sys.stderr))\n"
            f"sys.argv = ['memfit', 'plan', {str(SEED)!r}]\n"
            "sys.exit(run())")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stderr.strip().splitlines()[-1] == "collections []", r.stderr[-500:]
    code = ("import gc, io, sys, contextlib; gc.set_threshold(700, 10, 10)\n"
            f"sys.argv = ['memfit', 'plan', {str(SEED)!r}, '--json']; from memfit import cli\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    cli.main()\n"
            "print(gc.get_threshold())")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "(700, 10, 10)"


TINY_GPTJ = {"architectures": ["GPTJForCausalLM"], "model_type": "gptj", "vocab_size": 1000, "n_embd": 128,
             "n_layer": 2, "n_head": 4, "rotary_dim": 16, "n_positions": 256, "tie_word_embeddings": False,
             "bos_token_id": 0, "eos_token_id": 0}


def test_trace_and_plan_exact_agree(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(TINY_GPTJ))
    common = ["--model", str(cfg), "--peft", "lora", "--seq-len", "64", "--gpus", "1xa100-80gb"]
    t = run("trace", *common, "--json")
    assert t.returncode == 0, t.stderr
    tr = json.loads(t.stdout)
    assert tr["params"]["trainable"] < tr["params"]["total"]
    assert tr["forward"]["peak_bytes"] > 0 and tr["saved_bytes"] > 0
    p = run("plan", *common, "--exact", "--json")
    assert p.returncode == 0, p.stderr
    plan = json.loads(p.stdout)
    fwd = {i["key"]: i for i in next(ph for ph in plan["phases"] if ph["name"] == "forward")["items"]}
    cats = tr["forward"]["by_category"]
    expected = sum(cats[c] for c in ("input", "saved", "output", "held", "temporary"))
    assert fwd["step.activations"]["bytes"] == expected
    assert "traced" in fwd["step.activations"]["name"]


def test_seed_document_is_current():
    """docs/kogpt-prefix-tuning.md is generated from memfit's output; it must match the code."""
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "make_seed_doc.py"), "--check"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
