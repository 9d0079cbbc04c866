"""Record readers: snapshot pickles (restricted), memory_stats JSON, DeepSpeed see_memory_usage lines,
nvidia-smi CSV. Pure: none of this imports torch."""

from __future__ import annotations

import json
import pickle
import sys

import pytest

from memfit.core.records import RecordError, read_record, read_records
from memfit.core.records.ds_log import parse_ds_log
from memfit.core.records.smi_csv import parse_smi_csv
from memfit.core.records.snapshot import load_plain_pickle, parse_snapshot, read_snapshot
from memfit.core.records.stats_json import parse_stats

from conftest import FIXTURES

RECORDS = FIXTURES / "records"
MiB = 2**20


def snapshot_dict(frames=None):
    """The documented shape (torch/cuda/memory.py TypedDicts; Module.cpp: THCPModule_memorySnapshot)."""
    frames = frames if frames is not None else [{"filename": "/x/site-packages/deepspeed/runtime/engine.py", "line": 3,
                                                  "name": "_configure_distributed_model"}]
    return {
        "segments": [{"device": 0, "address": 1 << 40, "total_size": 2 * MiB, "allocated_size": 512,
                      "active_size": 512, "requested_size": 4, "stream": 0, "segment_type": "small",
                      "segment_pool_id": (0, 0), "is_expandable": False, "frames": [],
                      "blocks": [{"address": 1 << 40, "size": 512, "requested_size": 4, "state": "active_allocated",
                                  "frames": frames},
                                 {"address": (1 << 40) + 512, "size": 2 * MiB - 512, "requested_size": 0,
                                  "state": "inactive", "frames": []}]}],
        "device_traces": [[
            {"action": "segment_alloc", "addr": 1 << 40, "size": 2 * MiB, "stream": 0, "time_us": 10, "frames": frames},
            {"action": "alloc", "addr": 1 << 40, "size": 4, "stream": 0, "time_us": 11, "frames": frames,
             "compile_context": "N/A", "user_metadata": ""},
            {"action": "oom", "device_free": 123, "size": 1 << 30, "stream": 0, "time_us": 12, "frames": frames},
            {"action": "snapshot", "addr": 0, "size": 0, "stream": 0, "time_us": 13},
        ]],
        "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False", "max_split_size": -1,
                               "garbage_collection_threshold": 0.0, "expandable_segments": False,
                               "roundup_power2_divisions": {"1": 0, "2": 4}, "release_lock_on_cudamalloc": False},
        "external_annotations": [],
    }


@pytest.mark.parametrize("protocol", range(0, pickle.HIGHEST_PROTOCOL + 1))
def test_snapshot_needs_no_global_at_any_protocol(protocol):
    snap = parse_snapshot(load_plain_pickle(pickle.dumps(snapshot_dict(), protocol=protocol), "s"))
    seg = snap.segments[0]
    assert seg.segment_type == "small" and seg.total_size == 2 * MiB and seg.pool_id == (0, 0)
    assert seg.blocks[0].requested_size == 4 and seg.blocks[0].frames[0].name == "_configure_distributed_model"
    ev = snap.traces[0].events
    assert [e.action for e in ev] == ["segment_alloc", "alloc", "oom", "snapshot"]
    assert ev[2].device_free == 123 == ev[2].addr and ev[1].time_us == 11
    assert snap.allocator.expandable_segments is False and snap.allocator.roundup_power2_divisions == ((1, 0), (2, 4))
    assert ("release_lock_on_cudamalloc", "False") in snap.allocator.other


def test_legacy_history_blocks():
    d = snapshot_dict()
    blk = d["segments"][0]["blocks"][0]
    del blk["frames"], blk["requested_size"]
    blk["history"] = [{"addr": 1 << 40, "real_size": 4, "frames": [{"filename": "a.py", "line": 1, "name": "f"}]}]
    snap = parse_snapshot(d)
    assert snap.format == "legacy" and snap.segments[0].blocks[0].requested_size == 4
    assert snap.segments[0].blocks[0].frames[0].name == "f"


def test_torch_1_13_segment_list():
    snap = parse_snapshot(snapshot_dict()["segments"])
    assert snap.traces == () and len(snap.segments) == 1


def test_shared_frames_are_converted_once():
    """torch shares frame lists between entries; a file that shares one list many times must cost no
    more than an honest one: every reference becomes the same tuple, converted once."""
    frames = [{"filename": f"f{i}.py", "line": i, "name": "g"} for i in range(2000)]
    d = snapshot_dict(frames)
    d["device_traces"] = [[{"action": "alloc", "addr": 1 << 40, "size": 4, "stream": 0, "frames": frames}] * 20000]
    snap = parse_snapshot(load_plain_pickle(pickle.dumps(d), "s"))
    events = snap.traces[0].events
    assert len(events) == 20000 and all(e.frames is events[0].frames for e in events)
    assert snap.segments[0].blocks[0].frames is events[0].frames


