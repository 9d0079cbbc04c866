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
    # pypi.org/project/deepspeed/0.5.8: deepspeed-0.5.8.tar.gz (517,831 bytes): the seed case's release
    "0.5.8": "10001b6c14398bacd5c9f39581e91d336e5d452133088e35c545af3ce40179d7",
    # pypi.org/project/deepspeed/0.19.1 and 0.19.2 (1,697,014 and 1,756,950 bytes): the params-only cast's edge
    "0.19.1": "75013c83cf0032046b34c5c9e1dfd02a5a32bfad41919e199fa30ba6fb950d4d",
    "0.19.2": "7e854b6ebe3d2bfa239f82958372927631c74e5324c7f08f17ce7ff5f6b06969",
}

WHEELS = {
    # pypi.org/project/transformers/<v>: transformers-<v>-py3-none-any.whl (pure Python)
    ("transformers", "4.15.0"): "148fdfc68d703d61f1651c98b228f10c36620eef41722911ee531bfdd4941f18",
    ("transformers", "4.20.0"): "6f14dd3f0560fed2b4fb084e2e36ba7fac8b0335ecad2b41b5368c85a8810970",
    ("transformers", "4.31.0"): "8487aab0195ce1c2a5ae189305118b9720daddbc7b688edb09ccd79e3b149f6b",
    ("transformers", "4.35.0"): "45aa9370d7d9ba1c43e6bfa04d7f8b61238497d4b646e573fd95e597fe4040ff",
    ("transformers", "4.36.0"): "e5a9d9424bcbc5008782ddd79ecbc3a50991e168cc730a14c4c89e80c61f419d",
    ("transformers", "4.38.0"): "a6d7ae9afcfcc0773d8b9ef20940344bd1cae54fe49175ddea61c7c8d11fb52a",
    ("transformers", "4.39.0"): "7801785b1f016d667467e8c372c1c3653c18fe32ba97952059e3bea79ba22b08",
    ("transformers", "5.0.0"): "587086f249ce64c817213cf36afdb318d087f790723e9b3d4500b97832afd52d",
    ("transformers", "4.51.0"): "2e6baa476735ab8adccbaee6961525a0d1ce8c21d49293af30ef5ee4b082f64d",
    ("transformers", "4.54.0"): "c96e607f848625965b76c677b2c2576f2c7b7097c1c5292b281919d90675a25e",
    # the first release whose GPT-2 and GPT-NeoX set _supports_sdpa (tests/exact/test_attention_against_sources.py)
    ("transformers", "4.42.0"): "ce44901cc81b1bcdca6f0596b3d6a067be90b4eb18ddbf60751da92483df672c",
}


def wheel_files(package: str, version: str, members: tuple[str, ...], cache_dir: Path, *,
                timeout_s: float = 300) -> dict[str, str]:
    """The text of ``members`` (paths inside the wheel) of a pure-Python wheel from PyPI, downloaded
    with its sha256 checked (``WHEELS``) and kept under ``cache_dir``."""
    import zipfile

    sha = WHEELS[(package, version)]
    root = cache_dir / f"{package}-{version}-wheel"
    done = root / ".complete"
    if not (done.is_file() and done.read_text() == sha):
        with tempfile.TemporaryDirectory(prefix="memfit-wheel-") as tmp:
            req = Path(tmp) / "requirements.txt"
            req.write_text(f"{package}=={version} --hash=sha256:{sha}\n")
            cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-deps",
                   "--only-binary", ":all:", "--require-hashes", "-r", str(req), "-d", tmp]
            try:
                r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
            except subprocess.TimeoutExpired:
                raise SourceUnavailable(f"pip download {package}=={version} took over {timeout_s:.0f} s") from None
            wheels = list(Path(tmp).glob("*.whl"))
            if r.returncode != 0 or len(wheels) != 1:
                tail = " | ".join((r.stderr or r.stdout).strip().splitlines()[-3:])
                raise SourceUnavailable(f"pip download {package}=={version} failed (exit {r.returncode}): {tail}")
            if hashlib.sha256(wheels[0].read_bytes()).hexdigest() != sha:
                raise SourceUnavailable(f"{wheels[0].name}: sha256 differs from the recorded one")
            if root.exists():
                shutil.rmtree(root)
            root.mkdir(parents=True)
            shutil.copy(wheels[0], root / "wheel.whl")
        done.write_text(sha)
    with zipfile.ZipFile(root / "wheel.whl") as z:
        return {m: z.read(m).decode("utf-8") for m in members}


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
