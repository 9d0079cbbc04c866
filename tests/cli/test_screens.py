"""What a person sees (issue 23 item 12): the plan's verdict and figures first at 80 columns, whole
model names, ``--version``, no library import noise (shown once under ``--verbose``), and recommend
never claiming the exact ledger "did not confirm" a candidate with a difference of 0 B."""

from __future__ import annotations

import subprocess
import sys

from conftest import EXAMPLES, SEED
from robustness.clirun import cli

from memfit.core.catalog import list_catalog


def test_the_seed_plan_starts_with_its_verdict_and_cuts_nothing_at_80_columns():
    r = cli("plan", str(SEED))  # captured output: rich lays it out at 80 columns
    assert r.rc == 0
    lines = r.out.splitlines()
    assert lines[0].startswith("memfit plan: ") and lines[1].startswith(("FITS", "AT RISK", "DOES NOT FIT"))
    first_screen = " ".join(lines[:24])  # an 80x24 terminal
    assert "GPU OOM-relevant peak: " in first_screen and "host RAM peak per node: " in first_screen
    assert "…" not in r.out  # no byte count, name or formula cut short
    assert len(lines) < 651  # issue 23: 651 lines at 80 columns, the verdict scrolled off


def test_models_shows_whole_names_at_80_columns():
    r = cli("models")
    assert r.rc == 0 and "…" not in r.out
    for e in list_catalog():
        assert e.name in r.out


def test_version():
    r = cli("--version")
    assert r.rc == 0
    from memfit import __version__

    assert r.out.startswith(f"memfit {__version__} (python ") and "deepspeed " in r.out


NOISY = ("import logging, sys; from memfit.cli.noise import LibraryNoise; n = LibraryNoise.install(); "
         "logging.getLogger('bitsandbytes.backends.cpu.ops').warning('Failed to load CPU gemm_4bit_forward from "
         "kernels-community: %s. Please make sure you already `pip install kernels` and the kernels >= 0.11.1', "
         "ModuleNotFoundError(\"No module named 'kernels'\")); "
         "import importlib.util; importlib.util.find_spec('bitsandbytes') and __import__('bitsandbytes'); "
         "n.uninstall(); n.report(verbose=sys.argv[1] == 'v')")


def test_library_noise_is_captured_and_shown_once_under_verbose():
    """bitsandbytes logs "Failed to load CPU gemm_4bit_forward from kernels-community" when its optional
    ``kernels`` package is missing (backends/cpu/ops.py); the record is emitted here as the library does,
    then the library itself is imported."""
    quiet = subprocess.run([sys.executable, "-c", NOISY, "q"], capture_output=True, text=True, timeout=300)
    assert quiet.returncode == 0, quiet.stderr[-800:]
    assert "Failed to load" not in quiet.stderr + quiet.stdout
    loud = subprocess.run([sys.executable, "-c", NOISY, "v"], capture_output=True, text=True, timeout=300)
    assert loud.stderr.count("Failed to load CPU gemm_4bit_forward") == 1
    assert loud.stderr.startswith("memfit: (library) bitsandbytes.backends.cpu.ops: Failed to load")



def test_one_warning_with_different_arguments_is_shown_once():
    """bitsandbytes' gemm_4bit_forward warning carries the exception it got, which depends on the
    ``kernels`` package (missing: "No module named 'kernels'"; kernels 0.19.1, installed with
    transformers 5.25.0: "could not verify publisher trust status"): one template, shown once."""
    import io
    import logging

    from memfit.cli.noise import LibraryNoise

    noise = LibraryNoise.install()
    try:
        log = logging.getLogger("bitsandbytes.backends.cpu.ops")
        for exc in ("No module named 'kernels'", "Kernel repository could not verify publisher trust status"):
            log.warning("Failed to load CPU gemm_4bit_forward from kernels-community: %s. Please make sure", exc)
        logging.getLogger("kernels").warning("another message")
    finally:
        noise.uninstall()
    out = io.StringIO()
    noise.report(verbose=True, stream=out)
    assert out.getvalue().count("Failed to load CPU gemm_4bit_forward") == 1
    assert "No module named 'kernels'" in out.getvalue() and "kernels: another message" in out.getvalue()

def test_verbose_is_a_global_option():
    r = cli("--verbose", "models")
    assert r.rc == 0 and "kakaobrain/kogpt" in r.out


def test_a_candidate_the_allocator_simulation_rejects_is_said_so():
    """A configuration that fits by requested bytes but not by the OOM-relevant figure: the note says
    which figure rejected it, never "did not confirm ... (difference 0 B)"."""
    from memfit.core.plan import make_plan
    from memfit.core.recommend.confirm import rejection, rejection_notes
    from memfit.core.scenario.build import build_scenario
    from memfit.core.scenario.read import read_scenario_file

    sc = build_scenario(read_scenario_file(EXAMPLES / "llama2-7b-lora-1x24gb.yaml"))
    plan = make_plan(sc)
    requested = max(p.gpu_peak_bytes for p in plan.phases)
    relevant = max(p.gpu_oom_relevant_bytes for p in plan.phases)
    assert relevant > requested
    cap = sc.hardware.gpu.total_bytes
    headroom = 1 - (requested + relevant) / 2 / cap  # a limit between the two figures
    import dataclasses

    hw = dataclasses.replace(sc.hardware, gpu=dataclasses.replace(sc.hardware.gpu, total_bytes=cap))
    if not 0 <= headroom < 1:  # the plan is over the card: scale the card instead
        hw = dataclasses.replace(hw, gpu=dataclasses.replace(hw.gpu, total_bytes=(requested + relevant) // 2))
        headroom = 0.0
    why = rejection(plan, hw, headroom, 0)
    assert "fit by requested bytes but not by the allocator simulation's GPU OOM-relevant peak" in why
    (note,) = rejection_notes([why, why], hw, headroom)
    assert note.startswith("2 candidate(s)") and "difference 0 B" not in note
