"""A replay never outlives its supervisor (issue 14), checked with SIGKILL, the signal nobody can catch.

Every process of a test carries a unique marker in its environment (``MEMFIT_TEST_MARKER``, inherited
by every descendant, torchrun's workers included); after the supervisor is SIGKILLed, /proc must hold
no live process with that marker within ``GONE_WITHIN_S``.

The fast tests use stand-in processes (no torch); the slow ones SIGKILL a supervisor running a real
replay that hangs in ``load``, with the fake launcher and with torchrun (two workers in sessions of
their own).
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from memfit.replay import supervision
from procs import describe, kill_all, marked, new_marker, start_marked, wait_until

GONE_WITHIN_S = 10.0
"""Allowed time from the supervisor's SIGKILL until no descendant is left: the watchdog's poll
(0.2 s) and grace (3 s) plus the runner-side unwinding; torchrun's own shutdown after its SIGTERM
took under 2 s in every run seen here. The fast stand-ins die within 0.1 s."""
START_WITHIN_S = 60.0
"""How long the stand-ins get to start (python start-up on a loaded 2-core machine)."""


def _sigkill_and_wait(sup: subprocess.Popen, marker: str) -> float | None:
    """Seconds from the SIGKILL until no marked process is left (None: some still are)."""
    t0 = time.monotonic()
    os.kill(sup.pid, signal.SIGKILL)
    sup.wait()
    if wait_until(lambda: not marked(marker), GONE_WITHIN_S) is None:
        return None
    return time.monotonic() - t0


@pytest.fixture
def marker():
    m = new_marker()
    yield m
    kill_all(marked(m))


def test_the_direct_child_dies_with_a_sigkilled_supervisor(marker):
    """``run_supervised`` starts its child through the PR_SET_PDEATHSIG trampoline."""
    sup = start_marked(textwrap.dedent("""
        import os, sys
        from memfit.replay.runner import run_supervised
        run_supervised([sys.executable, "-c", "import time; time.sleep(300)"], env=dict(os.environ), timeout_s=300)
    """), marker)
    assert wait_until(lambda: len(marked(marker)) == 2, START_WITHIN_S) is not None, describe(marked(marker))
    gone = _sigkill_and_wait(sup, marker)
    assert gone is not None, "left behind:\n" + describe(marked(marker))


def _launch_worker(worker: str, marker: str) -> subprocess.Popen:
    """supervisor -> launcher -> worker, the worker in a session of its own (as torchrun starts them)."""
    launcher = ("import subprocess, sys, time; "
                f"subprocess.Popen([sys.executable, '-c', {worker!r}], start_new_session=True); time.sleep(300)")
    return start_marked(textwrap.dedent(f"""
        import os, sys
        from memfit.replay.runner import run_supervised
        run_supervised([sys.executable, "-c", {launcher!r}], env=dict(os.environ), timeout_s=300)
    """), marker)


def test_a_worker_in_its_own_session_dies_by_its_watchdog(marker, tmp_path):
    """As torchrun starts its workers: a new session, no parent-death signal. The worker's watchdog
    (``guard_process``) sees the supervisor and its parent die and ends it."""
    ready = tmp_path / "ready"
    worker = ("from memfit.replay.supervision import guard_process; import time; guard_process(); "
              f"open({str(ready)!r}, 'w').close(); time.sleep(300)")
    sup = _launch_worker(worker, marker)
    assert wait_until(ready.exists, START_WITHIN_S) is not None, describe(marked(marker))
    assert len(marked(marker)) == 3, describe(marked(marker))
    gone = _sigkill_and_wait(sup, marker)
    assert gone is not None, "left behind:\n" + describe(marked(marker))


def test_the_watchdog_ends_a_process_that_ignores_sigterm(marker, tmp_path):
    """A worker stuck where SIGTERM cannot unwind it (here: ignored) is SIGKILLed after the grace."""
    ready = tmp_path / "ready"
    worker = ("import signal, time; from memfit.replay.supervision import start_watchdog; "
              "start_watchdog(); signal.signal(signal.SIGTERM, signal.SIG_IGN); "
              f"open({str(ready)!r}, 'w').close(); time.sleep(300)")
    sup = _launch_worker(worker, marker)
    assert wait_until(ready.exists, START_WITHIN_S) is not None, describe(marked(marker))
    gone = _sigkill_and_wait(sup, marker)
    assert gone is not None, "left behind:\n" + describe(marked(marker))
    assert gone >= supervision.WATCHDOG_GRACE_S  # it took the SIGKILL after the grace, not the SIGTERM


@pytest.mark.skipif(not supervision.has_pdeathsig(), reason="PR_SET_PDEATHSIG is Linux only")
def test_the_trampoline_does_not_run_the_command_when_the_supervisor_is_already_gone(tmp_path):
    """The check right after prctl: a parent other than the expected pid means the supervisor died
    before the signal was armed; the command must not start."""
    flag = tmp_path / "ran"
    argv = supervision.supervised_argv([sys.executable, "-c", f"open({str(flag)!r}, 'w').close()"])
    argv[argv.index(str(os.getpid()))] = "1"  # expect a parent this child does not have
    r = subprocess.run(argv, timeout=60)
    assert r.returncode == 143 and not flag.exists()
    ok = subprocess.run(supervision.supervised_argv([sys.executable, "-c", f"open({str(flag)!r}, 'w').close()"]),
                        timeout=60)
    assert ok.returncode == 0 and flag.exists()


def test_liveness_tells_a_recycled_pid_and_a_zombie_from_the_supervisor():
    me = os.getpid()
    assert supervision.alive(me, supervision.start_time(me))
    assert not supervision.alive(me, (supervision.start_time(me) or 0) + 1)  # same pid, another process
    z = subprocess.Popen([sys.executable, "-c", "pass"])
    assert wait_until(lambda: (supervision.stat_fields(z.pid) or ["Z"])[0] == "Z", START_WITHIN_S) is not None
    assert not supervision.alive(z.pid)  # exited, not yet reaped
    z.wait()


# -- real replays ------------------------------------------------------------------------------
SUPERVISOR = """
import dataclasses, sys
from memfit.replay.deepspeed.record_fixtures import CASES
from memfit.replay.runner import run_replay
spec = dataclasses.replace(CASES[{case!r}], name="sigkill", steps=1, save="never", fault="load:hang",
                           launcher={launcher!r}, threads=1)
