"""memfit.record and MemfitCallback on CPU: phases marked and named, what CPU allows recorded (RSS),
the files readable by memfit compare."""

from __future__ import annotations

import json
import os

import pytest

from memfit.core.records import read_records
from memfit.recording import StepNamer

torch = pytest.importorskip("torch")


def test_step_namer():
    n = StepNamer()
    seq = ["load", "initialize", "forward", "backward", "forward", "backward", "optimizer_step",
           "forward", "backward", "optimizer_step", "forward", "backward", "optimizer_step", "save"]
    assert [n.name(s)[0] for s in seq] == [
        "load", "initialize", "forward", "backward", "accum.forward", "accum.backward", "optimizer_step",
        "step2.forward", "step2.backward", "step2.optimizer_step", "step2.forward", "step2.backward",
        "step2.optimizer_step", "save"]
    n = StepNamer()
    assert n.name("backward") == ("backward", 1, 1)  # a step without a forward mark is still step 1


def test_record_plain_loop(tmp_path):
    import memfit

    with memfit.record(tmp_path / "rec") as rec:
        with rec.phase("load"):
            model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))
        with rec.phase("setup"):
            opt = torch.optim.AdamW(model.parameters())
        for _ in range(3):
            with rec.phase("forward"):
                loss = model(torch.randn(32, 64)).square().mean()
            with rec.phase("backward"):
                loss.backward()
            with rec.phase("optimizer_step"):
                opt.step()
                opt.zero_grad()
    doc = json.loads((tmp_path / "rec" / "stats.rank0.json").read_text())
    names = [p["name"] for p in doc["phases"]]
    assert names == ["load", "setup", "forward", "backward", "optimizer_step"] + ["step2.forward", "step2.backward",
                                                                                  "step2.optimizer_step"] * 2
    assert doc["device"] == "cpu" and any("keeps no statistics" in n for n in doc["notes"])
    for p in doc["phases"]:
        assert p["rss_peak_bytes"] >= p["rss_end_bytes"] > 0 and p["t_end_us"] >= p["t_start_us"] and p["completed"]
        assert "memory_stats" not in p  # nothing to read on CPU: nothing pretended
    assert doc["overhead_s"] > 0
    rs = read_records([tmp_path / "rec"])
    assert rs.stats[0].device == "cpu" and rs.stats[0].phases[0].rss_peak_bytes > 0


def test_record_keeps_a_failed_phase(tmp_path):
    import memfit

    with pytest.raises(RuntimeError, match="boom"):
        with memfit.record(tmp_path / "rec") as rec:
            with rec.phase("forward"):
                raise RuntimeError("boom")
    doc = json.loads((tmp_path / "rec" / "stats.rank0.json").read_text())
    assert doc["phases"][0]["completed"] is False and "boom" in doc["phases"][0]["error"]
    assert any("the run failed" in n for n in doc["notes"])
    with pytest.raises(FileExistsError):
        with memfit.record(tmp_path / "rec"):
            pass
    rec = memfit.record(tmp_path / "other")
    with pytest.raises(RuntimeError, match="outside the recording"):
        rec.mark("load")
    with pytest.raises(ValueError, match="cuda"):
        memfit.record(tmp_path / "x", device="tpu").start()


def test_snapshot_request_on_cpu_is_said(tmp_path):
    import memfit

    with memfit.record(tmp_path / "rec", snapshot=True) as rec:
        rec.mark("load")
    doc = json.loads((tmp_path / "rec" / "stats.rank0.json").read_text())
    assert doc["snapshot_file"] is None and any("snapshot=True ignored" in n for n in doc["notes"])


