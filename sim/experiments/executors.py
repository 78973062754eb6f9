"""Where runs execute: one after the other here, or over a local process pool (``--jobs``).

Both call the same ``execute_run`` on the same arguments, so results are identical. A pool
worker that dies (the out-of-memory killer, ``kill -9``) breaks a ``ProcessPoolExecutor`` and
every run in flight with it, and nothing says which run was to blame. So at most ``jobs`` runs
are in flight at once; when the pool breaks, those runs are retried one at a time, each alone
in a fresh one-worker pool: a run whose worker dies while it runs alone is recorded as failed
(``error.txt``) and the sweep goes on in a fresh pool. Other errors from a worker (a full disk:
``OSError``) stop the sweep; a run's own exception never reaches here (``execute_run`` records
it).
"""
from __future__ import annotations

import os
import signal
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

from sim.core.errors import EnvironmentFailure, InputError
from sim.core.fields import is_integer, not_one_of
from sim.experiments.results import write_text
from sim.experiments.runner import execute_run

#: One run's ``execute_run`` arguments: (resolved config, base folder, run folder).
RunArgs = tuple[dict[str, Any], str, str]
#: Called with (run id, summary or ``{"error": ...}``) as each run finishes.
OnDone = Callable[[str, dict[str, Any]], None]


#: Where ``batchsim run`` may execute its runs (``--executor``).
EXECUTORS = ("local", "dask")
#: Most worker processes ``--jobs`` may ask for per CPU of this machine: runs are CPU-bound, so
#: more only wait for a core while each holds its memory, and a slip such as ``--jobs 10000``
#: would start ten thousand Python processes.
JOBS_PER_CPU = 4


def check_jobs(jobs: Any) -> int:
    """``--jobs`` (``jobs=`` from Python), checked: a whole number from 1 to ``JOBS_PER_CPU``
    per CPU of this machine; the one rule of ``batchsim run`` and ``batchsim capacity``."""
    limit = JOBS_PER_CPU * (os.cpu_count() or 1)
    if not is_integer(jobs) or not 1 <= jobs <= limit:
        raise InputError(f"must be a whole number from 1 to {limit} ({JOBS_PER_CPU} per CPU of "
                         f"this machine), got {jobs!r}", field="--jobs")
    return int(jobs)


def check_executor(executor: Any, address: Any) -> None:
    """``--executor`` is one of ``EXECUTORS``, and ``--address`` (a Dask scheduler) goes with
    ``dask`` only: a local run would silently ignore it."""
    if executor not in EXECUTORS:
        raise InputError(not_one_of(executor, EXECUTORS), field="--executor")
    if address is not None and executor != "dask":
        raise InputError(f"a Dask scheduler address ({address!r}) needs --executor dask",
                         field="--address")


#: How often a pool worker checks that the command that started it is still alive (seconds).
PARENT_POLL_S = 0.25


