import os
import sys
from pathlib import Path

import pytest

# DeepSpeed's CPU accelerator for every test that imports deepspeed (CI has no GPU).
os.environ.setdefault("DS_ACCELERATOR", "cpu")
sys.path.insert(0, str(Path(__file__).resolve().parent))

ROOT = Path(__file__).resolve().parents[1]

# The fresh-machine guard (tests/fresh_machine.py): every open() by the checkout's code of a path
# outside the checkout, the Python installation and this session's temporary directories is
# recorded, and the session fails listing them.
from fresh_machine import OpenGuard  # noqa: E402

GUARD = OpenGuard()
sys.addaudithook(GUARD.hook)


def pytest_sessionstart(session):
    GUARD.allow_temp(session.config._tmp_path_factory.getbasetemp())


def pytest_sessionfinish(session, exitstatus):
    if GUARD.violations:
        lines = sorted({f"  {path}  (opened at {caller})" for path, caller in GUARD.violations})
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        text = ("fresh-machine guard: the checkout's code opened paths outside the checkout, the Python "
                "installation and this session's temporary directories:\n" + "\n".join(lines))
        if reporter is not None:
            reporter.write_line(text, red=True)
        else:
            print(text, file=sys.stderr)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
EXAMPLES = ROOT / "examples"
FIXTURES = ROOT / "tests" / "fixtures"
SEED = EXAMPLES / "kogpt-prefix-zero3-offload.yaml"


@pytest.fixture(scope="session")
def seed_yaml() -> Path:
    return SEED


@pytest.fixture(scope="session")
def ds0510(request, tmp_path_factory) -> Path:
    """DeepSpeed 0.5.10's source tree (``<root>/deepspeed/...``): downloaded from PyPI by pip into
    pytest's cache the first time (see tests/sdist_source.py); fails, never skips, without it."""
    from sdist_source import SourceUnavailable, deepspeed_source

    try:
        cache = getattr(request.config, "cache", None)  # None under -p no:cacheprovider: this session's tmp
        where = Path(cache.mkdir("sdists")) if cache is not None else tmp_path_factory.mktemp("sdists")
        return deepspeed_source("0.5.10", where)
    except SourceUnavailable as e:
        why = str(e)
    pytest.fail(f"DeepSpeed 0.5.10's source is needed to check memfit's 0.5.x rules and could not be had: {why}",
                pytrace=False)
