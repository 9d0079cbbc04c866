"""A published, measured GPU run (``tests/fixtures/public_runs/<id>.yaml``), read into a typed case.

The format is the corpus's own (its README): the source, the stack, an inline memfit ``scenario:``,
``measurements:`` (each with its ``kind``, the ``phases_covered`` window in memfit's phases, the
bytes as published and what they are ``per``) and the run's ``outcome``. A case is read through
memfit's bounded reader (size cap, safe YAML, alias budget); nothing in it executes. A malformed
case is one ``MemfitError`` line.

Measurement kinds and the plan figure each is compared with, like for like (the README's table):
``allocated``/``peak_allocated`` -> ``gpu_allocated_bytes``, ``reserved``/``peak_reserved`` ->
``gpu_reserved_bytes``, ``nvidia_smi`` -> ``gpu_nvidia_smi_bytes``, ``host_rss`` ->
``cpu_locked_peak_bytes`` (per process), ``host_used_machine`` -> ``node_cpu_locked_peak_bytes``;
``failed_request`` (the size an OOM message names) has no plan figure and is kept for the record.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from memfit.core.lean_dataclass import dataclass
from memfit.core.hardware import MAX_SIZE_BYTES
from memfit.errors import MemfitError

KIND_FIGURE = {
    "allocated": "gpu_allocated_bytes", "peak_allocated": "gpu_allocated_bytes",
    "reserved": "gpu_reserved_bytes", "peak_reserved": "gpu_reserved_bytes",
    "nvidia_smi": "gpu_nvidia_smi_bytes",
    "host_rss": "cpu_locked_peak_bytes", "host_used_machine": "node_cpu_locked_peak_bytes",
    "failed_request": "",
}
"""The ``PhaseLedger`` field a measurement kind is compared with (empty: none)."""

FIGURE_KINDS = {"allocated": "allocated", "peak_allocated": "allocated", "reserved": "reserved",
                "peak_reserved": "reserved", "nvidia_smi": "nvidia-smi", "host_rss": "host",
                "host_used_machine": "host"}
"""The accuracy table's figure kind of each measurement kind (issue 19: allocated, reserved,
nvidia-smi, host)."""

OUTCOMES = ("fits", "oom-gpu", "oom-host", "oom-pinned", "oom-unknown")

WINDOWS = ("whole-run", "whole-run+save", "training", "first-step", "steady-state", "initialize", "load")
"""Named windows of ``phases_covered`` (the README); an explicit phase name or list is also accepted."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Measurement:
    kind: str
    window: tuple[str, ...]
    """``phases_covered`` as written: one window name, or phase names."""
    bytes: int
    per: str
    instrument: str
    phase: str
    """The source's own words for when it was taken."""
    bound: str = ""
    """``lower``: the run needed at least this much (e.g. RAM that filled up); else an exact reading."""
    approximate: bool = False

    @property
    def figure(self) -> str:
        return KIND_FIGURE[self.kind]

    @property
    def figure_kind(self) -> str:
        return FIGURE_KINDS.get(self.kind, "")


@dataclass(frozen=True, slots=True, kw_only=True)
class PublicRun:
    id: str
    path: Path
    url: str
    outcome: str
    measurements: tuple[Measurement, ...]
    scenario: dict[str, Any]
    """The inline scenario mapping, exactly as ``memfit plan`` takes a scenario file."""
    gaps: tuple[str, ...] = ()
    """``memfit_gaps``: what the case could not express, in the collector's words."""
    outcome_evidence: str = ""
    stack: tuple[tuple[str, str], ...] = ()
    """The case's ``stack:`` as published, (library, text) for each library memfit versions
    (``core/stack/releases.py:ORDER``) in the case's own words (``4.25/4.26``, ``1.12.0.dev
    (nightly)``); its other keys (``flash_attn``, ``python``, ``inferred``, ``stated``) are not
    versions memfit models. ``compare/public_run.py:case_stack`` turns it into the plan's stack."""

    @property
    def oom(self) -> bool:
        return self.outcome != "fits"


def is_public_run(raw: Any) -> bool:
    """A parsed YAML mapping that is a case (not a scenario): it has ``scenario:`` and ``outcome:``."""
    return isinstance(raw, dict) and "scenario" in raw and "outcome" in raw and "measurements" in raw


def read_public_run(path: str | Path) -> PublicRun:
    from memfit.core.reading import parse_yaml, read_text

    p = Path(path)
    raw = parse_yaml(read_text(p, what="public-run case"), what=f"public-run case {p}", dates_as_text=True)
    return public_run_from_mapping(raw, p)


