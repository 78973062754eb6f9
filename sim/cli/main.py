"""The ``batchsim`` command line: run, plot, calibrate, capacity, profiles, trace-stats, schema.

Exit codes: 0 success; 2 bad input (config, trace, arguments, an unusable or busy output
folder) with one line on stderr naming the file and the dotted field; 1 when the machine
stopped the work (a full disk, no memory, a file limit, an unreachable cluster: one line saying
what happened) or an internal error (a bug, with its traceback).
"""
from __future__ import annotations

import argparse
import json
import sys
import traceback
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn

from sim.cli.validate import add_arguments as add_validate_arguments
from sim.core.errors import InputError, environment_failure


def cmd_run(args: argparse.Namespace) -> int:
    """``batchsim run EXP.yaml``."""
    from sim.api import run_experiment

    summary = run_experiment(args.config, overrides=args.set, out=args.out, jobs=args.jobs,
                             executor=args.executor, address=args.address,
                             plots=False if args.no_plots else None, quiet=args.quiet,
                             sweeps=_sweeps(args.sweep))
    cols = [c for c in ("label", "request_throughput", "p99_ttft_ms", "p99_tpot_ms",
                        "busy_fraction", "slot_utilization") if c in summary.columns]
    if len(summary) and not args.quiet:
        print(summary[cols + [c for c in summary.columns if "." in c]].to_string(
            index=False, float_format=lambda v: f"{v:.4g}"))
    errors = summary.attrs.get("errors", [])
    if errors and not len(summary):
        # Every run failed after validation passed: a bug (exit 1), its traceback on file.
        print(f"batchsim: every run failed; first: {errors[0]} (traceback in "
              f"{summary.attrs.get('out')}/runs/*/error.txt)", file=sys.stderr)
        return 1
    return 0


def _sweeps(texts: list[str]) -> dict[str, list] | None:
    """``--sweep KEY=[...]`` flags as a mapping of dotted key to values (a key given twice
    keeps its last list, as with ``--set``)."""
    from sim.experiments.overrides import parse_sweep

    return dict(parse_sweep(t) for t in texts) or None


def cmd_plot(args: argparse.Namespace) -> int:
    """``batchsim plot DIR``: redraw plots and report.md from a finished output folder."""
    from sim.experiments.outdir import LOCK_NAME, OutputLock, clean_temp_files
    from sim.report.markdown import check_output_folder, regenerate

    folder = Path(args.dir)
    try:
        if not folder.is_dir():
            raise FileNotFoundError(f"{folder}: " + ("not a folder" if folder.exists()
                                                      else "no such folder"))
        if not (folder / LOCK_NAME).exists():
            # checked before a lock file is created: it would mark a user's folder as
            # batchsim's (a folder that has one is busy, or batchsim's: the lock says which)
            check_output_folder(folder)
        with OutputLock(folder, flag="plot"):
            # a command killed while drawing left temporaries: the next command on the
            # folder removes them, this one too (the docs' promise; run and capacity do)
            clean_temp_files(folder)
            regenerate(folder)
    except FileNotFoundError as e:  # a file of the folder vanished: the user's folder is bad
        raise InputError(str(e)) from None
    print(f"wrote {Path(args.dir) / 'report.md'}, {Path(args.dir) / 'report.html'} and "
          f"{Path(args.dir) / 'plots'}")
    return 0


