"""The HTML report renders in a real headless browser (Debian's Chromium), charts included."""

import os
import shutil
import subprocess
import sys

import pytest

from memfit.core.plan import make_plan
from memfit.core.scenario.build import build_scenario
from memfit.core.scenario.read import read_scenario_file
from memfit.render.report import html_report, markdown_report

from conftest import SEED

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="module")
def seed_plan():
    sc = build_scenario(read_scenario_file(SEED))
    return make_plan(sc), sc


def _chromium():
    if CHROMIUM is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed (.ci/run installs Debian's chromium)")
        pytest.skip("chromium not installed (apt-get install chromium)")
    return CHROMIUM


def test_report_renders_in_chromium(tmp_path, seed_plan):
    plan, sc = seed_plan
    page = tmp_path / "report.html"
    page.write_text(html_report(plan, sc), encoding="utf-8")
    exe = _chromium()
    dom = subprocess.run([exe, *FLAGS, f"--user-data-dir={tmp_path / 'ud'}", "--dump-dom", page.as_uri()],
                         capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    html = dom.stdout
    assert 'id="verdict"' in html and "initialize.move" in html
    assert html.count("<svg") == 2 and "capacity 23.69 GiB" in html
    shot = tmp_path / "report.png"
    r = subprocess.run([exe, *FLAGS, f"--user-data-dir={tmp_path / 'ud2'}", "--window-size=1100,1400",
                        f"--screenshot={shot}", page.as_uri()], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and shot.exists() and shot.stat().st_size > 20_000


def test_chart_bars_are_the_ledger(seed_plan):
    from memfit.render.charts import stacks

    plan, _ = seed_plan
    for ph in plan.phases:
        assert sum(stacks(ph, "gpu").values()) == ph.gpu_peak_bytes
        assert sum(stacks(ph, "host").values()) == ph.node_cpu_peak_bytes


def test_markdown_report(seed_plan):
    plan, sc = seed_plan
    md = markdown_report(plan, sc)
    assert "| initialize.move |" in md and "## Findings" in md


def test_report_never_overwrites(tmp_path):
    target = tmp_path / "mine.html"
    target.write_text("my own file")
    r = subprocess.run([sys.executable, "-m", "memfit.cli", "plan", str(SEED), "--report", str(target)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "never overwrites" in r.stderr
    assert target.read_text() == "my own file"


@pytest.mark.parametrize("cmd", [
    ["recommend", str(SEED), "--top", "2"],
    ["diagnose", str(SEED), "--log", "tests/fixtures/logs/seed-pinned-partition-ds0510.txt"],
])
def test_recommend_and_diagnose_reports(tmp_path, cmd):
    from conftest import ROOT

    page = tmp_path / "r.html"
    r = subprocess.run([sys.executable, "-m", "memfit.cli", *cmd, "--report", str(page)], capture_output=True, text=True,
                       timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    md = tmp_path / "r.md"
    r = subprocess.run([sys.executable, "-m", "memfit.cli", *cmd, "--report", str(md)], capture_output=True, text=True,
                       timeout=300, cwd=ROOT)
    assert r.returncode == 0 and "## The plan" in md.read_text()
    exe = _chromium()
    dom = subprocess.run([exe, *FLAGS, f"--user-data-dir={tmp_path / 'ud'}", "--dump-dom", page.as_uri()],
                         capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0
    assert ("Configurations that fit" in dom.stdout) or ("Diagnosis" in dom.stdout)
    assert dom.stdout.count("<svg") == 2
