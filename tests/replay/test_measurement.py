"""Measurements round-trip through JSON; fixtures are never overwritten by accident."""

from __future__ import annotations

import pytest

from memfit.errors import MemfitError
from memfit.replay.measurement import (
    AttributedItem,
    DeviceInfo,
    Measurement,
    ModelSummary,
    PhaseMeasurement,
    ReplayError,
    TimelinePoint,
    load_fixture,
    save_fixture,
)
from memfit.replay.phases import read_progress
from memfit.replay.deepspeed.record_fixtures import CASES


def _measurement() -> Measurement:
    spec = CASES["gptj_prefix_z3_offload_w2"]
    return Measurement(
        spec=spec,
        deepspeed_config_used=dict(spec.deepspeed_config, train_batch_size=2),
        substitutions=("fp16->bf16",),
        device=DeviceInfo(accelerator="cpu", name="x", total_bytes=2**34, cpu_count=2, host_ram_bytes=2**34),
        versions={"torch": "2.13.0"},
        command="python -m memfit.replay.child a b",
        model=ModelSummary(architecture="GPTJForCausalLM", params=10, trainable_params=2, param_bytes=40,
                           trainable_param_bytes=8, buffer_bytes=0, largest_param=6, largest_param_name="w",
                           num_layers=2),
        phases=(PhaseMeasurement(name="load", start_s=0.0, end_s=1.0, host_peak_bytes=40),
                PhaseMeasurement(name="forward", step=0, micro_step=0, start_s=1.0, end_s=2.0, completed=False)),
        attributed=(AttributedItem(key="zero3.ds_tensor.frozen", at="initialize", bytes=16, count=2, device="cpu",
                                   pinned=False),),
        timeline=(TimelinePoint(t_s=0.5, phase="load", host_live_bytes=40, host_pinned_bytes=0),),
        error=ReplayError(phase="forward", kind="oom", message="boom", traceback="tb"),
        wall_s=2.5,
    )


def test_json_round_trip_is_lossless():
    m = _measurement()
    again = Measurement.from_json(m.to_json())
    assert again == m
    assert again.to_json() == m.to_json()
    assert again.phase("forward", step=0).completed is False
    assert again.items("initialize") == {"zero3.ds_tensor.frozen": 16}
    assert again.peak("load", "host_peak_bytes") == 40
    with pytest.raises(KeyError):
        again.phase("save")


def test_save_fixture_refuses_to_overwrite(tmp_path):
    path = str(tmp_path / "case.json")
    m = _measurement()
    save_fixture(m, path)
    assert load_fixture(path) == m
    with pytest.raises(MemfitError, match="exists"):
        save_fixture(m, path)
    save_fixture(m, path, overwrite=True)
    assert load_fixture(path) == m


def test_progress_log_survives_a_cut_line(tmp_path):
    path = tmp_path / "out.json.progress"
    closed = PhaseMeasurement(name="load", start_s=0.0, end_s=1.0, rss_peak_bytes=5)
    import json

    row = {k: getattr(closed, k) for k in closed.__dataclass_fields__}
    path.write_text(
        json.dumps({"event": "enter", "phase": "load"}) + "\n"
        + json.dumps({"event": "close", "row": row}) + "\n"
        + json.dumps({"event": "enter", "phase": "initialize.cast"}) + "\n"
        + '{"event": "close", "ro'
    )
    phase, rows = read_progress(str(path))
    assert phase == "initialize.cast" and rows == (closed,)