def cmd_trace(args: argparse.Namespace) -> int:
    """``batchsim trace RUN_DIR``: export one run's iterations as a Chrome/Perfetto trace."""
    import errno
    import os
    import tempfile

    from sim.experiments.config import ConfigError
    from sim.experiments.outdir import finished_summary
    from sim.experiments.results import TABLE_SUFFIXES, TEMP_MARK, read_table
    from sim.metrics.stream import is_bucketed
    from sim.report.trace_export import check_trace_target, export_chrome_trace

    folder = Path(args.run_dir)
    if finished_summary(folder) is None:
        # An output folder's own runs/ first: the default output folder runs/<name> has a
        # parent named runs/ too, yet its runs are in runs/<name>/runs. Else the folder may be
        # a (mistyped) run id inside <out>/runs/, whose siblings are the runs.
        runs = folder / "runs" if (folder / "runs").is_dir() or folder.parent.name != "runs" \
            else folder.parent
        if not runs.is_dir() and folder.name == "runs":  # given OUT/runs itself
            runs = folder
        # finished by the rule the trace itself applies: a damaged run (the one asked for,
        # say) is not offered as finished
        done = sorted(p.name for p in runs.glob("*") if finished_summary(p) is not None) \
            if runs.is_dir() else []
        hint = (f"; finished runs in {runs}: " + ", ".join(done[:20])
                + (f" (and {len(done) - 20} more)" if len(done) > 20 else "")) if done else ""
        raise ConfigError(f"{folder}: not a finished run folder (expected runs/<id>/ with "
                          "summary.json and intact result tables; re-run the experiment to "
                          f"redo a damaged run){hint}")
    target = Path(args.out or folder / "trace.json")
    # Check the target before reading the tables and building the trace, so an unusable --out
    # is one exit-2 line at once, not an exit-1 "environment failure" after all the work: a
    # probe file created (and removed) where the trace's temporary file will be.
    check_trace_target(target)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)  # as the export itself would
        fd, probe = tempfile.mkstemp(prefix=f".{target.name}{TEMP_MARK}", suffix=".tmp",
                                     dir=target.parent)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        if errno.errorcode.get(e.errno or -1) in ("ENOSPC", "EDQUOT", "EMFILE", "ENFILE",
                                                   "ENOMEM", "EIO", "EAGAIN"):
            raise  # the machine's state, not the path: exit 1 as any environment failure
        raise InputError(f"cannot write the trace there: {e.strerror or e}",
                         field=f"--out {target}") from None
    steps = read_table(folder / "steps")
    if is_bucketed(steps):  # name the run's table, not the trace that was never written
        table = next((folder / f"steps{s}" for s in TABLE_SUFFIXES
                      if (folder / f"steps{s}").exists()), folder / "steps.parquet")
        raise InputError("a bucketed step table (metrics.step_table: buckets) has no single "
                         "steps to export; re-run the experiment with --set "
                         "metrics.step_table=full for a trace", source=str(table))
    path = export_chrome_trace(steps, target, read_table(folder / "requests"))
    print(f"wrote {path} (open it in ui.perfetto.dev or chrome://tracing)")
    return 0


def cmd_profiles(args: argparse.Namespace) -> int:
    """``batchsim profiles``: built-in GPUs and models; one GPU's or model's specs; the KV
    capacity of a model on a GPU."""
    from sim.cost import profiles as hardware

    sizing = {k: v for k, v in (("--tp", args.tp), ("--block-size", args.block_size),
                                ("--gpu-memory-utilization", args.gpu_memory_utilization))
              if v is not None}
    if args.model and args.hardware:
        from sim.cost.roofline import build_cost_model
        from sim.kv.capacity import BLOCK_SIZE, GPU_MEMORY_UTILIZATION, describe_capacity
        from sim.kv.config import resolve_kv

        tp = sizing.get("--tp", 1)
        block_size = sizing.get("--block-size", BLOCK_SIZE)
        utilization = sizing.get("--gpu-memory-utilization", GPU_MEMORY_UTILIZATION)
        text = describe_capacity(args.model, args.hardware, tp, block_size, utilization)
        try:  # run's own rule (resolve_kv): a deployment with no KV block is refused there
            resolve_kv({"block_size": block_size, "gpu_memory_utilization": utilization},
                       build_cost_model(model=args.model, hardware=args.hardware, tp=tp))
        except InputError as e:
            raise InputError(f"{e.problem} of {args.model} on {tp} x {args.hardware} (raise "
                             "--gpu-memory-utilization or --tp)",
                             field=f"--gpu-memory-utilization {utilization:g}") from None
        print(text)
        return 0
    if sizing:  # a KV capacity setting with nothing to size: it would be silently ignored
        raise InputError("sizes the KV capacity of a deployment: give --model and --hardware "
                         "too", field=next(iter(sizing)))
    if args.hardware or args.model:
        from sim.cli.inspect import describe_gpu, describe_model

        print(describe_gpu(hardware.load_gpu(args.hardware)) if args.hardware
              else describe_model(hardware.load_model(args.model)))
        return 0
    gpus = [hardware.load_gpu(g) for g in hardware.list_gpus()]
    print("GPUs:   " + ", ".join(f"{g.name} ({g.calibration_status})" for g in gpus))
    if any(g.calibration_status != "fitted" for g in gpus):
        print("        (datasheet-only: never fitted to measurements, no known error)")
    print("Models: " + ", ".join(hardware.list_models()))
    print("Engines: " + ", ".join(hardware.list_engines()))
    return 0