def test_memfit_callback_in_a_trainer(tmp_path):
    """A tiny llama (from a config, no hub) trained 3 steps with gradient accumulation and a save."""
    transformers = pytest.importorskip("transformers")
    from memfit.integrations import MemfitCallback

    cb = MemfitCallback(tmp_path / "rec")
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg)
    data = [{"input_ids": torch.randint(0, 128, (16,)), "labels": torch.randint(0, 128, (16,))} for _ in range(16)]
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=3, per_device_train_batch_size=2,
                                          gradient_accumulation_steps=2, use_cpu=True, report_to=[], save_strategy="steps",
                                          save_steps=2, logging_steps=100, disable_tqdm=True)
    transformers.Trainer(model=model, args=args, train_dataset=data, callbacks=[cb]).train()
    doc = json.loads((tmp_path / "rec" / "stats.rank0.json").read_text())
    names = [p["name"] for p in doc["phases"]]
    step2 = ["step2.forward", "step2.backward"] * 2 + ["step2.optimizer_step"]
    assert names == ["load", "setup", "forward", "backward", "accum.forward", "accum.backward", "optimizer_step",
                     *step2, "save", *step2, "save"]
    assert all(p["rss_peak_bytes"] > 0 for p in doc["phases"])
    assert cb.files == [tmp_path / "rec" / "stats.rank0.json"]
    assert [p.name for p in read_records([tmp_path / "rec"]).stats[0].phases] == names


def test_record_cuda_branch_with_torch_cuda_patched(tmp_path, monkeypatch):
    """The CUDA code path on a CPU machine: torch.cuda's counters replaced by fakes that count calls
    (as torchtitan's CPU tests patch the device). Checks the file holds what the recorder read."""
    from conftest import FIXTURES

    import memfit

    calls: list[str] = []
    state = {"n": 0}

    def memory_stats():
        state["n"] += 1
        return {"allocated_bytes.all.peak": 1000 * state["n"], "allocated_bytes.all.current": 10,
                "requested_bytes.all.peak": 900 * state["n"], "reserved_bytes.all.peak": 2**21,
                "reserved_bytes.all.current": 2**21, "num_ooms": 0, "num_alloc_retries": 0, "note": "skipped: text"}

    class Props:
        name = "Fake GPU"

    cuda = torch.cuda
    for name, fn in {
        "is_available": lambda: True, "init": lambda: calls.append("init"), "synchronize": lambda: calls.append("sync"),
        "reset_peak_memory_stats": lambda: calls.append("reset"), "reset_peak_host_memory_stats": lambda: None,
        "memory_stats": memory_stats, "host_memory_stats": lambda: {"allocated_bytes.peak": 4096, "host_alloc_time.avg": 1.5},
        "mem_get_info": lambda: (7 * 2**30, 8 * 2**30), "current_device": lambda: 0,
        "get_device_properties": lambda i: Props(),
    }.items():
        monkeypatch.setattr(cuda, name, fn)
    import pickle

    snap = pickle.loads((FIXTURES / "records" / "allocator-exact" / "snapshot.pickle").read_bytes())
    monkeypatch.setattr(cuda.memory, "_record_memory_history", lambda *a, **k: calls.append(f"history {k}"))
    # what _dump_snapshot pickles; memfit.record writes it itself, through its own writer
    monkeypatch.setattr(cuda.memory, "_snapshot", lambda *a, **k: snap)
    monkeypatch.setattr(cuda.memory, "_dump_snapshot", lambda *a, **k: pytest.fail("_dump_snapshot follows links"))
    with memfit.record(tmp_path / "rec", snapshot=True, max_entries=1234) as rec:
        with rec.phase("load"):
            pass
        rec.mark("forward", step=1, micro_step=2)
    doc = json.loads((tmp_path / "rec" / "stats.rank0.json").read_text())
    assert calls[0] == "init" and calls[1] == "history {'max_entries': 1234}" and "history {'enabled': None}" in calls
    assert doc["device"] == "cuda" and doc["device_name"] == "Fake GPU (cuda:0)" and doc["snapshot_file"] == "snapshot.rank0.pickle"
    assert [p["name"] for p in doc["phases"]] == ["load", "accum.forward"]
    load = doc["phases"][0]
    assert load["memory_stats"]["allocated_bytes.all.peak"] == 1000 and "note" not in load["memory_stats"]
    assert load["host_memory_stats"] == {"allocated_bytes.peak": 4096, "host_alloc_time.avg": 1.5}
    assert load["mem_get_info"] == [7 * 2**30, 8 * 2**30]
    rs = read_records([tmp_path / "rec"])
    ph = rs.stats[0].phases[0]
    assert (ph.device_allocated_peak_bytes, ph.pinned_held_peak_bytes, ph.driver_used_end_bytes) == (1000, 4096, 2**30)
    assert rs.snapshots[0].rank == 0 and len(rs.snapshots[0].segments) == 3


