"""``memfit replay``'s output (issue 23 item 10): no byte count is cut at 80 columns or piped, a
closing line names the largest plan-vs-replay difference and the versions compared, and the progress
display says what the child is doing (op builds with their expected time, phases as they run).

The measurements are the committed replays of the seed scenario (tests/fixtures/replay_seed/),
compared with the plan as ``memfit replay`` compares them."""

from __future__ import annotations

import glob
import io
import re
from pathlib import Path

import pytest
from rich.console import Console

from memfit.replay.compare import compare_replay
from memfit.replay.measurement import load_fixture
from memfit.render.replay_out import closing_line, comparison_to_dict, render_comparison
from memfit.render.replay_progress import ReplayProgress

SEED = sorted(glob.glob(str(Path(__file__).resolve().parents[1] / "fixtures" / "replay_seed" / "*.json")))


@pytest.fixture(scope="module")
def seed():
    m = load_fixture(SEED[0])
    return m, compare_replay(m)


@pytest.mark.parametrize("width", [80, 100, 200])
def test_no_byte_count_is_cut_at_any_width(seed, width):
    m, c = seed
    buf = io.StringIO()
    render_comparison(c, m, Console(file=buf, width=width), plan_versions="the plan's DeepSpeed 0.19.x rules")
    text = buf.getvalue()
    assert "…" not in text
    if width < 120:  # GiB, three decimals, each the byte count's own rounding
        for i in c.items:
            assert f"{i.predicted_bytes / 2**30:,.3f}" in text
    else:
        for i in c.items:
            assert f"{i.predicted_bytes:,}" in text and f"{i.measured_bytes:,}" in text
    for i in c.items:  # differences always in bytes, whole
        assert f"{i.diff_bytes:+,}" in text


def test_the_closing_line_names_the_largest_difference_and_the_versions(seed):
    m, c = seed
    line = closing_line(c, m, "the plan's DeepSpeed 0.19.x rules, torch 2.13")
    worst = max(c.items, key=lambda i: abs(i.diff_bytes))
    assert f"largest size difference {worst.diff_bytes:+,} B ({worst.key} at {worst.at})" in line
    host = max(c.phases, key=lambda p: abs(p.diff_bytes))
    assert f"largest host-peak difference {host.diff_bytes:+,} B ({host.phase}" in line
    assert f"deepspeed {m.versions['deepspeed']}" in line and "against the plan's DeepSpeed 0.19.x rules" in line
    assert comparison_to_dict(c, m)["summary"].startswith("replay vs plan: ")


def test_progress_is_one_line_per_event_when_piped():
    buf = io.StringIO()
    with ReplayProgress(Console(file=buf, width=80), "replaying seed") as progress:
        progress({"event": "op", "op": "cpu_adam", "state": "building", "expected_s": 300.0,
                  "directory": "/root/.cache/torch_extensions/py311_cpu/cpu_adam"})
        progress({"event": "op_done", "op": "cpu_adam", "seconds": 281.4})
        progress({"event": "enter", "phase": "load", "step": None})
        # the records as the child writes them (memfit.replay.phases: PhaseRecorder's enter/close)
        from memfit.replay.measurement import PhaseMeasurement
        from memfit.replay.phases import _row_dict

        progress({"event": "close", "row": _row_dict(PhaseMeasurement(name="load", start_s=1.0, end_s=71.5))})
        progress({"event": "enter", "phase": "forward", "step": 1, "micro_step": 0})
    lines = [ln for ln in buf.getvalue().splitlines() if ln.strip()]
    assert lines[0] == "replaying seed: starting"
    assert re.search(r"building DeepSpeed's cpu_adam op \(first use; expected about 5 min", lines[1])
    assert "ready after 281.4 s" in lines[2] and "phase load running" in lines[3]
    assert "phase load done in 70.5 s (1 so far)" in lines[4] and "phase forward (step 2) running" in lines[5]


def test_the_child_announces_its_op_loads(tmp_path, monkeypatch):
    """``load_op`` writes what it is doing to the progress file the runner names
    (``MEMFIT_REPLAY_PROGRESS``), read back by the runner's tail."""
    from memfit.replay import ops
    from memfit.replay.runner import _ProgressTail

    path = tmp_path / "out.json.progress"
    monkeypatch.setenv("MEMFIT_REPLAY_PROGRESS", str(path))
    ops._announce({"event": "op", "op": "cpu_adam", "state": "loading", "expected_s": None})
    got: list[dict] = []
    tail = _ProgressTail(str(path), got.append)
    tail()
    ops._announce({"event": "op_done", "op": "cpu_adam", "seconds": 1.5})
    with open(path, "a") as fh:
        fh.write('{"event": "enter", "phase": "lo')  # a line the child is still writing: not read yet
    tail()
    assert [r["event"] for r in got] == ["op", "op_done"]
    assert ops.expected_build_s("cpu_adam") > 0 and ops.expected_build_s("deepspeed_shm_comm") is None
