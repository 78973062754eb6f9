"""Sweep progress on stderr: a one-line bar on a terminal, plain log lines otherwise.

The bar (``name [#####-----] 3/6 runs  1 failed  12s elapsed  ETA 9s``) is redrawn in place
with a carriage return each time a run finishes; messages (a failed run, the final summary)
are printed above it on their own lines. When stderr is not a terminal (a CI log, a file, a
pipe) every finished run is one log line instead, so logs stay greppable. No dependencies, no
threads: the bar moves when runs finish.
"""
from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any, TextIO


def format_seconds(seconds: float) -> str:
    """``42s``, ``3m05s`` or ``1h02m``: short enough for a progress line."""
    s = max(int(round(seconds)), 0)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def fallback_message(reasons: dict[str, int]) -> str:
    """The console line naming why runs took the general engine (``SimResult.engine_reason``)."""
    parts = [f"{why} ({n} run{'s' if n > 1 else ''})" for why, n in reasons.items()]
    return "batchsim: general engine (slower, exact) for: " + "; ".join(parts)


def rejected_phrase(label: str, rid: str, result: Mapping[str, Any]) -> str:
    """``label (run id): 20 of 20 (first reason)`` of a finished run that rejected requests."""
    n = sum(int(result.get(k) or 0) for k in ("completed", "num_rejected", "num_unfinished"))
    why = result.get("first_rejection") or "see its requests table"
    return f"{label} ({rid}): {result['num_rejected']} of {n} ({why})"


def rejected_note(phrases: list[str]) -> str:
    """The console line that says runs rejected requests (``rejected_phrase`` of each, the
    first three named): a run whose requests never fit is not an error, but never silent."""
    more = f"; and {len(phrases) - 3} more runs" if len(phrases) > 3 else ""
    return ("batchsim: requests rejected (they can never run on this deployment; every reason "
            "in runs/<id>/requests, column reason): " + "; ".join(phrases[:3]) + more)


def partial_phrase(label: str, rid: str, result: Mapping[str, Any]) -> str:
    """``label (run id): 12 of 20 unfinished`` of a run a limit stopped early."""
    n = sum(int(result.get(k) or 0) for k in ("completed", "num_rejected", "num_unfinished"))
    return f"{label} ({rid}): {int(result.get('num_unfinished') or 0)} of {n} unfinished"


def partial_note(phrases: list[str]) -> str:
    """The console line that says runs were stopped early (``partial_phrase`` of each, the
    first three named): their metrics cover only what had finished, so never silent."""
    more = f"; and {len(phrases) - 3} more runs" if len(phrases) > 3 else ""
    return ("batchsim: runs stopped early by limits.horizon_s or limits.wall_clock_s (partial: "
            "their metrics cover only the requests finished by then; summary.csv column "
            "partial): " + "; ".join(phrases[:3]) + more)


class Progress:
    """Progress of ``total`` runs of an experiment called ``name``.

    ``bar=None`` draws the bar only when ``stream`` is a terminal; ``quiet`` prints nothing.
    ``clock`` is injectable for tests.
    """

    def __init__(self, name: str, total: int, *, stream: TextIO | None = None,
                 bar: bool | None = None, quiet: bool = False,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.name, self.total = name, total
        self.stream = stream if stream is not None else sys.stderr
        self.quiet = quiet
        if bar is None:
            isatty = getattr(self.stream, "isatty", None)
            bar = bool(isatty and isatty())
        self.bar = bar and not quiet
        self.clock = clock
        self.t0 = clock()
        self.done = 0
        self.failed = 0
        self._drawn = False

    def _write(self, text: str) -> None:
        self.stream.write(text)
        self.stream.flush()

    def _clear(self) -> None:
        if self._drawn:
            self._write("\r\x1b[2K")
            self._drawn = False

    def message(self, text: str) -> None:
        """Print ``text`` on its own line (above the bar on a terminal)."""
        if self.quiet:
            return
        self._clear()
        self._write(text + "\n")
        if self.bar and 0 < self.done < self.total:
            self._draw()

    def eta(self) -> float | None:
        """Seconds left, extrapolated from the mean time per finished run."""
        if not self.done:
            return None
        return (self.clock() - self.t0) / self.done * (self.total - self.done)

    def line(self, width: int = 80) -> str:
        """The progress bar text, fitted into ``width`` columns."""
        spent = self.clock() - self.t0
        eta = self.eta()
        tail = f" {self.done}/{self.total} runs"
        if self.failed:
            tail += f"  {self.failed} failed"
        tail += f"  {format_seconds(spent)} elapsed"
        if eta is not None and self.done < self.total:
            tail += f"  ETA {format_seconds(eta)}"
        head = f"{self.name} "
        room = min(30, width - len(head) - 52)  # a fixed bar, so it does not jitter
        if room < 10:
            return (head + tail.strip())[:max(width - 1, 1)]
        filled = room * self.done // max(self.total, 1)
        return f"{head}[{'#' * filled}{'-' * (room - filled)}]{tail}"[:max(width - 1, 1)]

    def _draw(self) -> None:
        width = shutil.get_terminal_size((80, 20)).columns
        self._write("\r\x1b[2K" + self.line(width))
        self._drawn = True

    def start(self) -> None:
        """Show the empty bar (terminal only)."""
        if self.bar and self.total:
            self._draw()

    def advance(self, run_id: str, error: str | None = None) -> None:
        """Count one finished run (``error``: why it failed)."""
        self.done += 1
        self.failed += error is not None
        if self.quiet:
            return
        if self.bar:
            if error is not None:
                self.message(f"  run {run_id} FAILED: {error}")
            self._draw()
            return
        spent = self.clock() - self.t0
        eta = self.eta() or 0.0
        status = f"FAILED: {error}" if error is not None else "ok"
        self._write(f"  [{self.done}/{self.total}] run {run_id} {status} "
                    f"({spent:.1f}s elapsed, ETA {eta:.0f}s)\n")

    def close(self) -> None:
        """End the bar line (terminal only) so later output starts on a fresh line."""
        if self._drawn:
            self._write("\n")
            self._drawn = False
