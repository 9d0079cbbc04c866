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