# ------------------------------------------------------------------ nothing written through a link

def _victim(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    return victim


@pytest.mark.parametrize("overwrite", [False, True])
def test_record_never_writes_through_a_symlink(tmp_path, overwrite):
    """Issue 24 item 7: ``ln -s ../victim d/stats.rank0.json``, then ``with memfit.record("d")``."""
    import memfit
    from memfit.errors import MemfitError

    victim = _victim(tmp_path)
    d = tmp_path / "d"
    d.mkdir()
    (d / "stats.rank0.json").symlink_to("../victim")
    with pytest.raises(MemfitError, match="symbolic link") as err:
        with memfit.record(d, overwrite=overwrite):
            pass
    assert "\n" not in str(err.value) and isinstance(err.value, FileExistsError)
    assert victim.read_text() == "precious\n" and (d / "stats.rank0.json").is_symlink()
    dangling = tmp_path / "e"
    dangling.mkdir()
    (dangling / "stats.rank0.json").symlink_to(tmp_path / "nowhere")
    with pytest.raises(MemfitError, match="symbolic link"):
        with memfit.record(dangling, overwrite=overwrite):
            pass
    assert not (tmp_path / "nowhere").exists()


def test_a_link_that_appears_during_the_recording_is_not_followed(tmp_path):
    """The name is checked when the recording starts and the file is created with O_EXCL | O_NOFOLLOW
    when it ends: a link planted meanwhile makes the write fail, it is never followed; with
    overwrite=True the link itself is refused, its target untouched."""
    import memfit
    from memfit.errors import MemfitError

    victim = _victim(tmp_path)
    for overwrite in (False, True):
        d = tmp_path / f"d{overwrite}"
        with pytest.raises(MemfitError, match="symbolic link|exists"):
            with memfit.record(d, overwrite=overwrite):
                (d / "stats.rank0.json").symlink_to(victim)
        assert victim.read_text() == "precious\n"


def test_overwrite_replaces_the_file_itself(tmp_path):
    import memfit

    d = tmp_path / "d"
    with memfit.record(d) as rec:
        rec.mark("load")
    first = (d / "stats.rank0.json").stat().st_ino
    hard = tmp_path / "hardlink.json"
    os.link(d / "stats.rank0.json", hard)  # a second name for the old file: it must keep the old content
    before = hard.read_text()
    with memfit.record(d, overwrite=True) as rec:
        rec.mark("setup")
    assert (d / "stats.rank0.json").stat().st_ino != first  # a new file renamed over the old one
    assert hard.read_text() == before and [p["name"] for p in json.loads((d / "stats.rank0.json").read_text())["phases"]] == ["setup"]
    assert sorted(p.name for p in d.iterdir()) == ["stats.rank0.json"]  # no temporary left behind


def test_memfit_callback_never_writes_through_a_symlink(tmp_path):
    pytest.importorskip("transformers")
    from memfit.errors import MemfitError
    from memfit.integrations import MemfitCallback

    victim = _victim(tmp_path)
    d = tmp_path / "d"
    d.mkdir()
    (d / "stats.rank0.json").symlink_to(victim)
    with pytest.raises(MemfitError, match="symbolic link"):
        MemfitCallback(d)
    with pytest.raises(MemfitError, match="symbolic link"):
        MemfitCallback(d, overwrite=True)
    assert victim.read_text() == "precious\n"
