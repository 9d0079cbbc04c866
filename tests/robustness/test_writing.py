"""memfit's one writer (memfit.core.writing) and every command that writes through it: nothing is
written through a symbolic link, nothing existing is overwritten unless asked, and a replaced file
is replaced itself (issue 24 item 7)."""

from __future__ import annotations

import errno
import json
import os

import pytest

from clirun import assert_one_line_error, cli
from conftest import SEED
from memfit.core.writing import FileExistsOnDisk, check_new_path, write_file
from memfit.errors import MemfitError


@pytest.fixture
def victim(tmp_path):
    v = tmp_path / "victim"
    v.write_text("precious\n")
    return v


def test_a_new_file_is_created_and_an_existing_one_refused(tmp_path):
    p = write_file(tmp_path / "a.txt", "x", what="test")
    assert p.read_text() == "x" and oct(p.stat().st_mode & 0o777) == "0o644"
    with pytest.raises(FileExistsOnDisk, match="a.txt exists; memfit never overwrites") as err:
        write_file(tmp_path / "a.txt", "y", what="test")
    assert isinstance(err.value, FileExistsError) and isinstance(err.value, MemfitError)
    assert p.read_text() == "x"


@pytest.mark.parametrize("overwrite", [False, True])
@pytest.mark.parametrize("dangling", [False, True])
def test_a_symlink_is_never_written_through(tmp_path, victim, overwrite, dangling):
    link = tmp_path / "out.json"
    target = tmp_path / "nowhere" if dangling else victim
    link.symlink_to(target)
    with pytest.raises(MemfitError, match="exists|symbolic link") as err:
        write_file(link, "evil", what="test", overwrite=overwrite)
    assert "\n" not in str(err.value)
    assert link.is_symlink() and victim.read_text() == "precious\n" and not (tmp_path / "nowhere").exists()


def test_overwrite_replaces_the_file_not_its_other_names(tmp_path):
    p = write_file(tmp_path / "a.json", "old", what="test")
    other = tmp_path / "hard"
    os.link(p, other)
    inode = p.stat().st_ino
    write_file(p, "new", what="test", overwrite=True)
    assert p.read_text() == "new" and p.stat().st_ino != inode and other.read_text() == "old"
    assert sorted(x.name for x in tmp_path.iterdir()) == ["a.json", "hard"]  # no temporary left
    with pytest.raises(MemfitError, match="is a directory"):
        write_file(tmp_path, "x", what="test", overwrite=True)


def test_a_failed_write_leaves_no_half_file(tmp_path, monkeypatch):
    def full(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", full)
    for overwrite in (False, True):
        with pytest.raises(MemfitError, match="No space left on device"):
            write_file(tmp_path / "a.json", "x" * 100, what="test", overwrite=overwrite)
        assert list(tmp_path.iterdir()) == []


def test_bad_paths_are_one_line(tmp_path):
    (tmp_path / "file").write_text("x")
    for bad in (tmp_path / "file" / "under.md", tmp_path / "missing" / "x.md", str(tmp_path / "nul\x00.md")):
        with pytest.raises(MemfitError) as err:
            write_file(bad, "x", what="test")
        assert "\n" not in str(err.value)
    with pytest.raises(MemfitError, match="not a directory"):
        check_new_path(tmp_path / "missing" / "x.md", what="test")


# ------------------------------------------------------------------------------ every command

def test_compare_report_never_writes_through_a_link(tmp_path, victim):
    """``memfit compare --report`` wrote with a plain ``write_text`` (it followed links)."""
    record = tmp_path / "s.json"
    record.write_text(json.dumps({"forward": {"allocated_bytes.all.peak": 2**30}}))
    for name, target in (("r.html", victim), ("r.md", tmp_path / "nowhere.md")):
        link = tmp_path / name
        link.symlink_to(target)
        assert_one_line_error(cli("compare", str(SEED), str(record), "--report", str(link)), "exists")
    assert victim.read_text() == "precious\n" and not (tmp_path / "nowhere.md").exists()
    ok = tmp_path / "ok.md"
    assert cli("compare", str(SEED), str(record), "--report", str(ok)).rc == 0 and ok.read_text().startswith("#")


def test_recommend_out_with_a_dangling_link_among_its_files_writes_nothing(tmp_path):
    first = tmp_path / "first"
    assert cli("recommend", str(SEED), "--top", "1", "--out", str(first)).rc == 0
    names = sorted(p.name for p in first.iterdir())
    out = tmp_path / "second"
    out.mkdir()
    (out / names[0]).symlink_to(tmp_path / "nowhere")
    assert_one_line_error(cli("recommend", str(SEED), "--top", "1", "--out", str(out)), "exists")
    assert [p.name for p in out.iterdir()] == [names[0]] and not (tmp_path / "nowhere").exists()


def test_replay_save_fixture_never_writes_through_a_link(tmp_path, victim):
    from memfit.replay.deepspeed.record_fixtures import CASES
    from memfit.replay.measurement import Measurement, load_fixture, save_fixture

    link = tmp_path / "m.json"
    link.symlink_to(victim)
    assert_one_line_error(cli("replay", str(SEED), "--save-fixture", str(link)), "exists")
    spec = CASES["gptj_prefix_z3_offload_w2"]
    m = Measurement(spec=spec, deepspeed_config_used=dict(spec.deepspeed_config), versions={}, command="x")
    for overwrite in (False, True):
        with pytest.raises(MemfitError, match="exists|symbolic link"):
            save_fixture(m, str(link), overwrite=overwrite)
    assert victim.read_text() == "precious\n"
    path = tmp_path / "fixture.json"
    save_fixture(m, str(path))
    save_fixture(m, str(path), overwrite=True)
    assert load_fixture(str(path)) == m
