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
POLL_S = 0.5
"""``ops.wait_for_lock``'s poll interval."""


class FakeClock:
    """``ops``'s clock: ``sleep`` advances ``monotonic`` and is recorded, so how long a wait lasts is
    counted in the sleeps it made, not measured on a machine that may be loaded."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.now += s


@pytest.fixture
def clock(monkeypatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(ops, "time", fake)
    return fake


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


def test_a_lock_nobody_holds_is_stale_and_reported_in_one_line(tmp_path, clock):
    folder = _plant_stale(tmp_path / "cpu_adam")
    state = ops.lock_state(str(folder))
    assert state.exists and state.stale and state.holders == ()
    with pytest.raises(ops.BuildLockError) as err:
        ops.wait_for_lock("cpu_adam", str(folder), timeout_s=60)
    assert clock.sleeps == [ops.STALE_RECHECK_S]  # one re-check, then the report: no wait
    msg = err.value.message
    assert err.value.kind == "build_lock" and "\n" not in msg
    assert f"{folder}/lock" in msg and f"rm {folder}/lock" in msg and "no live process" in msg
    assert (folder / "lock").exists()  # reported, never removed by memfit


def test_a_held_lock_is_waited_on_up_to_the_timeout_and_the_expiry_says_so(tmp_path, holder, clock):
    folder = tmp_path / "cpu_adam"
    folder.mkdir()
    p = holder(folder / "lock")
    state = ops.lock_state(str(folder))
    assert state.holders == (p.pid,) and not state.stale
    with pytest.raises(ops.BuildLockError) as err:
        ops.wait_for_lock("cpu_adam", str(folder), timeout_s=1.0, poll_s=0.1)
    assert set(clock.sleeps) == {0.1} and abs(sum(clock.sleeps) - 1.0) < 0.1 + 1e-9  # polled until the timeout
    assert err.value.kind == "build_lock_timeout" and "\n" not in err.value.message
    assert "timed out" in err.value.message and f"pid {p.pid}" in err.value.message and str(folder) in err.value.message


def test_a_released_lock_ends_the_wait(tmp_path, holder, clock):
    folder = tmp_path / "cpu_adam"
    folder.mkdir()
    p = holder(folder / "lock")
    p.send_signal(signal.SIGTERM)  # the stand-in dies without removing its lock...
    p.wait()
    assert ops.lock_state(str(folder)).stale
    (folder / "lock").unlink()  # ...and the fix the report names is applied
    # a lock that is already gone ends the wait at the first look, before the first sleep
    assert ops.wait_for_lock("cpu_adam", str(folder), timeout_s=1.0, poll_s=POLL_S) == 0 and clock.sleeps == []


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
    assert "\n" not in m.error.message and f"{folder}/lock" in m.error.message  # the lock's report, not a "timeout"
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


# ---------------------------------------------------------- a build a deadline stops leaves no lock

BUILDER = """
import os, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # stuck where SIGTERM cannot unwind it: only SIGKILL ends it
fd = os.open(sys.argv[1], os.O_CREAT | os.O_EXCL)  # torch's FileBaton.try_acquire
open(sys.argv[2], "w").close()
time.sleep(600)
"""


def test_a_build_stopped_at_its_deadline_leaves_no_lock(tmp_path):
    """The replay that a test's timeout stopped while it built an op (issue 24 item 10): the stopped
    process held the lock, nobody holds it once it is gone, so the supervisor removes it. A lock it
    merely finds, or one another live process holds, stays (reported by load_op, never removed)."""
    from memfit.replay import supervision

    root = tmp_path / "torch_extensions"
    building, found = root / "fused_adam", root / "cpu_adam"
    building.mkdir(parents=True)
    _plant_stale(found)
    ready = tmp_path / "ready"
    env = dict(os.environ, TORCH_EXTENSIONS_DIR=str(root))
    # the stand-in builder takes its lock and is then stopped as a deadline stops a replay
    # (run_supervised's _kill_tree); it ignores SIGTERM, so it dies by the SIGKILL after the grace,
    # before any finally of its own could remove the lock
    proc = subprocess.Popen(supervision.supervised_argv([sys.executable, "-c", BUILDER, str(building / "lock"), str(ready)]),
                            env=env, start_new_session=True)
    try:
        assert wait_until(ready.exists, 120) is not None, "the stand-in never took its lock"
        assert ops.lock_state(str(building)).holders == (proc.pid,)
        supervision._kill_tree(proc, env)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert not (building / "lock").exists()  # the stopped build's own lock: removed
    assert (found / "lock").exists()  # found, not ours: left for load_op to report


def test_a_lock_another_process_holds_is_never_removed(tmp_path, holder):
    from memfit.replay.build_locks import release_orphaned

    folder = tmp_path / "torch_extensions" / "cpu_adam"
    folder.mkdir(parents=True)
    holder(folder / "lock")
    assert release_orphaned({str(folder / "lock")}) == [] and (folder / "lock").exists()


def test_the_watchdog_removes_its_own_lock_before_its_sigkill(tmp_path):
    """``release_own``: what a replay process's watchdog calls just before it kills its group."""
    root = tmp_path / "torch_extensions"
    (root / "fused_adam").mkdir(parents=True)
    code = ("import os, sys; from memfit.replay.build_locks import release_own; "
            "fd = os.open(sys.argv[1], os.O_CREAT | os.O_EXCL); print(release_own())")
    env = dict(os.environ, TORCH_EXTENSIONS_DIR=str(root),
               PYTHONPATH=os.pathsep.join([SRC, *filter(None, [os.environ.get("PYTHONPATH")])]))
    r = subprocess.run([sys.executable, "-c", code, str(root / "fused_adam" / "lock")], env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and "fused_adam/lock" in r.stdout, r.stderr
    assert not (root / "fused_adam" / "lock").exists()

