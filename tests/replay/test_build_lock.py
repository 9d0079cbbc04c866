"""A DeepSpeed op build lock is never waited on forever (issue 14).

torch's JIT build lock is ``<build folder>/lock``, created with O_CREAT | O_EXCL and held open by
the builder until it removes it (torch/utils/file_baton.py). Here locks are planted in a temporary
``TORCH_EXTENSIONS_DIR`` (the machine's real cache is never touched): a *stale* one (the file, no
process holding it: what a SIGKILLed build leaves) and a *held* one (a live stand-in process keeps
it open, as a running build does).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from memfit.replay import ops
from procs import SRC, wait_until

HOLD = "import os, sys, time; fd = os.open(sys.argv[1], os.O_CREAT | os.O_EXCL); print('held', flush=True); time.sleep(600)"
REPORT_WITHIN_S = 5.0
"""A stale lock is reported after one re-check (``ops.STALE_RECHECK_S``, 0.3 s); the rest is /proc scans.
A timing bound on a shared 2-core machine, set by what it tells apart (a report, not a 60 s wait),
not by 2x an observed time."""
POLL_S = 0.5
"""``ops.wait_for_lock``'s poll interval. A wait that ends at its first look returns before any sleep,
so in less than this (observed at most 0.6 us over 20 waits); one that slept once returns after it.
The bound is what tells the two apart, not 2x the observed time (a shared machine's scheduling)."""


@pytest.fixture
def holder():
    """Start a process that holds a lock file open; yields the starter; stops what it started."""
    procs = []

    def start(path) -> subprocess.Popen:
        p = subprocess.Popen([sys.executable, "-c", HOLD, str(path)], stdout=subprocess.PIPE, text=True)
        assert p.stdout.readline().strip() == "held"
        procs.append(p)
        return p

    yield start
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()


def _plant_stale(folder):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "lock").write_bytes(b"")
    return folder


def test_a_lock_nobody_holds_is_stale_and_reported_in_one_line(tmp_path):
    folder = _plant_stale(tmp_path / "cpu_adam")
    state = ops.lock_state(str(folder))
    assert state.exists and state.stale and state.holders == ()
    t0 = time.monotonic()
    with pytest.raises(ops.BuildLockError) as err:
        ops.wait_for_lock("cpu_adam", str(folder), timeout_s=60)
    assert time.monotonic() - t0 < REPORT_WITHIN_S
    msg = err.value.message
    assert err.value.kind == "build_lock" and "\n" not in msg
    assert f"{folder}/lock" in msg and f"rm {folder}/lock" in msg and "no live process" in msg
    assert (folder / "lock").exists()  # reported, never removed by memfit


def test_a_held_lock_is_waited_on_up_to_the_timeout_and_the_expiry_says_so(tmp_path, holder):
    folder = tmp_path / "cpu_adam"
    folder.mkdir()
    p = holder(folder / "lock")
    state = ops.lock_state(str(folder))
    assert state.holders == (p.pid,) and not state.stale
    t0 = time.monotonic()
    with pytest.raises(ops.BuildLockError) as err:
        ops.wait_for_lock("cpu_adam", str(folder), timeout_s=1.0, poll_s=0.1)
    waited = time.monotonic() - t0
    assert 1.0 <= waited < 1.0 + REPORT_WITHIN_S
    assert err.value.kind == "build_lock_timeout" and "\n" not in err.value.message
    assert "timed out" in err.value.message and f"pid {p.pid}" in err.value.message and str(folder) in err.value.message


def test_a_released_lock_ends_the_wait(tmp_path, holder):
    folder = tmp_path / "cpu_adam"
    folder.mkdir()
    p = holder(folder / "lock")
    p.send_signal(signal.SIGTERM)  # the stand-in dies without removing its lock...
    p.wait()
    assert ops.lock_state(str(folder)).stale
    (folder / "lock").unlink()  # ...and the fix the report names is applied
    # a lock that is already gone ends the wait at the first look, before the first sleep
    assert 0 <= ops.wait_for_lock("cpu_adam", str(folder), timeout_s=1.0, poll_s=POLL_S) < POLL_S