run_replay(spec, timeout_s=1800, keep_dir={keep!r})
"""


@pytest.mark.slow
@pytest.mark.usefixtures("cpu_adam_built")
@pytest.mark.parametrize(("launcher", "case", "processes"), [
    ("fake", "llama_lora_z2_offload_w4", 2),           # supervisor, child
    ("torchrun", "gptj_prefix_z3_offload_w2", 4),      # supervisor, torchrun, two workers
])
def test_sigkill_of_the_supervisor_leaves_no_replay_process(launcher, case, processes, marker, tmp_path):
    from memfit.replay.child import rank_output_path
    from memfit.replay.phases import read_progress

    keep = str(tmp_path / "replay")
    sup = start_marked(SUPERVISOR.format(case=case, launcher=launcher, keep=keep), marker)
    out = os.path.join(keep, "out.json")
    ranks = 2 if launcher == "torchrun" else 1

    def hanging() -> bool:
        return all(read_progress(rank_output_path(out, r) + ".progress")[0] == "load" for r in range(ranks))

    reached = wait_until(lambda: hanging() or sup.poll() is not None, 600, poll_s=0.5)
    assert reached is not None and sup.poll() is None, (
        f"the replay never reached load: {(Path(keep) / 'stderr.txt').read_text(errors='replace')[-3000:]}"
        if (Path(keep) / "stderr.txt").exists() else "the replay never started")
    assert len(marked(marker)) == processes, describe(marked(marker))
    gone = _sigkill_and_wait(sup, marker)
    assert gone is not None, "left behind:\n" + describe(marked(marker))
