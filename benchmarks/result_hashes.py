"""Hashes of every result table of the shipped experiments: proof that a refactor changed nothing.

Usage::

    python benchmarks/result_hashes.py OUT.json [--experiments quickstart chapter7 ...] [--jobs 2]
    python benchmarks/result_hashes.py --compare BEFORE.json AFTER.json

Each experiment runs into a fresh temporary folder; every run's ``requests`` and ``steps``
tables and the experiment's ``summary.csv`` (minus wall-clock columns) are hashed from their
text with round-trip float precision, so the hash does not depend on pandas internals or on
the table's file format. ``--compare`` prints each table whose hash differs and exits 1 if any.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENTS = ["quickstart", "chapter7", "kv_layout", "repro_anyscale", "repro_distserve",
               "repro_orca", "repro_sarathi", "repro_vllm_kv"]
#: Summary columns that measure the machine, not the simulation.
WALL_CLOCK_COLUMNS = {"wall_s", "wall_time_s", "sim_wall_s", "engine"}


def table_hash(df: pd.DataFrame) -> str:
    """sha256 (16 hex digits) of ``df`` as CSV text with round-trip float precision."""
    text = df.to_csv(index=False, float_format="%.17g", lineterminator="\n")
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _read(stem: Path) -> pd.DataFrame:
    if stem.with_suffix(".parquet").exists():
        return pd.read_parquet(stem.with_suffix(".parquet"))
    return pd.read_csv(stem.with_suffix(".csv"), comment="#")


def experiment_hashes(name: str, jobs: int) -> dict[str, str]:
    """Run experiment ``name`` into a temporary folder and hash each of its tables."""
    import sim

    out: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        sim.run_experiment(str(ROOT / "experiments" / f"{name}.yaml"), out=tmp, jobs=jobs,
                           plots=False, quiet=True)
        summary = pd.read_csv(Path(tmp) / "summary.csv")
        summary = summary.drop(columns=[c for c in summary.columns if c in WALL_CLOCK_COLUMNS])
        out[f"{name}/summary"] = table_hash(summary.sort_values("run_id"))
        for run in sorted((Path(tmp) / "runs").iterdir()):
            for table in ("requests", "steps"):
                out[f"{name}/{run.name}/{table}"] = table_hash(_read(run / table))
    return out


def compare(before: dict[str, str], after: dict[str, str]) -> int:
    """Print the tables whose hashes differ; 0 if none."""
    changed = [k for k in sorted(set(before) | set(after)) if before.get(k) != after.get(k)]
    for key in changed:
        print(f"CHANGED {key}: {before.get(key)} -> {after.get(key)}")
    print(f"{len(before)} tables before, {len(after)} after, {len(changed)} changed")
    return 1 if changed else 0


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("output", nargs="?")
    ap.add_argument("--experiments", nargs="+", default=EXPERIMENTS)
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"))
    args = ap.parse_args(argv)
    if args.compare:
        a, b = (json.loads(Path(p).read_text()) for p in args.compare)
        return compare(a, b)
    hashes: dict[str, str] = {}
    for name in args.experiments:
        hashes.update(experiment_hashes(name, args.jobs))
        print(f"{name}: done", file=sys.stderr)
    Path(args.output).write_text(json.dumps(hashes, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
