"""Tables for docs/chapter7.md and docs/reproductions.md, read from finished experiment outputs.

Usage (each DIR is the ``--out`` folder of ``batchsim run``)::

    python benchmarks/repro_tables.py chapter7 runs/chapter7
    python benchmarks/repro_tables.py anyscale runs/repro_anyscale
    python benchmarks/repro_tables.py orca runs/repro_orca
    python benchmarks/repro_tables.py sarathi runs/repro_sarathi
    python benchmarks/repro_tables.py distserve runs/repro_distserve
    python benchmarks/repro_tables.py vllm_kv runs/repro_vllm_kv

Everything printed is derived from ``summary.csv`` and, where a paper's metric is not a
summary column (Orca's normalized latency, Sarathi-Serve's scheduling delay), from the per-run
``requests`` tables. Nothing here changes a simulation.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

RATE = "workload.arrival.rate"


def summary(out: Path) -> pd.DataFrame:
    """The experiment's summary table."""
    return pd.read_csv(out / "summary.csv")


def requests(out: Path, run_id: str) -> pd.DataFrame:
    """One run's per-request table (parquet, or CSV without pyarrow)."""
    d = out / "runs" / run_id
    p = d / "requests.parquet"
    return pd.read_parquet(p) if p.exists() else pd.read_csv(d / "requests.csv")


def per_request_stat(out: Path, s: pd.DataFrame, name: str, fn) -> pd.DataFrame:
    """Add column ``name`` = ``fn(finished requests)`` to each summary row."""
    s = s.copy()
    vals = []
    for rid in s["run_id"]:
        r = requests(out, rid)
        vals.append(fn(r[r["status"] == "finished"]))
    s[name] = vals
    return s