def cmd_trace_stats(args: argparse.Namespace) -> int:
    """``batchsim trace-stats TRACE``."""
    from sim.workload.trace_stats import format_trace_stats, trace_stats
    from sim.workload.traces import load_trace_arrays

    print(format_trace_stats(trace_stats(load_trace_arrays(args.trace)), title=args.trace))
    return 0


def cmd_schema(args: argparse.Namespace) -> int:
    """``batchsim schema``: the experiment config's JSON Schema."""
    from sim.experiments.schema import json_schema

    print(json.dumps(json_schema(), indent=1))
    return 0


def cmd_capacity(args: argparse.Namespace) -> int:
    """``batchsim capacity EXP.yaml --slo ...``: highest rate meeting the SLOs per policy."""
    from sim.experiments.capacity import run_capacity

    # repeated --slo flags are one list of SLOs (the last one alone dropped the others
    # silently); parse_slos refuses a metric given twice, in one flag or across flags
    args.slo = ",".join(args.slo)
    if args.split_gpus is not None:  # colocated vs every prefill:decode split of N GPUs
        from sim.experiments.capacity_split import main_hook

        return main_hook(args)
    run_capacity(args.config, slo=args.slo, attainment=args.attainment, overrides=args.set,
                 out=args.out, tolerance=args.tolerance, jobs=args.jobs, quiet=args.quiet,
                 sweeps=_sweeps(args.sweep))
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    """``batchsim validate``: measured benchmark runs against their simulated replay."""
    from sim.cli.validate import main as validate_main

    return validate_main(args)


def cmd_calibrate(args: argparse.Namespace) -> int:
    """``batchsim calibrate``: fit GPU profile parameters to measured timings."""
    from sim.cli.calibrate import main as calibrate_main

    return calibrate_main(args)