WATCHER = """
import os, sys
from memfit.replay import ops
ops.wait_for_lock = lambda *a, **k: 0.0   # skip the pre-check: reach torch's own FileBaton.wait
try:
    ops.load_op("cpu_adam", timeout_s=float(sys.argv[1]))
except ops.BuildLockError as exc:
    print(exc.kind, exc.message, sep="|")
"""


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["build_lock", "build_lock_timeout"])
def test_torchs_own_unbounded_wait_is_interrupted(kind, tmp_path, holder):
    """Another process took the lock between the pre-check and the load: the process waits in
    torch's ``FileBaton.wait`` (no time limit). The watcher thread ends that wait: when the holder
    dies with the lock left behind (SIGKILL), or when the timeout runs out."""
    pytest.importorskip("deepspeed")
    folder = tmp_path / "cpu_adam"
    folder.mkdir()
    p = holder(folder / "lock")
    env = dict(os.environ, TORCH_EXTENSIONS_DIR=str(tmp_path), DS_ACCELERATOR="cpu",
               PYTHONPATH=os.pathsep.join([SRC, *filter(None, [os.environ.get("PYTHONPATH")])]))
    timeout = 600 if kind == "build_lock" else 5
    child = subprocess.Popen([sys.executable, "-c", WATCHER, str(timeout)], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        if kind == "build_lock":
            # give the child time to import deepspeed and reach the wait, then leave a stale lock
            assert wait_until(lambda: child.poll() is not None, 20) is None, child.communicate()
            p.kill()
            p.wait()
        out, err = child.communicate(timeout=300)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    got_kind, _, message = out.strip().rpartition("\n")[2].partition("|")
    assert got_kind == kind, (out, err[-2000:])
    assert str(folder) in message


@pytest.mark.slow
@pytest.mark.parametrize("held", [False, True], ids=["stale", "held"])
def test_a_replay_reports_the_lock_instead_of_hanging(held, tmp_path, holder):
    """The whole replay: a planted stale lock fails the run before ``load`` with the one line; a
    held one makes it wait ``lock_timeout_s`` and fail as ``build_lock_timeout``, never as a
    ``timeout`` of the replay."""
    import dataclasses

    from memfit.replay.deepspeed.record_fixtures import CASES
    from memfit.replay.runner import run_replay

    # the first op a cpu replay loads: deepspeed.comm's shared-memory collectives (then cpu_adam)
    folder = tmp_path / "deepspeed_shm_comm"
    if held:
        folder.mkdir()
        holder(folder / "lock")
    else:
        _plant_stale(folder)
    spec = dataclasses.replace(CASES["llama_lora_z2_offload_w4"], name="lock", steps=1, save="never")
    replay_timeout = 600  # the run must end by the lock report long before this
    m = run_replay(spec, timeout_s=replay_timeout, lock_timeout_s=3, env={"TORCH_EXTENSIONS_DIR": str(tmp_path)})
    assert m.error is not None, "the replay should have stopped at the lock"
    assert m.error.phase is None and m.error.kind == ("build_lock_timeout" if held else "build_lock"), m.error
    assert "\n" not in m.error.message and f"{folder}/lock" in m.error.message
    assert m.wall_s < replay_timeout / 4
    if not held:
        assert f"rm {folder}/lock" in m.error.message


def test_the_module_cli_reports_a_stale_lock_with_exit_status_3(tmp_path):
    pytest.importorskip("torch")
    _plant_stale(tmp_path / "cpu_adam")
    env = dict(os.environ, TORCH_EXTENSIONS_DIR=str(tmp_path),
               PYTHONPATH=os.pathsep.join([SRC, *filter(None, [os.environ.get("PYTHONPATH")])]))
    code = textwrap.dedent("""
        import sys
        from memfit.replay import ops
        ops.OPS  # the op is never built: the lock check comes first
        sys.exit(ops.main(["cpu_adam", "--timeout", "5"]))
    """)
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == ops.EXIT_BUILD_LOCK, r.stderr[-2000:]
    assert r.stderr.strip().splitlines()[-1].startswith("build_lock: stale build lock: ")