def public_run_from_mapping(raw: Any, p: Path) -> PublicRun:
    if not is_public_run(raw):
        raise MemfitError(f"{p}: not a public-run case (it needs scenario:, measurements: and outcome:)")
    outcome = raw.get("outcome")
    if outcome not in OUTCOMES:
        raise MemfitError(f"{p}: outcome must be one of {', '.join(OUTCOMES)}, got {outcome!r}")
    if not isinstance(raw["scenario"], dict):
        raise MemfitError(f"{p}: scenario must be a mapping")
    ms = raw.get("measurements") or []
    if not isinstance(ms, list):
        raise MemfitError(f"{p}: measurements must be a list")
    out = []
    for i, m in enumerate(ms):
        where = f"{p}: measurements[{i}]"
        if not isinstance(m, dict):
            raise MemfitError(f"{where} must be a mapping")
        kind = m.get("kind")
        if kind not in KIND_FIGURE:
            raise MemfitError(f"{where}: kind must be one of {', '.join(KIND_FIGURE)}, got {kind!r}")
        n = m.get("bytes")
        if not isinstance(n, int) or isinstance(n, bool) or not 0 < n <= MAX_SIZE_BYTES:
            shown = f"a {len(str(n)):,}-digit number" if isinstance(n, int) and n > MAX_SIZE_BYTES else repr(n)
            raise MemfitError(f"{where}: bytes must be a positive whole number of at most 1 EiB, got {shown}")
        window = m.get("phases_covered")
        window = tuple(str(x) for x in window) if isinstance(window, list) else (str(window),) if window else ()
        if not window:
            raise MemfitError(f"{where}: phases_covered is missing")
        bound = str(m.get("bound") or "")
        out.append(Measurement(kind=kind, window=window, bytes=n, per=str(m.get("per", "")),
                               instrument=str(m.get("instrument", "")), phase=str(m.get("phase", "")),
                               bound="lower" if bound.startswith("lower") else "upper" if bound.startswith("upper") else "",
                               approximate=bool(m.get("approximate", False))))
    src = raw.get("source") if isinstance(raw.get("source"), dict) else {}
    gaps = raw.get("memfit_gaps") or []
    return PublicRun(id=str(raw.get("id", p.stem)), path=p, url=str(src.get("url", "")), outcome=outcome,
                     measurements=tuple(out), scenario=dict(raw["scenario"]),
                     gaps=tuple(str(g) for g in gaps) if isinstance(gaps, list) else (str(gaps),),
                     outcome_evidence=str(raw.get("outcome_evidence", "")), stack=_stack(raw.get("stack"), p))


def _stack(raw: Any, p: Path) -> tuple[tuple[str, str], ...]:
    from memfit.core.stack.releases import ORDER

    if raw is None:
        return ()
    if not isinstance(raw, dict):
        raise MemfitError(f"{p}: stack must be a mapping of library: version")
    return tuple((lib, str(raw[lib]).strip()) for lib in ORDER if raw.get(lib) is not None)


def read_corpus(folder: str | Path) -> tuple[PublicRun, ...]:
    """Every case of a folder (``*.yaml`` holding a case; the configs beside them are skipped), by id."""
    from memfit.core.reading import parse_yaml, read_text

    cases = []
    for f in sorted(Path(folder).glob("*.yaml")):
        raw = parse_yaml(read_text(f, what="public-run case"), what=f"public-run case {f}", dates_as_text=True)
        if is_public_run(raw):
            cases.append(public_run_from_mapping(raw, f))
    return tuple(cases)


def window_phases(window: tuple[str, ...], phases: tuple[str, ...]) -> tuple[str, ...]:
    """The plan's phases a ``phases_covered`` window spans (in run order). The Trainer's ``train()``
    window (``training``) holds its evaluations too (``eval.*``) and, with an epoch simulation, its
    peak step (``epoch.*``, also in ``steady-state``)."""
    from memfit.core.ledger_types import TRAINING_PHASES

    steps = set(TRAINING_PHASES)
    if len(window) == 1 and window[0] in WINDOWS:
        w = window[0]
        def keep(name: str) -> bool:
            if w == "whole-run":
                return name != "save"
            if w == "whole-run+save":
                return True
            if w == "training":
                return name in steps or name.startswith(("eval.", "epoch."))
            if w == "first-step":
                return name in steps and not name.startswith("step2.")
            if w == "steady-state":
                return name.startswith(("step2.", "epoch."))
            if w == "initialize":
                return name.startswith("initialize.") or name == "setup"
            return name == "load"
        return tuple(n for n in phases if keep(n))
    wanted = set(window)
    unknown = wanted - set(phases)
    if unknown == wanted:
        return ()
    return tuple(n for n in phases if n in wanted)
