"""``batchsim validate RESULTS...``: measured benchmark runs against batchsim's replay of them.

Each file is a ``vllm bench serve`` result (saved with ``--save-result --save-detailed``) or a
guidellm report (:mod:`sim.experiments.bench_results`); every run in it is replayed on
``--model``, ``--hardware``, ``--tp`` and ``--engine`` and printed as measured / simulated /
error per metric (:mod:`sim.experiments.validate`).
"""
from __future__ import annotations

import argparse

from sim.cost.defaults import DEFAULT_HARDWARE, DEFAULT_MODEL

#: The shared arguments' defaults (``calibrate`` applies them itself: see ``add_arguments``):
#: the deployment a YAML without ``model:`` / ``hardware:`` simulates.
DEFAULTS: dict[str, str | int] = {"model": DEFAULT_MODEL, "hardware": DEFAULT_HARDWARE, "tp": 1,
                                  "seed": 0}


def add_arguments(p: argparse.ArgumentParser, defaults: bool = True) -> None:
    """The arguments ``validate`` and ``calibrate --engine-from`` share.

    ``defaults=False`` leaves an option not given as ``None`` (its default is ``DEFAULTS``),
    so ``calibrate`` can refuse one given without ``--engine-from`` instead of ignoring it.
    """
    def default(key: str) -> str | int | None:
        return DEFAULTS[key] if defaults else None

    p.add_argument("--model", default=default("model"),
                   help=f"built-in model name or path (default {DEFAULTS['model']})")
    p.add_argument("--hardware", default=default("hardware"),
                   help=f"built-in GPU name or path (default {DEFAULTS['hardware']})")
    p.add_argument("--tp", type=int, default=default("tp"),
                   help="tensor-parallel degree of the server (default 1)")
    p.add_argument("--seed", type=int, default=default("seed"),
                   help="seed of the arrivals drawn for files without arrival times (default 0)")


def main(args: argparse.Namespace) -> int:
    """Run ``batchsim validate`` for parsed ``args``."""
    from sim.cost.profiles import calibration_note, load_gpu
    from sim.cost.roofline import DEFAULT_ENGINE
    from sim.experiments.bench_results import load_bench_results
    from sim.experiments.validate import compare, comparison_table, replay

    engine = args.engine or DEFAULT_ENGINE
    note = calibration_note(load_gpu(args.hardware))
    # every file is read and checked before anything is printed or replayed: a bad second file
    # was reported only after the first one's tables
    runs = [run for path in args.results for run in load_bench_results(path)]
    print(f"replaying on {args.model} / {args.hardware} / tp {args.tp} / engine {engine}")
    print(note)
    for run in runs:
        if run.max_concurrency:
            print(f"note: {run.source}: max_concurrency {run.max_concurrency} is not "
                  "modelled (the replay is open-loop at the recorded rate)")
        result = replay(run, args.model, args.hardware, args.tp, engine, seed=args.seed)
        print()
        print(comparison_table(run.source, compare(run, result)))
    return 0
