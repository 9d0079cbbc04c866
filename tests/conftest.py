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


@pytest.fixture(scope="session")
def ds0510(request) -> Path:
    """DeepSpeed 0.5.10's source tree (``<root>/deepspeed/...``): downloaded from PyPI by pip into
    pytest's cache the first time (see tests/sdist_source.py); fails, never skips, without it."""
    from sdist_source import SourceUnavailable, deepspeed_source

    try:
        return deepspeed_source("0.5.10", Path(request.config.cache.mkdir("sdists")))
    except SourceUnavailable as e:
        why = str(e)
    pytest.fail(f"DeepSpeed 0.5.10's source is needed to check memfit's 0.5.x rules and could not be had: {why}",
                pytrace=False)
