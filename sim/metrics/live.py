"""A run's progress counted by the run itself, for a display that reads it from another thread.

``simulate(monitor=...)`` hands a monitor the run's step logs, and a display reads the
requests done off each log's last step (``sim.experiments.run_progress``). That reading
needs each replica's own log, filled as it goes, and each request served by one replica. A
disaggregated cluster has neither: a request is served by a prefill replica and then a decode
replica, and a compiled replica fills its log only when the run ends. Its logs come as
``LiveLogs`` instead: the same list, which also answers how many requests are done, how many
steps all replicas took and the simulated time reached, read from the replicas' and the
driver's state when asked (nothing is added to the loops).
"""
from __future__ import annotations

from collections.abc import Callable, Iterable

from sim.metrics.steplog import StepLog


class LiveLogs(list[StepLog]):
    """A run's step logs with its own progress counts (module docstring)."""

    def __init__(self, logs: Iterable[StepLog], done: Callable[[], int],
                 steps: Callable[[], int], reached_s: Callable[[], float]) -> None:
        super().__init__(logs)
        self._done, self._steps, self._reached_s = done, steps, reached_s

    def requests_done(self) -> int:
        """Requests finished or rejected so far."""
        return self._done()

    def num_steps(self) -> int:
        """Steps every replica has taken so far (logged or still in a compiled buffer)."""
        return self._steps()

    def reached_s(self) -> float:
        """The simulated time the run has reached."""
        return self._reached_s()

    def freeze(self) -> None:
        """Keep the counts as they are now and drop what they were read from (a run that has
        ended lets its state go before its results are assembled)."""
        done, steps, reached = self._done(), self._steps(), self._reached_s()
        self._done, self._steps, self._reached_s = (lambda: done), (lambda: steps), (
            lambda: reached)