class _Touch:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.path}",))


class _Eval:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (eval, (f"open({str(self.path)!r}, 'w').write('x')",))


def _hostile_payloads(marker):
    inner = snapshot_dict()
    inner["segments"][0]["blocks"][0]["frames"] = [_Touch(marker)]
    yield "os.system at top", pickle.dumps(_Touch(marker))
    yield "eval nested in a block", pickle.dumps({"segments": [_Eval(marker)], "device_traces": []})
    yield "os.system inside frames", pickle.dumps(inner)
    yield "protocol 0 GLOBAL", f"cos\nsystem\n(S'touch {marker}'\ntR.".encode()
    yield "persistent id", b"\x80\x02U\x04evilQ."  # BINPERSID: pickle.Unpickler refuses without persistent_load


def test_hostile_pickles_run_nothing(tmp_path):
    marker = tmp_path / "pwned"
    for what, payload in _hostile_payloads(marker):
        path = tmp_path / "snap.pickle"
        path.write_bytes(payload)
        with pytest.raises(RecordError) as err:
            read_snapshot(path)
        msg = str(err.value)
        assert "\n" not in msg and str(path) in msg, what
        assert not marker.exists(), f"{what}: the payload ran"


def test_hostile_pickle_cli_exit_2(tmp_path, seed_yaml):
    import subprocess

    marker = tmp_path / "pwned"
    bad = tmp_path / "hostile.pickle"
    bad.write_bytes(pickle.dumps(_Touch(marker)))
    r = subprocess.run([sys.executable, "-m", "memfit.cli", "compare", str(seed_yaml), str(bad)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "system" in lines[0] and "refuses" in lines[0]  # os.system pickles as posix.system
    assert "Traceback" not in r.stderr and not marker.exists()


@pytest.mark.parametrize("data, expect", [
    (b"", "not a readable pickle"),
    (pickle.dumps(snapshot_dict())[:50], "truncated"),
    (b"PK\x03\x04rest", "zip archive"),
    (pickle.dumps({"segments": [{"address": -1, "total_size": 1}], "device_traces": []}), "negative"),
    (pickle.dumps({"segments": "x", "device_traces": []}), "not a list"),
    (pickle.dumps({"segments": [], "device_traces": [[{"action": "explode", "addr": 0, "size": 0}]]}), "explode"),
    (pickle.dumps(42), "expected a dict"),
])
def test_malformed_snapshots(tmp_path, data, expect):
    p = tmp_path / "bad.pickle"
    p.write_bytes(data)
    with pytest.raises(RecordError, match=expect):
        read_snapshot(p)


def test_segment_blocks_must_add_up():
    d = snapshot_dict()
    d["segments"][0]["blocks"].pop()
    with pytest.raises(RecordError, match="add up"):
        parse_snapshot(d)


# ----------------------------------------------------------------------------------------- stats

def test_stats_shapes():
    flat = {"allocated_bytes.all.peak": 100, "reserved_bytes.all.peak": 2048, "allocated_bytes.all.current": 50}
    nested = {"allocated_bytes": {"all": {"peak": 100, "current": 50}}, "reserved_bytes": {"all": {"peak": 2048}}}
    one = parse_stats(flat)
    assert one.phases[0].name == "recorded" and one.phases[0].device_allocated_peak_bytes == 100
    assert parse_stats(nested).phases[0].device_reserved_peak_bytes == 2048
    by_name = parse_stats({"load": flat, "forward": nested})
    assert [p.name for p in by_name.phases] == ["load", "forward"] and by_name.device == "cuda"
    listed = parse_stats({"phases": [{"name": "backward", "memory_stats": flat,
                                      "host_memory_stats": {"allocated_bytes.peak": 4096},
                                      "mem_get_info": [1000, 5000], "t_start_us": 1, "t_end_us": 2}]})
    ph = listed.phases[0]
    assert ph.pinned_held_peak_bytes == 4096 and ph.driver_used_end_bytes == 4000 and ph.device_total_bytes == 5000
    mapped = parse_stats({"phases": {"load": flat}})
    assert mapped.phases[0].name == "load"
    old_host = parse_stats({"phases": [{"name": "x", "host_memory_stats": {"allocated_bytes.all.peak": 7}}]})
    assert old_host.phases[0].pinned_held_peak_bytes == 7


@pytest.mark.parametrize("obj, expect", [
    ([1, 2], "expected a JSON object"),
    ({"load": {"foo": 1}}, "not memory_stats"),
    ({"allocated_bytes.all.peak": -5}, "negative"),
    ({"allocated_bytes.all.peak": "big"}, "not a byte count"),
    ({"allocated_bytes.all.peak": True}, "not a byte count"),
    ({"phases": [{"name": "x", "mem_get_info": [9, 5]}]}, "exceeds total"),
    ({"phases": [{"name": "x", "t_start_us": 5, "t_end_us": 1}]}, "ends before"),
    ({"format": "memfit.record.stats", "version": 99, "phases": []}, "version 99"),
    ({"format": "other", "phases": []}, "is not"),
    ({"phases": []}, "no phases"),
    ({"phases": [{"name": "x", "what": 1}]}, "no memory counters"),
])
def test_bad_stats(obj, expect):
    with pytest.raises(RecordError, match=expect):
        parse_stats(obj, path="s.json")


def test_bad_json_file(tmp_path):
    p = tmp_path / "s.json"
    p.write_text("{not json")
    with pytest.raises(RecordError, match="not valid JSON"):
        read_record(p)
    p.write_text("[" * 100000 + "]" * 100000)
    with pytest.raises(RecordError):
        read_record(p)


# ------------------------------------------------------------------------------------ DeepSpeed

DS019 = """\
[rank0]: Engine before forward
[rank0]: MA 1.2 GB         Max_MA 3.45 GB         CA 5.6 GB         Max_CA 6 GB 
[rank0]: CPU Virtual Memory:  used = 7.56 GB, percent = 12.1%
[rank0]: Engine after forward
[rank0]: MA 2.0 GB         Max_MA 4.0 GB         CA 5.6 GB         Max_CA 6 GB 
[rank0]: Engine after backward
[rank0]: MA 2.0 GB         Max_MA 4.5 GB         CA 5.6 GB         Max_CA 7 GB 
[rank0]: Engine after forward
[rank0]: MA 2.0 GB         Max_MA 4.1 GB         CA 5.6 GB         Max_CA 7 GB 
[rank0]: Engine after backward
[rank0]: MA 2.0 GB         Max_MA 4.6 GB         CA 5.6 GB         Max_CA 7 GB 
[rank0]: Engine after step
[rank0]: MA 2.0 GB         Max_MA 4.7 GB         CA 5.6 GB         Max_CA 7 GB 
[rank0]: Engine after forward
[rank0]: MA 2.0 GB         Max_MA 4.2 GB         CA 5.6 GB         Max_CA 7 GB 
[rank0]: my own note
[rank0]: MA 2.0 GB         Max_MA 4.2 GB         CA 5.6 GB         Max_CA 7 GB 
"""


def test_see_memory_usage_lines():
    rec = parse_ds_log(DS019)
    got = [(ln.message, ln.phase) for ln in rec.lines]
    assert got == [("Engine before forward", None), ("Engine after forward", "forward"),
                   ("Engine after backward", "backward"), ("Engine after forward", "accum.forward"),
                   ("Engine after backward", "accum.backward"), ("Engine after step", "optimizer_step"),
                   ("Engine after forward", "step2.forward"), ("my own note", None)]
    first = rec.lines[0]
    # DeepSpeed divides by 1024**3 and prints "GB": GiB; 2 decimals -> half of 0.01 GiB
    assert first.allocated_bytes == round(1.2 * 2**30) and first.peak_allocated_bytes == round(3.45 * 2**30)
    assert first.peak_reserved_bytes == 6 * 2**30 and first.peak_reserved_precision_bytes == 2**29
    assert first.host_used_bytes == round(7.56 * 2**30) and first.rank == 0
    assert any("name no phase" in n for n in rec.notes)


def test_see_memory_usage_variants():
    logger = ("[2022-01-20 10:00:00,000] [INFO] [utils.py:827:see_memory_usage] Engine after step\n"
              "[2022-01-20 10:00:00,000] [INFO] [utils.py:828:see_memory_usage] MA 26.38 GB         Max_MA 26.38 GB"
              "         CA 26.71 GB         Max_CA 27 GB \n")
    rec = parse_ds_log(logger)
    assert rec.lines[0].message == "Engine after step" and rec.lines[0].reserved_bytes == round(26.71 * 2**30)
    mb = parse_ds_log("After initializing ZeRO optimizer\nMA 10.5 MB         Max_MA 20.25 MB         CA 30 MB         Max_CA 40 MB \n")
    assert mb.lines[0].peak_allocated_bytes == round(20.25 * 2**20) and mb.lines[0].phase == "initialize"
    piped = parse_ds_log("[0] mp: Engine after backward\n[0] mp: MA 1.00 GB | Max_MA 2.00 GB | CA 3.00 GB | Max_CA 4.00 GB"
                         " | NV 5.00 GB | CPU Virtual Memory:  used = 9.0 GB, percent = 3%\n")
    assert piped.lines[0].phase == "backward" and piped.lines[0].peak_reserved_bytes == 4 * 2**30
    with pytest.raises(RecordError, match="no DeepSpeed see_memory_usage"):
        parse_ds_log("hello\nworld\n")


# ------------------------------------------------------------------------------------ nvidia-smi

def test_smi_variants():
    full = parse_smi_csv("timestamp, memory.used [MiB]\n2024/05/01 12:00:00.123, 1234 MiB\n2024/05/01 12:00:00.223, 1300 MiB\n")
    assert [s.used_bytes for s in full.samples] == [1234 * MiB, 1300 * MiB]
    assert full.samples[1].local_time_us - full.samples[0].local_time_us == 100_000
    nounits = parse_smi_csv("timestamp, memory.used [MiB]\n2024/05/01 12:00:00.123, 1234\n")
    assert nounits.samples[0].used_bytes == 1234 * MiB and not nounits.notes
    noheader = parse_smi_csv("2024/05/01 12:00:00.123, 1234 MiB\n2024/05/01 12:00:00.123, 99 MiB\n")
    assert [(s.gpu, s.used_bytes) for s in noheader.samples] == [(0, 1234 * MiB), (1, 99 * MiB)]
    bare = parse_smi_csv("2024/05/01 12:00:00.123, 1234\n")
    assert any("assumed MiB" in n for n in bare.notes)
    indexed = parse_smi_csv("timestamp, index, memory.used [MiB], memory.total [MiB]\n"
                            "2024/05/01 12:00:00.123, 3, 10 MiB, 80000 MiB\n2024/05/01 12:00:00.123, 1, [N/A], 80000 MiB\n")
    assert [(s.gpu, s.used_bytes) for s in indexed.samples] == [(3, 10 * MiB)] and any("[N/A]" in n for n in indexed.notes)
    memonly = parse_smi_csv("memory.used [MiB]\n512 MiB\n")
    assert memonly.samples[0].local_time_us is None


@pytest.mark.parametrize("text, expect", [
    ("timestamp, memory.total [MiB]\n2024/05/01 12:00:00.123, 5 MiB\n", "no memory.used"),
    ("timestamp, memory.used [MiB]\n2024/05/01 12:00:00.123, lots\n", "not a size"),
    ("timestamp, memory.used [MiB]\nyesterday, 5 MiB\n", "timestamp"),
    ("timestamp, memory.used [MiB]\n2024/13/45 12:00:00.123, 5 MiB\n", "not a valid date"),
    ("timestamp, memory.used [MiB]\n", "no memory.used reading"),
])
def test_bad_smi(text, expect):
    with pytest.raises(RecordError, match=expect):
        parse_smi_csv(text)


# ------------------------------------------------------------------------------------ directories

def test_synthetic_directory():
    rs = read_records([RECORDS / "seed-synthetic"])
    assert len(rs.snapshots) == 1 and len(rs.stats) == 1 and len(rs.smi) == 1 and len(rs.ds_logs) == 1
    assert rs.ranks() == (0,) and rs.stats[0].utc_offset_s == 9 * 3600
    assert any("SYNTHETIC" in n for n in rs.notes)


def test_directory_notes_and_errors(tmp_path):
    (tmp_path / "README.md").write_text("x")
    with pytest.raises(RecordError, match="no record in this directory"):
        read_records([tmp_path])
    (tmp_path / "stats.rank0.json").write_text(json.dumps({"load": {"allocated_bytes.all.peak": 1}}))
    (tmp_path / "other.rank0.json").write_text(json.dumps({"load": {"allocated_bytes.all.peak": 1}}))
    with pytest.raises(RecordError, match="two stats files for rank 0"):
        read_records([tmp_path])
    (tmp_path / "other.rank0.json").unlink()
    rs = read_records([tmp_path])
    assert rs.stats[0].rank == 0 and any("README.md: skipped" in n for n in rs.notes)
    with pytest.raises(RecordError, match="record not found"):
        read_records([tmp_path / "nope.pickle"])
    with pytest.raises(RecordError, match="at least one record"):
        read_records([])


def test_sniffing_without_extension(tmp_path):
    (tmp_path / "a").write_bytes(pickle.dumps(snapshot_dict(), protocol=4))
    (tmp_path / "b").write_text("timestamp, memory.used [MiB]\n2024/05/01 12:00:00.123, 5 MiB\n")
    (tmp_path / "c").write_text(DS019)
    (tmp_path / "d").write_text("nothing to see")
    assert type(read_record(tmp_path / "a")).__name__ == "MemorySnapshot"
    assert type(read_record(tmp_path / "b")).__name__ == "SmiRecording"
    assert type(read_record(tmp_path / "c")).__name__ == "DsLogRecording"
    with pytest.raises(RecordError, match="not a record memfit reads"):
        read_record(tmp_path / "d")
