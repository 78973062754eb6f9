"""The public entry point that spans layers: ``sim.run_experiment``, a whole experiment.

It is defined here, above every layer, so that the experiment runner need not import the report
layer that sits on top of it: this module hands the report writer in. ``batchsim run`` calls
this same function, so Python and the command line share one set of defaults.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

#: ``run_experiment``'s keyword arguments beyond its own, those of ``batchsim run``.
RUN_OPTIONS = frozenset({"jobs", "executor", "address", "plots", "quiet"})


def run_experiment(path: str | Path,
                   overrides: Iterable[str] | Mapping[str, Any] | None = None,
                   out: str | Path | None = None, *, sweeps: Mapping[str, Any] | None = None,
                   **kwargs: Any) -> pd.DataFrame:
    """Run (or resume) the experiment YAML at ``path`` into ``out`` and write its report.

    ``overrides`` are ``--set``-style ``dotted.key=value`` strings (or a mapping of dotted key
    to value); an override of a swept key replaces that sweep with the one value.
    ``sweeps`` maps dotted keys to lists of values (``--sweep``; ``None`` removes that key's
    sweep). Further keyword arguments (``jobs``, ``executor``, ``address``, ``plots``,
    ``quiet``) are those of ``batchsim run``. Returns the summary table (one row per run).
    """
    from sim.core.errors import InputError
    from sim.experiments.run import run_experiment as _run
    from sim.report.markdown import write_outputs

    unknown = sorted(set(kwargs) - RUN_OPTIONS)
    if unknown:
        raise InputError(f"unknown argument {unknown[0]!r}; accepted: path, overrides, out, "
                         f"sweeps, {', '.join(sorted(RUN_OPTIONS))}", field=unknown[0])
    return _run(path, overrides=overrides, out=out, report=write_outputs, sweeps=sweeps,
                **kwargs)