def worker_init() -> None:
    """Pool worker initializer: Ctrl-C is handled by the parent, which stops the workers; a
    worker whose parent is gone exits (``exit_with_parent``)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    exit_with_parent(os.getppid())


def exit_with_parent(parent: int) -> None:
    """Exit this process soon after ``parent`` (the command) dies, however it died.

    A parent killed by ``kill -9`` (or the out-of-memory killer) cannot stop its pool: the
    workers, forked with every descriptor of the command, would otherwise wait forever on a
    queue whose write end they hold themselves. Holding the output folder's lock
    (``OutputLock``'s descriptor is inherited too), they would refuse every later command on
    that folder, naming a dead pid, and one still running a run would write into a folder a
    new command may own. A daemon thread polls the parent pid (an orphan is re-parented, so it
    changes) and ends the worker; its unfinished files are temporaries the next command
    deletes. Polling works on every POSIX system, unlike Linux's ``PR_SET_PDEATHSIG``, which
    also fires when the pool's spawning *thread* ends.
    """
    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        os._exit(1)  # no cleanup handlers: the parent that owned them is gone

    threading.Thread(target=watch, name="batchsim-exit-with-parent", daemon=True).start()


def stop_pool(pool: ProcessPoolExecutor) -> None:
    """Stop the workers now and drop queued runs (runs in flight are redone on resume).

    The worker list is read before ``shutdown``, which forgets it; ``ProcessPoolExecutor`` has
    no public way to stop busy workers before Python 3.14.
    """
    procs = list((getattr(pool, "_processes", None) or {}).values())
    for proc in procs:
        proc.terminate()
    pool.shutdown(wait=False, cancel_futures=True)
    for proc in procs:
        proc.join(timeout=5)


def run_id_of(args: RunArgs) -> str:
    """The run id of one run's arguments (its folder's name)."""
    return Path(args[2]).name


def run_serial(args: list[RunArgs], on_done: OnDone,
               labels: dict[str, str] | None = None) -> None:
    """Run each in this process, in order; ``labels``: the progress-bar label of each run id
    (a bar inside each run, shown only where the console has one)."""
    for a in args:
        rid = run_id_of(a)
        on_done(rid, execute_run(*a, progress=(labels or {}).get(rid)))


def run_pool(args: list[RunArgs], jobs: int, on_done: OnDone) -> None:
    """Run over a pool of ``jobs`` processes; survive workers that die (see the module doc)."""
    queue = deque(args)
    while queue:
        for a in _pool_pass(queue, jobs, on_done):
            on_done(run_id_of(a), run_alone(a))


def _pool_pass(queue: deque[RunArgs], jobs: int, on_done: OnDone) -> list[RunArgs]:
    """Run from ``queue`` until it is empty or the pool breaks; return the runs that were in
    flight when it broke (their results were lost)."""
    pool = ProcessPoolExecutor(max_workers=min(jobs, len(queue)), initializer=worker_init)
    inflight: dict[Future[dict[str, Any]], RunArgs] = {}
    lost: list[RunArgs] = []
    broken = progressed = False
    try:
        while (queue and not broken) or inflight:
            while queue and len(inflight) < jobs and not broken:
                a = queue.popleft()
                try:
                    inflight[pool.submit(execute_run, *a)] = a
                except BrokenProcessPool:
                    queue.appendleft(a)
                    broken = True
            if not inflight:
                break
            done, _ = wait(inflight, return_when=FIRST_COMPLETED)
            for fut in done:
                a = inflight.pop(fut)
                if isinstance(fut.exception(), BrokenProcessPool):
                    lost.append(a)
                    broken = True
                else:
                    progressed = True
                    on_done(run_id_of(a), fut.result())  # a worker's OSError stops the sweep
    except BaseException:
        stop_pool(pool)
        raise
    pool.shutdown(wait=True)
    if broken and not lost and not progressed:
        raise EnvironmentFailure("the process pool's workers die as they start; "
                                 "run without --jobs to see why")
    return lost


def run_alone(a: RunArgs) -> dict[str, Any]:
    """Run ``a`` in a fresh one-worker pool; if that worker dies, record the run as failed."""
    pool = ProcessPoolExecutor(max_workers=1, initializer=worker_init)
    try:
        fut = pool.submit(execute_run, *a)
        procs = list((getattr(pool, "_processes", None) or {}).values())
        try:
            return fut.result()
        except BrokenProcessPool:
            for proc in procs:
                proc.join(timeout=5)
            codes = [p.exitcode for p in procs if p.exitcode is not None]
            return record_lost_run(a[2], worker_exit(codes[0] if codes else None))
    except BaseException:
        stop_pool(pool)
        raise
    finally:
        pool.shutdown(wait=True)


def worker_exit(code: int | None) -> str:
    """How a worker process ended, in words (``killed by signal 9 (SIGKILL)``)."""
    if code is None:
        return "ended abruptly"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = "?"
        return f"was killed by signal {-code} ({name})"
    return f"exited with code {code}"


def record_lost_run(run_dir: str, how: str) -> dict[str, Any]:
    """Write ``error.txt`` for a run whose worker died, and return its error result."""
    message = (f"WorkerDied: the worker process running this run {how}; the usual cause is "
               "the out-of-memory killer (lower --jobs or the run's size); re-run to retry it")
    folder = Path(run_dir)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "summary.json").unlink(missing_ok=True)
    write_text(folder / "error.txt", message + "\n")
    return {"error": message}
