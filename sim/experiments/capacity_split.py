"""``batchsim capacity --split-gpus N``: colocated against disaggregated at a fixed GPU count.

For an experiment without a ``cluster`` block, N GPUs make R = N / TP replicas of the
experiment's model and GPU. Each is searched for its capacity (``sim.experiments.capacity``,
the same SLOs and rules): the colocated deployment (R replicas of each policy of the
experiment, behind its router) and every prefill:decode split P:(R - P), P = 1 .. R - 1, with
the experiment's policy on both sides and decodes routed by ``least_kv_usage``. The answer
puts the best colocated deployment and the best split side by side, in requests per second
and per GPU, and writes ``split.csv`` (one row per deployment) beside ``capacity.csv``.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from sim.core.fields import check_flags, is_integer
from sim.experiments.capacity import run_capacity
from sim.experiments.config import config_path, expand_runs, load_yaml
from sim.experiments.outdir import check_name
from sim.experiments.results import write_text
from sim.experiments.slo import CapacityError

#: The decode router of every split (the emptiest KV cache takes the next decode).
DECODE_ROUTER = "least_kv_usage"


def deployments(num_gpus: int, tp: int) -> list[dict[str, Any]]:
    """The cluster blocks compared: colocated, then each prefill:decode split."""
    if num_gpus < 2 * tp or num_gpus % tp:
        raise CapacityError(f"--split-gpus: {num_gpus} GPUs must be a multiple of TP={tp} "
                            f"and hold at least two replicas")
    r = num_gpus // tp
    blocks: list[dict[str, Any]] = [{"label": f"colocated-{r}",
                                     "groups": [{"name": "colocated", "replicas": r}]}]
    for p in range(1, r):
        blocks.append({"label": f"split-{p}p{r - p}d", "decode_router": DECODE_ROUTER,
                       "groups": [{"name": "prefill", "role": "prefill", "replicas": p},
                                  {"name": "decode", "role": "decode", "replicas": r - p}]})
    return blocks


def run_split(config: str | Path, num_gpus: int, slo: str, attainment: float | None = None,
              overrides: Iterable[str] | Mapping[str, Any] | None = None,
              out: str | Path | None = None, tolerance: float = 0.05, jobs: int = 1,
              quiet: bool = False) -> pd.DataFrame:
    """Search every deployment of ``num_gpus`` GPUs; return (and write) the split table."""
    check_flags(quiet=quiet)  # this function prints itself: run_capacity sees quiet=True
    if not is_integer(num_gpus):  # from Python: "4" or 4.0 would fail deep in the arithmetic
        raise CapacityError(f"--split-gpus: expected a whole number of GPUs, got {num_gpus!r}")
    path = config_path(config)
    raw = load_yaml(path)
    if raw.get("cluster") is not None:
        raise CapacityError("--split-gpus builds the deployments itself: remove the "
                            "experiment's cluster block")
    base, _ = expand_runs(raw, overrides or [], source=str(path))
    blocks = deployments(num_gpus, int(base["parallelism"]["tp"]))
    # the default folder is named after the experiment: the same check as run's runs/<name>,
    # or a name such as '../x' would write outside runs/
    folder = Path(out) if out is not None \
        else Path("runs") / f"{check_name(base['name'], str(path))}-split{num_gpus}"
    table = run_capacity(path, slo=slo, attainment=attainment, overrides=overrides,
                         out=folder, tolerance=tolerance, jobs=jobs, quiet=True,
                         sweeps={"cluster": blocks})
    rows = []
    for _, row in table.iterrows():
        block = row["cluster"]
        rate = float(row["max_rate"]) if row["status"] != "infeasible" else 0.0
        rows.append({"deployment": block["label"], "policy": row["policy"],
                     "kind": "split" if "decode_router" in block else "colocated",
                     "gpus": num_gpus, "status": row["status"], "max_rate": rate,
                     "max_rate_per_gpu": rate / num_gpus, "binding": row["binding"]})
    split = pd.DataFrame(rows)
    write_text(folder / "split.csv", split.to_csv(index=False))
    if not quiet:
        print(summary_text(split))
    return split


def summary_text(split: pd.DataFrame) -> str:
    """The best colocated deployment and the best split, side by side (one line each)."""
    lines = []
    for kind in ("colocated", "split"):
        mine = split[split["kind"] == kind]
        if not len(mine):
            continue
        best = mine.loc[mine["max_rate"].idxmax()]
        lines.append(f"best {kind}: {best['deployment']} ({best['policy']}): "
                     f"{best['max_rate']:.4g} req/s, {best['max_rate_per_gpu']:.4g} per GPU "
                     f"[{best['status']}; binding: {best['binding']}]")
    return "\n".join(lines)


def main_hook(args: Any) -> int:
    """The CLI's ``capacity --split-gpus`` branch."""
    run_split(args.config, args.split_gpus, slo=args.slo, attainment=args.attainment,
              overrides=args.set, out=args.out, tolerance=args.tolerance, jobs=args.jobs,
              quiet=args.quiet)
    return 0


__all__ = ["deployments", "main_hook", "run_split", "summary_text"]
