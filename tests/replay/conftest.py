"""Shared by the replay tests: DeepSpeed's cpu_adam op, built once per test session.

The build happens here, before any replay starts, in its own supervised process
(``memfit.replay.ops.warm_ops``): no replay's deadline includes a build, and a stale build lock is a
one-line failure (the folder and the safe fix), never a hang. The fixture's value is the wall time
of loading the built op in a fresh process (importing torch and DeepSpeed included): tests that
time a child's start-up scale their deadlines by it instead of guessing.
"""

from __future__ import annotations

import pytest

BUILD_TIMEOUT_S = 1800
"""A first build of cpu_adam took about 5 minutes on 2 cores; 6x that before the session gives up."""


@pytest.fixture(scope="session")
def cpu_adam_built() -> float:
    pytest.importorskip("deepspeed")
    from memfit.replay.ops import BuildLockError, warm_ops

    try:
        warm_ops(("cpu_adam",), timeout_s=BUILD_TIMEOUT_S)  # builds if needed
        return warm_ops(("cpu_adam",), timeout_s=BUILD_TIMEOUT_S)  # now only imports and loads
    except (BuildLockError, RuntimeError) as exc:
        pytest.fail(str(exc), pytrace=False)