def md(df: pd.DataFrame, digits: int = 3) -> str:
    """A markdown table with floats rounded to ``digits`` significant figures."""
    def cell(v: object) -> str:
        if isinstance(v, (float, np.floating)):
            if np.isnan(v):
                return "–"
            if abs(v) >= 100:
                return f"{v:,.0f}"
            return f"{v:.{digits}g}"
        return str(v)
    head = "| " + " | ".join(df.columns) + " |"
    sep = "|" + "|".join("---" for _ in df.columns) + "|"
    rows = ["| " + " | ".join(cell(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join([head, sep, *rows])


def highest_passing(s: pd.DataFrame, key: str, ok: pd.Series) -> float:
    """The highest ``key`` value such that it and every lower swept value pass (else nan)."""
    s = s.assign(_ok=ok.to_numpy()).sort_values(key)
    best = float("nan")
    for v, good in zip(s[key], s["_ok"], strict=True):
        if not good:
            break
        best = float(v)
    return best


def chapter7(out: Path) -> None:
    """Utilization and latency table at light, moderate and saturating load."""
    s = summary(out)
    cols = {"label": "policy", RATE: "rate", "request_throughput": "req/s",
            "median_ttft_ms": "p50 TTFT ms", "p99_ttft_ms": "p99 TTFT ms",
            "median_tpot_ms": "p50 TPOT ms", "p99_tpot_ms": "p99 TPOT ms",
            "p99_itl_ms": "p99 ITL ms", "median_e2el_ms": "p50 E2E ms",
            "p99_e2el_ms": "p99 E2E ms", "busy_fraction": "busy", "slot_utilization": "slot",
            "padding_fraction": "padding", "mfu": "MFU", "mbu": "MBU",
            "mean_batch_size": "rows/step", "slo_attainment": "SLO att."}
    for rate in sorted(s[RATE].unique()):
        if rate in (0.5, 3, 10):
            print(f"\n### rate {rate} req/s\n")
            print(md(s[s[RATE] == rate][list(cols)].rename(columns=cols)))
    print("\n### highest rate with SLO attainment >= 0.9, and the throughput ceiling\n")
    rows = []
    for label, g in s.groupby("label", sort=False):
        rows.append({"policy": label,
                     "rate @ SLO att.>=0.9": highest_passing(g, RATE, g["slo_attainment"] >= 0.9),
                     "max req/s": g["request_throughput"].max(),
                     "max goodput req/s": g["request_goodput"].max(),
                     "MFU at max": g.loc[g["request_throughput"].idxmax(), "mfu"]})
    print(md(pd.DataFrame(rows)))


def anyscale(out: Path) -> None:
    """Output throughput per system and cap, and the ratio to naive static (slab) batching."""
    s = summary(out)
    cap = "workload.output_tokens.max"
    base = s[(s["label"] == "naive-static") & (s["kv.allocator"] == "slab")]
    base = base.set_index(["hardware", cap])["output_throughput"]
    rows = []
    for d in s.to_dict("records"):
        rows.append({"hardware": d["hardware"], "cap": d[cap], "system": d["label"],
                     "kv": d["kv.allocator"], "out tok/s": d["output_throughput"],
                     "rows/step": d["mean_batch_size"],
                     "KV live": d["mean_kv_live_fraction"],
                     "preempt": d["num_preemptions"], "rejected": d["num_rejected"],
                     "x naive": d["output_throughput"] / base[(d["hardware"], d[cap])]})
    t = pd.DataFrame(rows).sort_values(["hardware", "cap", "system", "kv"])
    print(md(t))


def orca(out: Path, levels: tuple[float, ...] = (50, 75, 100, 200)) -> None:
    """Throughput at equal median normalized latency (E2E / output tokens), Orca's metric."""
    s = per_request_stat(out, summary(out), "norm_lat_ms",
                         lambda r: float(np.median(r["e2e_s"] / r["num_output_tokens"]) * 1e3))
    print(md(s[["label", RATE, "request_throughput", "norm_lat_ms", "median_tpot_ms",
                "mean_batch_size"]]))
    rows = []
    for lvl in levels:
        row: dict[str, object] = {"median norm. latency <= ms/token": lvl}
        for label, g in s.groupby("label", sort=False):
            row[label] = throughput_at(g.sort_values(RATE), lvl)
        ft = max(v for k, v in row.items() if str(k).startswith("ft"))
        row["orca / best FT"] = row["orca"] / ft if ft else float("inf")
        rows.append(row)
    print()
    print(md(pd.DataFrame(rows)))


def throughput_at(g: pd.DataFrame, level_ms: float) -> float:
    """Throughput where the (rate-ordered) latency curve crosses ``level_ms``, interpolated
    linearly between the last sweep point below it and the first above (0 if none below)."""
    lat, thr = g["norm_lat_ms"].to_numpy(float), g["request_throughput"].to_numpy(float)
    if lat[0] > level_ms:
        return 0.0
    for i in range(1, len(lat)):
        if lat[i] > level_ms:
            f = (level_ms - lat[i - 1]) / (lat[i] - lat[i - 1])
            return float(thr[i - 1] + f * (thr[i] - thr[i - 1]))
    return float(thr[-1])


def sarathi(out: Path, tbt_ms: float = 100.0, delay_s: float = 2.0) -> None:
    """Capacity under a P99 TBT SLO with median scheduling delay under ``delay_s``."""
    s = per_request_stat(out, summary(out), "median_sched_delay_s",
                         lambda r: float(np.median(r["first_scheduled_s"] - r["arrival_s"])))
    print(md(s[["label", RATE, "request_throughput", "p99_itl_ms", "median_sched_delay_s",
                "median_ttft_ms", "num_preemptions"]]))
    rows = []
    for label, g in s.groupby("label", sort=False):
        ok = ((g["p99_itl_ms"] <= tbt_ms) & (g["median_sched_delay_s"] <= delay_s)
              & (g["num_rejected"] == 0) & (g["num_unfinished"] == 0))
        rows.append({"policy": label, "capacity req/s": highest_passing(g, RATE, ok)})
    t = pd.DataFrame(rows)
    print()
    print(md(t))
    cap = dict(zip(t["policy"], t["capacity req/s"], strict=True))
    print(f"\nsarathi-serve / vllm capacity: {cap['sarathi-serve'] / cap['vllm']:.2f}x")


def distserve(out: Path, target: float = 0.9) -> None:
    """Highest rate with SLO attainment >= ``target`` (and a linear interpolation)."""
    s = summary(out).sort_values(RATE)
    print(md(s[[RATE, "request_throughput", "p90_ttft_ms", "p90_tpot_ms", "slo_attainment",
                "request_goodput"]]))
    best = highest_passing(s, RATE, s["slo_attainment"] >= target)
    above = s[s[RATE] > best].head(1)
    lo = s[s[RATE] == best].iloc[0]
    interp = best
    if len(above):
        hi = above.iloc[0]
        a0, a1 = lo["slo_attainment"], hi["slo_attainment"]
        interp = best + (a0 - target) / (a0 - a1) * (hi[RATE] - best)
    print(f"\nhighest swept rate with attainment >= {target}: {best} req/s "
          f"(linear interpolation to the next point: {interp:.2f} req/s)")


def vllm_kv(out: Path) -> None:
    """Live share of held KV and saturated throughput, slab vs paged, per GPU."""
    s = summary(out)
    rows = []
    for (hw, alloc), g in s.groupby(["hardware", "kv.allocator"], sort=False):
        top = g.loc[g["request_throughput"].idxmax()]
        rows.append({"hardware": hw, "kv": alloc,
                     "KV live fraction": g["mean_kv_live_fraction"].mean(),
                     "max req/s": top["request_throughput"],
                     "rows/step at max": top["mean_batch_size"],
                     "preempt at max": top["num_preemptions"],
                     "rejected (all runs)": int(g["num_rejected"].sum())})
    t = pd.DataFrame(rows)
    print(md(t))
    for hw, g in t.groupby("hardware", sort=False):
        m = dict(zip(g["kv"], g["max req/s"], strict=True))
        print(f"\n{hw}: paged / slab saturated throughput = {m['paged'] / m['slab']:.2f}x")


def main(argv: list[str]) -> int:
    """Dispatch ``WHICH DIR``."""
    if len(argv) != 2 or argv[0] not in ("chapter7", "anyscale", "orca", "sarathi",
                                          "distserve", "vllm_kv"):
        print(__doc__, file=sys.stderr)
        return 2
    globals()[argv[0]](Path(argv[1]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
