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
    base = session.config._tmp_path_factory.getbasetemp()
    GUARD.allow_temp(base)
    # The trace cache (memfit.trace.cache) of this session only: no test reads what an earlier run left
    # in ~/.cache, and the CLI's subprocesses inherit it.
    os.environ["MEMFIT_CACHE_DIR"] = str(base / "memfit-cache")


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
TODAY = {"ds_version": "0.19", "torch_version": "2.13", "transformers_version": "5.24"}
"""Today's stack for the seed scenario (its file states the December 2021 one): the releases memfit's
current models were read from."""


@pytest.fixture(scope="session")
def seed_yaml() -> Path:
    return SEED


BUILD_TIMEOUT_S = 1800
"""A first build of DeepSpeed's cpu_adam took about 5 minutes on 2 cores; 6x that before giving up."""


@pytest.fixture(scope="session")
def ds_ops_built() -> float:
    """Every DeepSpeed op a test's replay loads (``memfit.replay.ops.OPS``: cpu_adam with an offloaded
    optimizer, fused_adam without, deepspeed.comm's shared-memory collectives), built once per test
    session, before any replay starts, in its own supervised process (``memfit.replay.ops.warm_ops``):
    no replay's deadline includes a build (a build a deadline cut short once left a stale fused_adam
    lock that failed every later replay), and a stale build lock is a one-line failure (the folder and
    the safe fix), never a hang. ``.ci/run`` builds the same ops before the tests. The value is the
    wall time of loading the built ops in a fresh process (importing torch and DeepSpeed included):
    tests that time a child's start-up scale their deadlines by it instead of guessing."""
    pytest.importorskip("deepspeed")
    from memfit.replay.ops import OPS, BuildLockError, warm_ops

    try:
        ops = tuple(OPS)
        warm_ops(ops, timeout_s=BUILD_TIMEOUT_S)  # builds if needed
        return warm_ops(ops, timeout_s=BUILD_TIMEOUT_S)  # now only imports and loads
    except (BuildLockError, RuntimeError) as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="session")
def cpu_adam_built(ds_ops_built) -> float:
    """``ds_ops_built`` by its older name (cpu_adam among the ops it builds)."""
    return ds_ops_built


@pytest.fixture(scope="session")
def ds058(request, tmp_path_factory) -> Path:
    """DeepSpeed 0.5.8's source tree (the seed case's release), fetched like ``ds0510``'s."""
    return _ds_source(request, tmp_path_factory, "0.5.8")


def sdist_cache(request, tmp_path_factory) -> Path:
    cache = getattr(request.config, "cache", None)
    return Path(cache.mkdir("sdists")) if cache is not None else tmp_path_factory.mktemp("sdists")


def _ds_source(request, tmp_path_factory, version: str) -> Path:
    from sdist_source import SourceUnavailable, deepspeed_source

    try:
        return deepspeed_source(version, sdist_cache(request, tmp_path_factory))
    except SourceUnavailable as e:
        why = str(e)
    pytest.fail(f"DeepSpeed {version}'s source is needed to check memfit's 0.5.x rules and could not be had: {why}",
                pytrace=False)


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
