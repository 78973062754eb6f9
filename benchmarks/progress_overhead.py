"""A/B: does the in-run progress bar slow a run? Interleaved repeats, with and without it.

    python benchmarks/progress_overhead.py [REPEATS]

Runs the same experiments (chunked prefill on the general engine; continuous batching on the
interpreted fast path) alternately with a live progress bar (drawn into a buffer that claims
to be a terminal, every 0.5 s) and without one, and prints each run's CPU time (the process's,
every thread included: steadier than wall time on a shared machine, and it counts the bar's
own thread) and the median ratio with / without. The results must also be identical.
"""
from __future__ import annotations

import io
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sim.experiments.config import expand_runs  # noqa: E402
from sim.experiments.run_progress import RunProgress  # noqa: E402
from sim.experiments.runner import simulate_config  # noqa: E402

CASES = {
    "chunked_prefill (general engine)": {"policy": {"name": "chunked_prefill",
                                                    "token_budget": 512}, "n": 2000},
    "continuous (interpreted fast path)": {"policy": {"name": "continuous"}, "n": 45000},
}


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def _config(policy: dict, n: int) -> dict:
    raw = {"name": "bench", "model": "llama-3-8b", "hardware": "h100-sxm",
           "workload": {"trace": "azure-conv", "max_requests": n, "rate": 20},
           "policy": policy, "output": {"plots": False}}
    return expand_runs(raw)[1][0].config


def _once(config: dict, with_bar: bool) -> tuple[float, dict]:
    t0 = time.process_time()
    if with_bar:
        with RunProgress("bench", stream=_Tty()) as bar:
            res = simulate_config(config, REPO, monitor=bar.attach)
    else:
        res = simulate_config(config, REPO)
    return time.process_time() - t0, res.summary


def main(repeats: int = 5) -> None:
    """Print the wall times and the median ratio of each case."""
    for name, case in CASES.items():
        config = _config(case["policy"], case["n"])
        _once(config, False)  # warm caches
        ratios = []
        for _ in range(repeats):
            off, s_off = _once(config, False)
            on, s_on = _once(config, True)
            assert {k: v for k, v in s_on.items() if k != "wall_s"} == \
                {k: v for k, v in s_off.items() if k != "wall_s"}
            ratios.append(on / off)
            print(f"  {name}: CPU without {off:.3f} s, with {on:.3f} s, ratio {on / off:.3f}",
                  flush=True)
        print(f"{name}: median ratio with/without {statistics.median(ratios):.3f} "
              f"(min {min(ratios):.3f}, max {max(ratios):.3f})")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5)
