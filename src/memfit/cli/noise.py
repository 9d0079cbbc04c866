"""Libraries' import-time noise (bitsandbytes' "Failed to load CPU gemm_4bit_forward from
kernels-community ..." when its optional ``kernels`` package is missing) kept out of memfit's output:
their log records are captured, and shown once each, after the command, under ``--verbose``."""

from __future__ import annotations

import logging
import sys

NOISY_LOGGERS = ("bitsandbytes", "kernels")
"""Loggers whose records are captured (their whole hierarchy)."""


class LibraryNoise(logging.Handler):
    """Captures the records of ``NOISY_LOGGERS`` (no propagation to the root's last-resort stderr
    handler) and reports each distinct message once: one per logger and message template
    (``record.msg``), shown with the first record's arguments. bitsandbytes 0.50.2's
    ``backends/cpu/ops.py`` logs "Failed to load CPU gemm_4bit_forward from kernels-community: %s"
    with the exception it got, which differs with the ``kernels`` package: "No module named 'kernels'"
    without it, "Kernel repository ... could not verify publisher trust status" with kernels 0.19.1
    (installed next to transformers 5.25.0): two texts, one warning."""

    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.messages: dict[tuple[str, str], str] = {}
        """(logger, message template) -> the first record's text."""
        self._saved: list[tuple[logging.Logger, bool]] = []

    def emit(self, record: logging.LogRecord) -> None:
        key = (record.name, str(record.msg))
        if key in self.messages:
            return
        try:
            self.messages[key] = f"{record.name}: {record.getMessage()}"
        except Exception:  # a record whose arguments do not format: keep its template
            self.messages[key] = f"{record.name}: {record.msg}"

    @classmethod
    def install(cls) -> "LibraryNoise":
        handler = cls()
        for name in NOISY_LOGGERS:
            lg = logging.getLogger(name)
            handler._saved.append((lg, lg.propagate))
            lg.addHandler(handler)
            lg.propagate = False
        return handler

    def uninstall(self) -> None:
        for lg, propagate in self._saved:
            lg.removeHandler(self)
            lg.propagate = propagate

    def report(self, *, verbose: bool, stream=None) -> None:
        """Under ``--verbose``, each captured message once, on stderr."""
        if verbose:
            for msg in self.messages.values():
                print(f"memfit: (library) {msg}", file=stream or sys.stderr)
