"""Progress inside one long run, on a terminal: simulated time, requests done, rate and ETA.

``simulate(monitor=...)`` hands over the run's step logs and arrival times; a daemon thread
reads the last step of each log every ``interval_s`` of wall time and draws a tqdm bar. The
engine loops are untouched (no callback per step), so a run costs the same with or without
it. Requests done = arrived − waiting − running at the start of each replica's last step
(``done_before``; rejected requests count as done). Runs shorter than one interval draw nothing.
A compiled replica (``sim.engine.compiled``) fills its log when it ends, so its bar moves at
replica boundaries. A disaggregated cluster's logs count for themselves
(``sim.metrics.live.LiveLogs``): every replica's steps, general or compiled, and the requests
finished or rejected, wherever they finished.
"""
from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any, TextIO

import numpy as np

from sim.metrics.live import LiveLogs
from sim.metrics.summary import StepLog

#: Wall seconds between two redraws (and before the first one).
INTERVAL_S = 0.5


def done_before(arrivals: np.ndarray, start_s: float, num_waiting: int, num_seqs: int) -> int:
    """Requests done (finished or rejected) when a step starts at ``start_s``: those arrived
    by then (arrivals at ``start_s`` included: the step's plan saw them) less the ones waiting
    and running in that step. Exact when every running request runs in the step (chunked
    prefill, any decode step); a prefill-only step of continuous batching pauses the running
    decodes, which then count as done until the next decode step (the bar never moves back)."""
    arrived = int(np.searchsorted(arrivals, start_s, side="right"))
    return max(arrived - num_waiting - num_seqs, 0)


def requests_done(logs: Sequence[StepLog], arrivals: np.ndarray) -> tuple[int, float]:
    """(requests done, simulated seconds reached) from the last step of each log.

    With one log per replica (the fast path), replica ``k`` serves arrivals ``k, k + R, ...``;
    a shared log (the general engine) counts against every arrival. Exact for one replica
    whose running requests all run each step (see ``done_before``). ``LiveLogs`` count their
    own (exact).
    """
    if isinstance(logs, LiveLogs):
        return min(logs.requests_done(), len(arrivals)), logs.reached_s()
    done, now_max = 0, 0.0
    per_replica = len(logs) > 1
    for k, log in enumerate(logs):
        last = log.latest()
        if last is None:
            continue
        start, duration, waiting, running = last
        now_max = max(now_max, start + duration)
        share = arrivals[k::len(logs)] if per_replica else arrivals
        done += done_before(share, start, int(waiting), int(running))
    return min(done, len(arrivals)), now_max


def steps_taken(logs: Sequence[StepLog]) -> int:
    """Steps the run has taken so far (those in the logs, or ``LiveLogs``' own count)."""
    if isinstance(logs, LiveLogs):
        return logs.num_steps()
    return sum(len(log) for log in logs)


class RunProgress:
    """A tqdm bar for one run, drawn from a thread; use as ``with RunProgress(...) as p:
    simulate(..., monitor=p.attach)``.

    ``enabled=None`` draws only when ``stream`` is a terminal. ``clock`` and
    ``bar_factory`` are injectable for tests.
    """

    def __init__(self, label: str, *, stream: TextIO | None = None,
                 enabled: bool | None = None, interval_s: float | None = None,
                 clock: Callable[[], float] = time.perf_counter,
                 bar_factory: Callable[..., Any] | None = None) -> None:
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        if enabled is None:
            isatty = getattr(self.stream, "isatty", None)
            enabled = bool(isatty and isatty())
        self.enabled = enabled
        self.interval_s = INTERVAL_S if interval_s is None else interval_s
        self.clock = clock
        self.bar_factory = bar_factory
        self.logs: Sequence[StepLog] = ()
        self.arrivals = np.empty(0)
        self.bar: Any = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.t0 = clock()

    def attach(self, logs: Sequence[StepLog], arrivals: np.ndarray) -> None:
        """The ``monitor`` of ``simulate``: start watching ``logs`` (called again, as when a
        run starts over on the reference engine: watch the new ones, on the same bar)."""
        self.logs, self.arrivals = logs, np.asarray(arrivals, dtype=float)
        if self._thread is not None:
            return
        self.t0 = self.clock()
        if self.enabled and len(self.arrivals):
            # made now, so its rate and ETA count from the run's start; ``delay`` keeps a run
            # shorter than one interval from drawing anything
            factory = self.bar_factory or _tqdm
            self.bar = factory(total=len(self.arrivals), desc=self.label, unit="req",
                               file=self.stream, leave=False, dynamic_ncols=True,
                               mininterval=0.0, smoothing=0.1, delay=self.interval_s)
            self._thread = threading.Thread(target=self._watch, name="batchsim-progress",
                                            daemon=True)
            self._thread.start()

    def _watch(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.update()

    def update(self) -> None:
        """Redraw the bar from the logs (the thread calls this; tests call it directly)."""
        if self.bar is None:
            return
        done, now = requests_done(self.logs, self.arrivals)
        span = float(self.arrivals[-1])
        steps = steps_taken(self.logs)
        self.bar.set_postfix_str(f"sim {now:.1f} s (arrivals to {span:.1f} s), "
                                 f"{steps:,} steps", refresh=False)
        if done > self.bar.n:
            self.bar.update(done - self.bar.n)  # draws (mininterval 0)
        else:
            self.bar.refresh()

    def close(self) -> None:
        """Stop the thread and erase the bar."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def __enter__(self) -> RunProgress:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def _tqdm(**kwargs: Any) -> Any:
    from tqdm import tqdm

    return tqdm(**kwargs)
