"""An old DeepSpeed's source, fetched from PyPI with pip the first time a test needs it.

Some tests check memfit's rules against DeepSpeed 0.5.10's code (the seed case's version), which is
not installed: the sdist is downloaded with ``pip download`` (PyPI is the one network a test may
use), its sha256 checked against the one recorded here, and its ``deepspeed/`` package unpacked into
pytest's cache directory (``.pytest_cache/d/`` in the checkout), so later runs read it offline.
Nothing outside the checkout is read or written except pip's own temporary files. When the source
cannot be had, the test fails with a message saying why (it never skips: a skipped check on a fresh
machine is how the old ``/tmp/ds0510`` dependency went unnoticed).
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

SDISTS = {
    # pypi.org/project/deepspeed/0.5.10: deepspeed-0.5.10.tar.gz (515,945 bytes)
    "0.5.10": "871623ee95b2655595195b99a59f1eb3cf2eeb395fb3418d824eb62a350f7b83",
}


class SourceUnavailable(RuntimeError):
    """The sdist could not be downloaded, verified or unpacked (the message says which)."""


def deepspeed_source(version: str, cache_dir: Path, *, timeout_s: float = 300) -> Path:
    """The unpacked ``deepspeed-<version>/`` directory (holding ``deepspeed/``) under ``cache_dir``."""
    sha = SDISTS[version]
    root = cache_dir / f"deepspeed-{version}"
    done = root / ".complete"
    if done.is_file() and done.read_text() == sha:
        return root
    with tempfile.TemporaryDirectory(prefix="memfit-sdist-") as tmp:
        req = Path(tmp) / "requirements.txt"
        req.write_text(f"deepspeed=={version} --hash=sha256:{sha}\n")
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-deps",
               "--no-binary", ":all:", "--require-hashes", "-r", str(req), "-d", tmp]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise SourceUnavailable(f"pip download deepspeed=={version} took over {timeout_s:.0f} s "
                                    "(PyPI unreachable?)") from None
        archive = Path(tmp) / f"deepspeed-{version}.tar.gz"
        if r.returncode != 0 or not archive.is_file():
            tail = " | ".join((r.stderr or r.stdout).strip().splitlines()[-3:])
            raise SourceUnavailable(f"pip download deepspeed=={version} failed (exit {r.returncode}): {tail}")
        got = hashlib.sha256(archive.read_bytes()).hexdigest()
        if got != sha:  # pip checked it already; this guards against a changed pip behaviour
            raise SourceUnavailable(f"deepspeed-{version}.tar.gz has sha256 {got}, expected {sha}")
        if root.exists():
            shutil.rmtree(root)
        root.mkdir(parents=True)
        prefix = f"deepspeed-{version}/deepspeed/"
        with tarfile.open(archive) as tar:
            members = [m for m in tar.getmembers() if m.name.startswith(prefix) and (m.isfile() or m.isdir())]
            if not members:
                raise SourceUnavailable(f"deepspeed-{version}.tar.gz has no {prefix} directory")
            tar.extractall(cache_dir, members=members, filter="data")
    done.write_text(sha)
    return root
