"""The fresh-machine guard itself (tests/fresh_machine.py): no test or source file reads an absolute
path outside the checkout, its venv and the temporary directories the session creates."""

from __future__ import annotations

import tempfile
from pathlib import Path

from conftest import GUARD
from fresh_machine import source_files, static_findings


def test_no_file_hands_an_absolute_path_to_the_filesystem():
    files = source_files()
    assert len(files) > 100
    assert static_findings(files) == []


def test_the_static_check_finds_the_old_ds0510_read(tmp_path):
    bad = tmp_path / "test_bad.py"
    bad.write_text('from pathlib import Path\nDS0510 = Path("/tmp/ds0510/deepspeed-0.5.10")\n'  # fresh-ok: planted for the static check to find
                   'text = open("/data/x.txt").read()\nroot = Path("/opt") / "y"\nlog = "see /proc/self/status"\n')  # fresh-ok: planted for the static check to find
    found = static_findings([bad])
    assert [f.split(": ", 1)[1] for f in found] == ["'/tmp/ds0510/deepspeed-0.5.10'", "'/data/x.txt'", "'/opt'"]


def test_the_open_guard_records_a_read_outside_and_not_inside():
    before = len(GUARD.violations)
    outside = "/nonexistent-memfit-guard-" + "x" * 8 + "/ds.json"  # the guard sees the open before it fails
    try:
        open(outside)
    except OSError:
        pass
    assert GUARD.violations[before:] and GUARD.violations[-1][0] == outside
    del GUARD.violations[before:]  # the deliberate one: not a finding of the session
    with tempfile.TemporaryDirectory() as tmp:  # a directory this session creates is allowed
        (Path(tmp) / "f").write_text("x")
        assert (Path(tmp) / "f").read_text() == "x"
    leftover = Path(tempfile.gettempdir()) / "memfit-guard-not-made-by-this-session.txt"
    try:
        open(leftover)  # guard: allowed (the test of the guard: another run's leftover in /tmp)
    except OSError:
        pass
    assert GUARD.violations[before:] and GUARD.violations[-1][0] == str(leftover)
    del GUARD.violations[before:]
    with tempfile.TemporaryFile() as f:  # an unnamed file in the temp directory (memfit.replay.ops does this)
        f.write(b"x")
    assert not GUARD.violations[before:]
