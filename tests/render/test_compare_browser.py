"""The compare report (plan vs the hand-made seed recording) renders in headless Chromium."""

import os
import shutil
import subprocess

import pytest

from memfit.core.compare import reconcile
from memfit.core.plan import make_plan
from memfit.core.records import read_records
from memfit.core.scenario.build import build_scenario
from memfit.core.scenario.read import read_scenario_file
from memfit.render.charts import timeline_chart_svg
from memfit.render.compare_out import html_sections
from memfit.render.report import html_report

from conftest import FIXTURES, SEED

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def _chromium():
    if CHROMIUM is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed (.ci/run installs Debian's chromium)")
        pytest.skip("chromium not installed (apt-get install chromium)")
    return CHROMIUM


def test_compare_report_renders(tmp_path):
    sc = build_scenario(read_scenario_file(SEED))
    plan = make_plan(sc)
    rc = reconcile(plan, read_records([FIXTURES / "records" / "seed-synthetic"]), capacity_bytes=sc.hardware.gpu.total_bytes)
    svg = timeline_chart_svg(rc.timeline, "Recorded, rank 0")
    page = tmp_path / "compare.html"
    page.write_text(html_report(plan, sc, sections=html_sections(rc), title="memfit compare",
                                figures=(("recording-chart", svg),)), encoding="utf-8")
    exe = _chromium()
    dom = subprocess.run([exe, *FLAGS, f"--user-data-dir={tmp_path / 'ud'}", "--dump-dom", page.as_uri()],
                         capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    html = dom.stdout
    assert 'id="compare-table"' in html and 'id="recording-chart"' in html and 'id="unplanned"' in html
    # the plan's two charts, then the recording's under them
    assert html.count("<svg") == 3 and html.index('id="gpu-chart"') < html.index('id="recording-chart"')
    assert "__reduce_and_partition_ipg_grads" in html and "step2.backward" in html
    shot = tmp_path / "compare.png"
    r = subprocess.run([exe, *FLAGS, f"--user-data-dir={tmp_path / 'ud2'}", "--window-size=1100,1600",
                        f"--screenshot={shot}", page.as_uri()], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and shot.exists() and shot.stat().st_size > 20_000
