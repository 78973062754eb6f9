"""Running sweep runs on a Dask cluster (``--executor dask [--address tcp://...]``).

Each run is the same ``sim.experiments.runner.execute_run`` call as locally, so results are
identical; the workers write into the shared output folder (a cluster needs a shared filesystem, as
Dask's own docs assume for file outputs), whose absolute path the client resolves before
anything is shipped. The client checks each run's files itself (``run.run_experiment``), so a
worker that wrote elsewhere fails the command instead of losing results. Without an address a
local cluster is started. A run whose worker Dask gave up on (``KilledWorker``) is recorded as
failed and the sweep goes on; an unreachable scheduler is an ``EnvironmentFailure``.
"""
from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from sim.core.errors import EnvironmentFailure, InputError
from sim.experiments.executors import RunArgs, record_lost_run, run_id_of
from sim.experiments.runner import execute_run

#: Seconds the client waits for an existing scheduler before giving up.
CONNECT_TIMEOUT_S = 20


def connect(address: str | None) -> tuple[Any, Any]:
    """A Dask client (and the local cluster it owns, if any) for ``address``."""
    try:
        from dask.distributed import Client, LocalCluster
    except ImportError:
        raise InputError("--executor dask: dask[distributed] is not installed "
                         "(pip install 'batchsim[dask]')") from None
    if address is None:
        cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                               dashboard_address=None, silence_logs=logging.ERROR)
        return Client(cluster), cluster
    try:
        return Client(address, timeout=f"{CONNECT_TIMEOUT_S}s"), None
    except ValueError as e:  # dask's parse errors: a missing port, an unknown scheme
        raise InputError(f"not a Dask scheduler address ({str(e).splitlines()[0]}); expected "
                         "tcp://host:port", field=f"--address {address}") from None
    except OSError as e:  # a timeout or a refused connection
        raise EnvironmentFailure(f"--address {address}: cannot reach the Dask scheduler "
                                 f"({str(e).splitlines()[0] if str(e) else type(e).__name__})"
                                 ) from None


def run_on_dask(args: list[RunArgs], address: str | None
                ) -> Iterator[tuple[str, dict[str, Any]]]:
    """Submit every ``execute_run(*a)`` to Dask; yield (run_id, summary) as runs finish."""
    from dask.distributed import as_completed
    from distributed.scheduler import KilledWorker

    client, cluster = connect(address)
    futures = {}
    try:
        futures = {client.submit(execute_run, *a, pure=False): a for a in args}
        for fut in as_completed(futures):
            a = futures[fut]
            try:
                result = fut.result()
            except KilledWorker as e:  # the worker died on every try (Dask retries it)
                result = record_lost_run(a[2], f"was lost on every Dask worker that tried it "
                                         f"({e})")
            yield run_id_of(a), result
    except BaseException:
        # Ctrl-C or a lost cluster: drop the queued runs; finished ones are on disk already.
        if futures:
            client.cancel(list(futures))
        raise
    finally:
        client.close()
        if cluster is not None:
            cluster.close()
