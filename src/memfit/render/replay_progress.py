"""``memfit replay``'s progress on stderr while the child runs: each DeepSpeed op it loads or builds
(with the expected time of a first build), each phase as it starts and ends. On a terminal one
status line is updated in place; piped, each event is its own line."""

from __future__ import annotations

import time

from rich.console import Console
from rich.text import Text


def _minutes(s: float) -> str:
    return f"{s:.0f} s" if s < 90 else f"{s / 60:.0f} min"


class ReplayProgress:
    """Feed it the child's progress records (``runner.run_replay(on_progress=...)``)."""

    def __init__(self, console: Console, title: str) -> None:
        self.console, self.title = console, title
        self.status = None
        self.t0 = time.monotonic()
        self.closed = 0

    def __enter__(self) -> "ReplayProgress":
        if self.console.is_terminal:
            self.status = self.console.status(Text(f"{self.title}: starting the child process..."))
            self.status.__enter__()
        else:
            self.console.print(Text(f"{self.title}: starting"), soft_wrap=True)
        return self

    def __exit__(self, *exc) -> None:
        if self.status is not None:
            self.status.__exit__(*exc)

    def say(self, text: str, *, keep: bool = False) -> None:
        line = f"[{time.monotonic() - self.t0:5.0f} s] {text}"
        if self.status is not None:
            self.status.update(Text(f"{self.title}: {text}"))
            if keep:
                self.console.print(Text(line, style="dim"), soft_wrap=True)
        else:
            self.console.print(Text(line), soft_wrap=True)  # one line per event in a piped log

    def __call__(self, record: dict) -> None:
        event = record.get("event")
        if event == "op":
            op, expected = record.get("op", "?"), record.get("expected_s")
            if record.get("state") == "building":
                cores = len(__import__("os").sched_getaffinity(0)) if hasattr(__import__("os"), "sched_getaffinity") \
                    else None
                how = (f"expected about {_minutes(expected)} on {cores or 'these'} core(s)" if expected
                       else "no measured build time for it; a few minutes")
                self.say(f"building DeepSpeed's {op} op (first use; {how}; cached afterwards in "
                         f"{record.get('directory', '~/.cache/torch_extensions')})", keep=True)
            else:
                self.say(f"loading DeepSpeed's {op} op (already built)")
        elif event == "op_done":
            self.say(f"DeepSpeed's {record.get('op', '?')} op ready after {record.get('seconds', 0):.1f} s", keep=True)
        elif event == "enter":
            step, micro = record.get("step"), record.get("micro_step")
            where = "" if step is None else f" (step {step + 1}" + (f", micro-step {micro + 1}" if micro else "") + ")"
            self.say(f"phase {record.get('phase')}{where} running")  # steps 0-based in the child, 1-based here
        elif event == "close":
            self.closed += 1
            row = record.get("row") or {}
            took = (row.get("end_s") or 0) - (row.get("start_s") or 0)
            self.say(f"phase {row.get('name', '?')} done in {took:.1f} s ({self.closed} so far)")
