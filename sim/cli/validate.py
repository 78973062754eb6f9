"""``batchsim validate RESULTS...``: measured benchmark runs against batchsim's replay of them.

Each file is a ``vllm bench serve`` result (saved with ``--save-result --save-detailed``) or a
guidellm report (:mod:`sim.experiments.bench_results`); every run in it is replayed on
``--model``, ``--hardware``, ``--tp`` and ``--engine`` and printed as measured / simulated /
error per metric (:mod:`sim.experiments.validate`).
"""
from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments ``validate`` and ``calibrate --engine-from`` share."""
    p.add_argument("--model", default="llama-3-8b", help="built-in model name or path")
    p.add_argument("--hardware", default="h100-sxm", help="built-in GPU name or path")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel degree of the server")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the arrivals drawn for files without arrival times")


def main(args: argparse.Namespace) -> int:
    """Run ``batchsim validate`` for parsed ``args``."""
    from sim.cost.profiles import calibration_note, load_gpu
    from sim.cost.roofline import DEFAULT_ENGINE
    from sim.experiments.bench_results import load_bench_results
    from sim.experiments.validate import compare, comparison_table, replay

    engine = args.engine or DEFAULT_ENGINE
    print(f"replaying on {args.model} / {args.hardware} / tp {args.tp} / engine {engine}")
    print(calibration_note(load_gpu(args.hardware)))
    for path in args.results:
        for run in load_bench_results(path):
            if run.max_concurrency:
                print(f"note: {run.source}: max_concurrency {run.max_concurrency} is not "
                      "modelled (the replay is open-loop at the recorded rate)")
            result = replay(run, args.model, args.hardware, args.tp, engine, seed=args.seed)
            print()
            print(comparison_table(run.source, compare(run, result)))
    return 0
