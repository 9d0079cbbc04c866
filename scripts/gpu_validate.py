#!/usr/bin/env python
"""The GPU validation kit: ``python scripts/gpu_validate.py --out tests/fixtures/cuda`` on one large GPU
(``--dry-run``: the same cases on the CPU with tiny sizes). See memfit/recording/gpu_kit.py and the README."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from memfit.recording.gpu_kit import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
