"""The trace cache: a traced step kept on disk and reused while nothing it depends on has changed.

A trace of a 70B model costs seconds, most of them importing torch and transformers; the same
``memfit plan --exact`` run again (in a loop, in a sweep, after editing an unrelated option) needs the
same ``TraceResult``. ``trace_scenario`` looks the trace up here first, and keeps each new one.

- **The key** (``trace_key``) is a SHA-256 over everything the trace is a function of: the model's
  config as read (every key, sorted), the PEFT spec and the trace options (their reprs: frozen
  dataclasses, every field), the installed torch, transformers and peft releases, and the bytes of
  every module of the memfit package (a changed memfit, an editable checkout included, is another
  key). A model whose code is the checkpoint's own (``auto_map``: remote code memfit cannot hash) is
  never cached.
- **Where:** ``$MEMFIT_CACHE_DIR/traces``, else ``$XDG_CACHE_HOME/memfit/traces``, else
  ``~/.cache/memfit/traces``; ``MEMFIT_NO_CACHE=1`` turns it off. At most ``MAX_ENTRIES`` files are
  kept, the oldest removed first.
- **Reading** is bounded (``MAX_BYTES``) and refuses anything but a regular file; a file that cannot
  be read or decoded is not used (the step is traced again and the note says why). The file is JSON
  (no pickle: nothing in it can execute).
- **Writing** goes through ``memfit.core.writing.write_file`` (a new file beside it, renamed over:
  never through a symbolic link), and not at all when the cache folder or one it is made in is a
  symbolic link. A failed write is said in the note; the plan does not fail for it.

The plan says which it did (``TraceResult.cached``: the file read, or "" when traced).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import fields, is_dataclass
from pathlib import Path

from memfit.trace import results as R

FORMAT = 1
"""Bumped when the file layout changes."""
MAX_BYTES = 256 * 2**20
"""A cache file larger than this is not read (a 70B trace is a few MB)."""
MAX_ENTRIES = 64
"""Files kept in the cache folder; the oldest (by modification time) are removed beyond it."""
LIBRARIES = ("torch", "transformers", "peft")
_TYPES = {cls.__name__: cls for cls in (R.TraceOptions, R.MemoryBreakdown, R.ModuleBytes, R.TracePeak,
                                         R.TracedParam, R.TracedModule, R.StepEvent, R.TraceTimings,
                                         R.TraceResult)}


def cache_dir(environ: dict | None = None) -> Path | None:
    """The cache folder, or None when ``MEMFIT_NO_CACHE`` turns the cache off."""
    env = os.environ if environ is None else environ
    if env.get("MEMFIT_NO_CACHE", "").strip() not in ("", "0"):
        return None
    if env.get("MEMFIT_CACHE_DIR"):
        return Path(env["MEMFIT_CACHE_DIR"]) / "traces"
    base = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "memfit" / "traces"


def _memfit_source_digest() -> str:
    import memfit

    h = hashlib.sha256()
    root = Path(memfit.__file__).parent
    for p in sorted(root.rglob("*.py")):
        h.update(str(p.relative_to(root)).encode())
        h.update(p.read_bytes())
    return h.hexdigest()


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in LIBRARIES:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "absent"
    return out


def trace_key(config: dict, peft, options: R.TraceOptions) -> str | None:  # noqa: ANN001 (PeftSpec)
    """The key of a trace of ``config`` with ``peft`` under ``options``; None when it is not cached."""
    if config.get("auto_map"):
        return None
    payload = {"format": FORMAT, "config": config, "peft": repr(peft), "options": repr(options),
               "versions": _versions(), "memfit": _memfit_source_digest()}
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=repr).encode()).hexdigest()


# ------------------------------------------------------------------------------------- the codec
def encode(obj):  # noqa: ANN001, ANN201
    """A trace result as JSON-ready data: each dataclass a dict tagged with its class name."""
    if is_dataclass(obj):
        return {"__t": type(obj).__name__, **{f.name: encode(getattr(obj, f.name)) for f in fields(obj)}}
    if isinstance(obj, tuple):
        return [encode(x) for x in obj]
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise TypeError(f"cannot encode {type(obj).__name__}")


def decode(data):  # noqa: ANN001, ANN201
    """The inverse of ``encode`` (every sequence in the result types is a tuple)."""
    if isinstance(data, dict):
        cls = _TYPES[data["__t"]]
        return cls(**{k: decode(v) for k, v in data.items() if k != "__t"})
    if isinstance(data, list):
        return tuple(decode(x) for x in data)
    return data


# ------------------------------------------------------------------------------------- read, write
def read(key: str, folder: Path) -> tuple[R.TraceResult | None, str]:
    """The cached trace of ``key`` (None when there is none or it cannot be used) and, for the note,
    why a file that exists was not used ("" otherwise)."""
    path = folder / f"{key}.json"
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None, ""
    except OSError as e:
        return None, f"cannot read {path}: {e.strerror}"
    import stat

    if not stat.S_ISREG(st.st_mode):
        return None, f"{path} is not a regular file"
    if st.st_size > MAX_BYTES:
        return None, f"{path} is larger than {MAX_BYTES:,} B"
    try:
        with open(path, "rb") as f:
            data = json.loads(f.read(MAX_BYTES + 1))
        if data.get("format") != FORMAT or data.get("key") != key:
            return None, f"{path} is of another format"
        result = decode(data["trace"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        return None, f"{path} could not be decoded ({type(e).__name__})"
    if not isinstance(result, R.TraceResult):
        return None, f"{path} holds no trace"
    return result, ""


def _linked(folder: Path) -> Path | None:
    """The first of ``folder`` and the folders memfit makes above it (up to ``memfit``/the cache root)
    that is a symbolic link, if any."""
    for p in (folder, folder.parent):
        if os.path.islink(p):
            return p
    return None


def write(key: str, folder: Path, result: R.TraceResult) -> str:
    """Keep ``result`` under ``key``; returns "" or, for the note, why it was not kept."""
    from memfit.core.writing import write_file
    from memfit.errors import MemfitError

    link = _linked(folder)
    if link is not None:
        return f"{link} is a symbolic link; memfit never writes through one"
    try:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as e:
        return f"cannot make {folder}: {e.strerror}"
    link = _linked(folder)
    if link is not None:
        return f"{link} is a symbolic link; memfit never writes through one"
    text = json.dumps({"format": FORMAT, "key": key, "trace": encode(result)}, separators=(",", ":"))
    try:
        write_file(folder / f"{key}.json", text, what="trace cache", overwrite=True, mode=0o600)
    except MemfitError as e:
        return str(e)
    _evict(folder)
    return ""


def _evict(folder: Path) -> None:
    try:
        entries = [p for p in folder.iterdir() if p.suffix == ".json" and not p.is_symlink()]
        entries.sort(key=lambda p: p.stat().st_mtime, reverse=True)
        for p in entries[MAX_ENTRIES:]:
            p.unlink()
    except OSError:
        pass