class _Parser(argparse.ArgumentParser):
    """argparse with the contract's error shape: one line on stderr, exit code 2."""

    def error(self, message: str) -> NoReturn:
        """Report a bad argument in one line (``--help`` still shows the usage)."""
        if "unrecognized arguments: --resume" in message:  # there is nothing to ask for
            message += "; re-running the same command resumes (finished runs are skipped)"
        print(f"batchsim: error: {message} (see '{self.prog} --help')", file=sys.stderr)
        raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    from sim.core.version import __version__
    from sim.experiments.executors import EXECUTORS

    p = _Parser(prog="batchsim", description="Simulate LLM serving batching "
                "policies on a calibrated roofline cost model.")
    p.add_argument("--version", action="version", version=f"batchsim {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND",
                           parser_class=_Parser)

    r = sub.add_parser("run", help="run (or resume) an experiment YAML")
    r.add_argument("config", help="experiment YAML file")
    r.add_argument("--out", help="output folder (default runs/<name>)")
    r.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a dotted config key (repeatable); on a swept key it "
                   "replaces the sweep; 'sweep.KEY=[...]' sets a sweep, 'sweep=null' drops all")
    r.add_argument("--sweep", action="append", default=[], metavar="KEY=[V,...]",
                   help="sweep a dotted key over values, e.g. workload.rate=[2,4] "
                   "(repeatable; same as --set 'sweep.KEY=[...]')")
    r.add_argument("--jobs", type=int, default=1, help="parallel runs on this machine")
    r.add_argument("--executor", choices=EXECUTORS, default="local")
    r.add_argument("--address", help="Dask scheduler address (default: a local cluster)")
    r.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    r.add_argument("--quiet", action="store_true", help="print nothing but errors")
    r.set_defaults(func=cmd_run)

    pl = sub.add_parser("plot", help="redraw plots and report.md of an output folder")
    pl.add_argument("dir")
    pl.set_defaults(func=cmd_plot)

    tr = sub.add_parser("trace", help="export a run's iterations as a Chrome/Perfetto trace")
    tr.add_argument("run_dir", help="a run folder: OUT/runs/<id>")
    tr.add_argument("--out", help="output JSON (default RUN_DIR/trace.json)")
    tr.set_defaults(func=cmd_trace)

    c = sub.add_parser("calibrate", help="fit a GPU profile to measured timings")
    c.add_argument("--gpu", action="append", help="GPU profile(s) to calibrate (default all "
                   "with shipped measurements)")
    c.add_argument("--data", help="folder of measured kernel timings, or an iteration CSV")
    c.add_argument("--write", action="store_true", help="write fitted parameters into the "
                   "profile YAML")
    c.add_argument("--report", help="folder for the fit report and plots")
    c.add_argument("--engine-from", nargs="+", metavar="RESULTS",
                   help="fit an engine profile's overheads to vllm bench serve / guidellm "
                   "results (with --model, --hardware, --tp, --engine, --out)")
    c.add_argument("--engine", help="engine profile to start from (default: the default)")
    c.add_argument("--out", help="engine YAML to write with --engine-from (never overwritten)")
    add_validate_arguments(c, defaults=False)  # None when not given: refused without --engine-from
    c.set_defaults(func=cmd_calibrate)

    v = sub.add_parser("validate", help="compare measured benchmark runs with batchsim's replay")
    v.add_argument("results", nargs="+", help="vllm bench serve result JSON or guidellm report")
    v.add_argument("--engine", help="engine profile (default: the default engine)")
    add_validate_arguments(v)
    v.set_defaults(func=cmd_validate)

    cap = sub.add_parser("capacity", help="highest request rate meeting SLOs, per policy")
    cap.add_argument("config")
    cap.add_argument("--slo", required=True, action="append", metavar="NAME=LIMIT[,...]",
                     help="e.g. ttft_p99_ms=2000,tpot_p99_ms=100 (repeatable: the SLOs of "
                     "every --slo apply)")
    cap.add_argument("--attainment", type=float, default=None,
                     help="per-request SLO attainment goal instead of percentiles (e.g. 0.9)")
    cap.add_argument("--tolerance", type=float, default=0.05, help="relative rate tolerance")
    cap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                     help="override a dotted config key (repeatable), as for run; "
                     "intervals.draws=N adds a prediction interval of each max rate "
                     "(N more searches)")
    cap.add_argument("--sweep", action="append", default=[], metavar="KEY=[V,...]",
                     help="sweep a dotted key: one capacity search per value, as for run")
    cap.add_argument("--out", help="folder for capacity.csv and search.csv (default "
                     "runs/<name>-capacity); probe results are cached there and reused")
    cap.add_argument("--jobs", type=int, default=1, help="probes run in parallel per round")
    cap.add_argument("--quiet", action="store_true", help="print nothing but errors")
    cap.add_argument("--split-gpus", type=int, default=None, metavar="N",
                     help="compare the colocated deployment of N GPUs with every "
                     "prefill:decode split of them (docs/disaggregation.md)")
    cap.set_defaults(func=cmd_capacity)

    pr = sub.add_parser("profiles", help="list built-in GPUs and models; --hardware X: the "
                        "GPU's specs; --model X: the architecture; both: KV capacity")
    pr.add_argument("--model", help="built-in model name, model YAML or HF config.json")
    pr.add_argument("--hardware", help="built-in GPU name or GPU profile YAML")
    pr.add_argument("--tp", type=int, default=None, help="with --model and --hardware: "
                    "tensor-parallel degree (default 1)")
    pr.add_argument("--block-size", type=int, default=None, help="with --model and --hardware: "
                    "tokens per KV block (default: the kv block's)")
    pr.add_argument("--gpu-memory-utilization", type=float, default=None,
                    help="with --model and --hardware: share of HBM the engine may use "
                    "(default: the kv block's)")
    pr.set_defaults(func=cmd_profiles)

    t = sub.add_parser("trace-stats", help="statistics of a trace file or built-in trace")
    t.add_argument("trace")
    t.set_defaults(func=cmd_trace_stats)

    s = sub.add_parser("schema", help="print the experiment config JSON Schema")
    s.set_defaults(func=cmd_schema)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``batchsim`` console script."""
    args = build_parser().parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        with warnings.catch_warnings():
            if getattr(args, "quiet", False):
                warnings.simplefilter("ignore")  # "nothing but errors"; pool workers inherit it
            return func(args)
    except KeyboardInterrupt:
        print("batchsim: interrupted; finished runs are kept, re-run to resume",
              file=sys.stderr)
        return 130
    except InputError as e:
        print(f"batchsim: error: {e}".splitlines()[0], file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 - the machine's fault, or a bug: show it
        failure = environment_failure(e)
        if failure is not None:
            print(f"batchsim: error: {failure}".splitlines()[0], file=sys.stderr)
            return 1
        traceback.print_exc()
        print("batchsim: internal error (a bug); please report it with the traceback above",
              file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
