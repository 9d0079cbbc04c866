import os
import sys
from pathlib import Path

import pytest

# DeepSpeed's CPU accelerator for every test that imports deepspeed (CI has no GPU).
os.environ.setdefault("DS_ACCELERATOR", "cpu")
sys.path.insert(0, str(Path(__file__).resolve().parent))

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
FIXTURES = ROOT / "tests" / "fixtures"
SEED = EXAMPLES / "kogpt-prefix-zero3-offload.yaml"


@pytest.fixture(scope="session")
def seed_yaml() -> Path:
    return SEED


BUILD_TIMEOUT_S = 1800
"""A first build of DeepSpeed's cpu_adam took about 5 minutes on 2 cores; 6x that before giving up."""


@pytest.fixture(scope="session")
def cpu_adam_built() -> float:
    """DeepSpeed's cpu_adam op (and deepspeed.comm's shared-memory op), built once per test session, before any replay starts, in its own
    supervised process (``memfit.replay.ops.warm_ops``): no replay's deadline includes a build, and a
    stale build lock is a one-line failure (the folder and the safe fix), never a hang. The value is
    the wall time of loading the built op in a fresh process (importing torch and DeepSpeed
    included): tests that time a child's start-up scale their deadlines by it instead of guessing."""
    pytest.importorskip("deepspeed")
    from memfit.replay.ops import BuildLockError, warm_ops

    try:
        ops = ("cpu_adam", "deepspeed_shm_comm")  # the second: deepspeed.comm's CPU collectives
        warm_ops(ops, timeout_s=BUILD_TIMEOUT_S)  # builds if needed
        return warm_ops(ops, timeout_s=BUILD_TIMEOUT_S)  # now only imports and loads
    except (BuildLockError, RuntimeError) as exc:
        pytest.fail(str(exc), pytrace=False)
