"""Writing files for a user, never through a symbolic link: the one writer every file memfit writes
goes through (``--report``, ``recommend --out``, ``replay --save-fixture``, ``memfit.record`` and
``MemfitCallback``, the GPU kit's summaries).

- A new file is created with ``O_CREAT | O_EXCL | O_NOFOLLOW``: it fails on any existing entry of
  that name, a dangling symbolic link included (``O_EXCL`` never follows one), so nothing is written
  anywhere else and nothing is overwritten.
- Replacing a file (``overwrite=True``, asked for by the caller: ``memfit.record(overwrite=True)``,
  ``record_fixtures --overwrite``) refuses a symbolic link of that name, writes a new file beside it
  (created as above) and renames it over the old one: ``rename`` replaces the directory entry, so a
  link that appears meanwhile is replaced, not followed, and a reader never sees half a file.
- What was created is removed again if the write fails (a full disk): no half-written file stays.

The directory a caller names is used as given (a user may keep records on a linked volume); only
the file names memfit creates in it are guarded. Every failure is one ``MemfitError`` line; a file
that exists is a ``FileExistsOnDisk`` (also a ``FileExistsError``, for callers of the Python API).
"""

from __future__ import annotations

import os
from pathlib import Path

from memfit.errors import MemfitError

NEVER_OVERWRITES = "memfit never overwrites a file (choose another name)"


class FileExistsOnDisk(MemfitError, FileExistsError):
    """The target exists (a file, a directory or a link): nothing was written."""


def _reason(e: OSError) -> str:
    return e.strerror or type(e).__name__


def _flags() -> int:
    return os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def _write_fd(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def write_file(path: str | os.PathLike, data: str | bytes, *, what: str, overwrite: bool = False,
               exists_hint: str = NEVER_OVERWRITES, mode: int = 0o644) -> Path:
    """Write ``data`` (text is UTF-8) to ``path`` as described in the module docstring; returns the
    path. ``what`` names the file in messages (``--report``, ``memfit.record``); ``exists_hint``
    ends the message when the file exists and ``overwrite`` is False."""
    p = Path(path)
    payload = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    if overwrite:
        return _replace(p, payload, what=what, mode=mode)
    try:
        fd = os.open(p, _flags(), mode)
    except FileExistsError:
        raise FileExistsOnDisk(f"{what}: {p} exists; {exists_hint}") from None
    except OSError as e:
        if os.path.islink(p):  # O_NOFOLLOW's ELOOP where O_EXCL did not answer first
            raise FileExistsOnDisk(f"{what}: {p} is a symbolic link; memfit never writes through one") from None
        raise MemfitError(f"{what}: cannot create {p}: {_reason(e)}") from None
    except ValueError as e:  # a NUL byte in the path
        raise MemfitError(f"{what}: cannot create {p}: {e}") from None
    _fill(fd, p, payload, what=what)
    return p


def _fill(fd: int, p: Path, payload: bytes, *, what: str) -> None:
    try:
        try:
            _write_fd(fd, payload)
        finally:
            os.close(fd)
    except OSError as e:
        try:
            os.unlink(p)
        except OSError:
            pass
        raise MemfitError(f"{what}: cannot write {p}: {_reason(e)}") from None


def _replace(p: Path, payload: bytes, *, what: str, mode: int) -> Path:
    if os.path.islink(p):
        raise MemfitError(f"{what}: {p} is a symbolic link; memfit never writes through one (remove it, or choose "
                          "another name)")
    if os.path.isdir(p):
        raise MemfitError(f"{what}: {p} is a directory")
    tmp = None
    for attempt in range(100):
        candidate = p.with_name(f".{p.name}.{os.getpid()}.{attempt}.tmp")
        try:
            fd = os.open(candidate, _flags(), mode)
        except FileExistsError:
            continue
        except OSError as e:
            raise MemfitError(f"{what}: cannot create a file beside {p}: {_reason(e)}") from None
        tmp = candidate
        break
    if tmp is None:
        raise MemfitError(f"{what}: cannot create a file beside {p}: 100 temporary names are taken")
    _fill(fd, tmp, payload, what=what)
    try:
        os.replace(tmp, p)
    except OSError as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise MemfitError(f"{what}: cannot replace {p}: {_reason(e)}") from None
    return p


def check_new_path(path: str | os.PathLike, *, what: str, exists_hint: str = NEVER_OVERWRITES) -> Path:
    """Before long work whose result goes to ``path``: nothing of that name exists (a dangling link
    included) and its folder is a directory. The write itself is checked again (``write_file``)."""
    p = Path(path)
    try:
        exists, link, folder = os.path.lexists(p), os.path.islink(p), p.parent.is_dir()
    except OSError as e:
        raise MemfitError(f"{what}: cannot use {p}: {_reason(e)}") from None
    except ValueError as e:  # a NUL byte in the path
        raise MemfitError(f"{what}: cannot use {p}: {e}") from None
    if exists:
        raise FileExistsOnDisk(f"{what}: {p} exists" + (" (a symbolic link)" if link else "") + f"; {exists_hint}")
    if not folder:
        raise MemfitError(f"{what}: {p.parent} is not a directory")
    return p
