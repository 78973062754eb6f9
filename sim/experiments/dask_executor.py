"""Running sweep runs on a Dask cluster (``--executor dask [--address tcp://...]``).

Each run is the same ``sim.experiments.runner.execute_run`` call as locally, so results are
identical; the workers write into the shared output folder (a cluster needs a shared filesystem, as
Dask's own docs assume for file outputs). Without an address a local cluster is started.
"""
from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sim.core.errors import InputError
from sim.experiments.runner import execute_run


def run_on_dask(args: list[tuple[dict[str, Any], str, str]], address: str | None
                ) -> Iterator[tuple[str, dict[str, Any]]]:
    """Submit every ``execute_run(*a)`` to Dask; yield (run_id, summary) as runs finish."""
    try:
        from dask.distributed import Client, LocalCluster, as_completed
    except ImportError:
        raise InputError("--executor dask: dask[distributed] is not installed "
                         "(pip install 'batchsim[dask]')") from None
    cluster = None
    if address:
        client = Client(address, timeout="20s")
    else:
        cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                               dashboard_address=None, silence_logs=logging.ERROR)
        client = Client(cluster)
    futures = {}
    try:
        futures = {client.submit(execute_run, *a, pure=False): Path(a[2]).name for a in args}
        for fut in as_completed(futures):
            yield futures[fut], fut.result()
    except BaseException:
        # Ctrl-C or a lost cluster: drop the queued runs; finished ones are on disk already.
        if futures:
            client.cancel(list(futures))
        raise
    finally:
        client.close()
        if cluster is not None:
            cluster.close()
