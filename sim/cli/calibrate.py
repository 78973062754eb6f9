"""``batchsim calibrate``: fit GPU profiles (or an engine) to measurements, report, write back.

``--data`` may be a folder of kernel tables (one GPU's, or ``<DIR>/<gpu>/`` per GPU) or an iteration
CSV (:mod:`sim.cost.iteration_calibration`). ``--write`` rewrites only the ``calibration:`` block
(and the fitted ``interconnect:`` α lines) of each GPU YAML, leaving ``sources:`` and the comments
as they are. ``--report DIR`` writes ``report.md`` and one predicted-vs-measured scatter plot per
GPU.
"""
from __future__ import annotations

import datetime as _dt
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from sim.core.paths import checkout_root
from sim.cost.calibrate import (
    MEASURED_RANGE,
    CalibrationError,
    CalibrationReport,
    calibrate,
    measured_gpus,
    params_table,
    report_table,
)
from sim.cost.profiles import Calibration, GpuProfile, ProfileError, load_gpu
from sim.cost.uncertainty import residual_quantiles
from sim.experiments.outdir import OutputLock, check_own_folder
from sim.experiments.results import atomic_write, write_text

_ALPHA_KEYS = ("allreduce_alpha_us", "alpha_per_peer_us")
#: What each built-in fitted GPU was fitted on, in words (the ``calibration.fitted_on`` line).
_FITTED_ON = {
    "a100-80gb": "NVIDIA AIConfigurator kernel timings (vLLM 0.14, bf16)",
    "h100-sxm": "NVIDIA AIConfigurator kernel timings (vLLM 0.14, bf16); GEMMs also Vidur's "
                "per-operator profile (Llama-2-7B, TP 1-8)",
    "h200": "NVIDIA AIConfigurator kernel timings (vLLM 0.14, bf16)",
}
_COLOURS = {"gemm": "tab:blue", "context_attention": "tab:orange",
            "generation_attention": "tab:green", "allreduce": "tab:red"}
HOLDOUT_NOTE = (
    "Held-out split by shape family (every third distinct key, sorted): GEMMs by weight shape "
    "(n, k) with all token counts m; attention by per-GPU head configuration (num_heads, "
    "num_key_value_heads), the same families for prefill and decode, standing in for unseen "
    "models and TP degrees; all-reduce by message size with all GPU counts. Parameters are fit "
    "on the other rows only.")


#: What ``--report DIR`` writes there (the words of the guard's message).
REPORT_FILES = "report.md, engine.yaml, *.png"


#: The options of ``--engine-from`` alone (fitting an engine profile to benchmark results).
ENGINE_OPTIONS = {"--out": "out", "--model": "model", "--hardware": "hardware", "--tp": "tp",
                  "--engine": "engine", "--seed": "seed"}
#: The options of fitting GPU profiles to measured timings, with what each applies to.
TIMING_OPTIONS = {"--gpu": ("gpu", "kernel tables"), "--data": ("data", "measured timings"),
                  "--write": ("write", "kernel tables"),
                  "--report": ("report", "measured timings")}


def _given(args: Any, attr: str) -> bool:
    """Whether the option stored in ``attr`` was given (unset options are ``None``/``False``)."""
    value = getattr(args, attr, None)
    return value is not None and value is not False  # not `in (None, False)`: 0 == False


def check_options(args: Any) -> None:
    """Refuse an option the chosen mode would ignore (it ran with exit 0, the option unused):
    ``--engine-from`` takes only ``ENGINE_OPTIONS``, the other modes none of them, and an
    iteration CSV (``--data FILE``) no ``--gpu``. One ``CalibrationError`` naming the option."""
    engine = _given(args, "engine_from")
    if engine:
        for flag, (attr, what) in TIMING_OPTIONS.items():
            if _given(args, attr):
                raise CalibrationError(
                    f"applies to fitting GPU profiles to {what} (--data, or the shipped "
                    "measurements), not with --engine-from, which writes only --out "
                    "FILE.yaml: drop it", field=flag)
        return
    for flag, attr in ENGINE_OPTIONS.items():
        if _given(args, attr):
            raise CalibrationError("applies only with --engine-from RESULTS (fitting an engine "
                                   "profile to benchmark results): give --engine-from too, or "
                                   "drop it", field=flag)
    data = getattr(args, "data", None)
    if data and Path(data).is_file() and _given(args, "gpu"):
        raise CalibrationError("applies to kernel tables; an iteration CSV (--data FILE) names "
                               "each row's model and hardware: drop it", field="--gpu")


def check_writable(path: Path, flag: str, folder: bool) -> None:
    """Refuse, before any fitting, an output that can never be written: the folder ``path``
    (``folder``) or the file ``path``, whose nearest existing ancestor must be a folder this
    process may write into. Nothing is created: a failed fit leaves no empty folder behind.
    (``outdir.output_folder``, ``batchsim run``'s check, creates the folder and names
    ``--out``; here ``--report`` and an engine YAML file are checked.)"""
    target = Path(os.path.abspath(path))
    probe = target if folder else target.parent
    try:
        while not probe.exists() and probe != probe.parent:
            probe = probe.parent
        usable = probe.is_dir()
    except OSError as e:  # a name too long, a symlink loop
        raise CalibrationError(f"{flag} {path}: cannot be written there ({e.strerror or e})"
                               ) from None
    if not usable:
        raise CalibrationError(f"{flag} {path}: cannot be written there ({probe} is not a "
                               "folder)")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise CalibrationError(f"{flag} {path}: cannot be written there ({probe} is not "
                               "writable: permission denied or a read-only file system)")


def main(args: Any) -> int:
    """Run ``batchsim calibrate`` for parsed ``args`` (``gpu``, ``data``, ``write``, ``report``;
    ``engine_from`` with ``out``, ``model``, ``hardware``, ``tp``, ``engine``, ``seed``)."""
    check_options(args)
    report = getattr(args, "report", None)
    if report is not None and Path(report).exists() and not Path(report).is_dir():
        # checked before the fit: it was "File exists", exit 1, once the fit was done
        raise CalibrationError(f"--report {report}: exists and is not a folder (the report is "
                               "a folder of report.md and plots)")
    if report is not None:  # refused before the fit, as --out is: it replaced their report.md
        check_own_folder(Path(report).absolute(), "--report", REPORT_FILES)
        # an unwritable place failed with exit 1 after the whole fit
        check_writable(Path(report), "--report", folder=True)
    if getattr(args, "engine_from", None):
        return _engine_main(args)
    data = Path(args.data) if getattr(args, "data", None) else None
    if data is not None and not data.exists():
        raise CalibrationError(f"--data not found: {data}")
    if data is not None and data.is_file():
        return _iteration_main(data, args)
    gpus = list(args.gpu or []) or measured_gpus()
    if not gpus:
        raise CalibrationError("no GPU given and no built-in measurements found")
    reports, profiles = [], []
    for name in gpus:
        try:
            profile = load_gpu(name)
        except ProfileError as e:
            raise CalibrationError(str(e)) from e
        folder = None
        if data is not None:
            folder = data / profile.name if (data / profile.name).is_dir() else data
        _, report = calibrate(profile, folder)
        reports.append(report)
        profiles.append(profile)
    print(report_table(reports))
    print()
    print(params_table(reports))
    if args.write:
        for profile, report in zip(profiles, reports, strict=True):
            path = write_profile(profile, report)
            print(f"wrote calibration of {profile.name} to {path}")
    if args.report:
        out = write_report(reports, Path(args.report))
        print(f"wrote {out}")
    return 0


def _engine_main(args: Any) -> int:
    """The ``--engine-from RESULTS...`` branch: fit an engine profile to benchmark runs."""
    from sim.cli.validate import DEFAULTS
    from sim.cost.roofline import DEFAULT_ENGINE
    from sim.experiments.bench_results import load_bench_results
    from sim.experiments.results import write_text
    from sim.experiments.validate import engine_yaml, fit_engine

    if not args.out:
        raise CalibrationError("--engine-from needs --out FILE.yaml for the fitted profile")
    out = Path(args.out)
    if out.exists():
        raise CalibrationError(f"{out} exists; batchsim never overwrites it (choose another "
                               "--out)")
    check_writable(out, "--out", folder=False)  # before the fit, not exit 1 after it
    # the shared options are None when not given (so that other modes can refuse them)
    given = {k: DEFAULTS[k] if getattr(args, k, None) is None else getattr(args, k)
             for k in DEFAULTS}
    model, hardware = str(given["model"]), str(given["hardware"])
    tp, seed = int(given["tp"]), int(given["seed"])
    runs = [run for path in args.engine_from for run in load_bench_results(path)]
    profile, rows = fit_engine(runs, model, hardware, tp, args.engine or DEFAULT_ENGINE,
                               seed=seed)
    for run, row in zip(runs, rows, strict=True):
        print(f"{run.source}: mean TPOT measured {row['measured_mean_tpot_ms']:.3f} ms, "
              f"simulated {row['simulated_mean_tpot_ms']:.3f} ms")
    keys = ("per_step_s", "per_seq_s") if tp == 1 else ("tp_per_step_s", "tp_per_seq_s")
    print(", ".join(f"{k} = {getattr(profile, k):.6g}" for k in keys))
    write_text(out, engine_yaml(profile, [str(p) for p in args.engine_from], model, hardware,
                                tp))
    print(f"wrote {out}")
    return 0


def _iteration_main(path: Path, args: Any) -> int:
    """The iteration-CSV branch of ``main``."""
    from sim.cost.iteration_calibration import fit_iterations, is_iteration_csv

    if not is_iteration_csv(path):
        raise CalibrationError(f"{path}: not an iteration CSV (need columns model,hardware,tp,"
                               "batch_size,new_tokens,context_tokens,measured_ms) and not a "
                               "folder of kernel tables")
    if args.write:
        raise CalibrationError("--write applies to kernel tables; for an iteration CSV use "
                               "--report DIR, which writes engine.yaml")
    rep = fit_iterations(path)
    print(rep.table())
    if args.report:
        out = Path(args.report)
        out.mkdir(parents=True, exist_ok=True)
        with OutputLock(out, "--report"):  # the lock file marks the folder as batchsim's
            write_text(out / "engine.yaml", rep.engine_yaml())
            write_text(out / "report.md", rep.table() + "\n\n![fit](iteration_fit.png)\n")
            _scatter(out / "iteration_fit.png", f"iteration fit: {path.name}",
                     {g: (rep.predicted_ms[rep.groups == g] / 1e3,
                          rep.measured_ms[rep.groups == g] / 1e3, rep.heldout[rep.groups == g])
                      for g in dict.fromkeys(rep.groups)})
        print(f"wrote {out / 'report.md'}")
    return 0


def profile_path(profile: GpuProfile) -> Path:
    """The YAML file a profile was loaded from (built-in names resolve into the checkout)."""
    path = Path(profile.origin)
    if path.is_file():
        return path
    builtin = checkout_root() / "hardware_profiles" / profile.origin
    if builtin.is_file():
        return builtin
    raise CalibrationError(f"cannot locate the YAML file of GPU profile {profile.name!r}")


def calibration_block(report: CalibrationReport, date: str | None = None) -> dict[str, Any]:
    """The ``calibration:`` mapping to store: fitted values (4 significant digits) and a ``fit``
    record of data origin, date, method and error. Keys ``sim.cost.profiles.Calibration`` does not
    declare yet go inside ``fit`` (where ``sim.cost.roofline`` also looks for them)."""
    known = set(Calibration.__dataclass_fields__) - {"fit"}
    top: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for key, value in report.params.items():
        if key in _ALPHA_KEYS:
            continue
        (top if key in known else extra)[key] = float(f"{value:.4g}")
    root = checkout_root()
    try:
        data = str(Path(report.data).resolve().relative_to(root)) + "/"
    except ValueError:
        data = report.data
    fit = {"data": f"{data} (kernel timings; see hardware_profiles/measurements/PROVENANCE.md)",
           "date": date or _dt.date.today().isoformat(),
           "method": "sim.cost.calibrate.calibrate (batchsim calibrate): bounded soft-L1 least "
                     "squares on log latency; whole shape families held out",
           "holdout": HOLDOUT_NOTE,
           "heldout_mdape_pct": {c: round(v, 1) for c, v in report.heldout_mdape_pct.items()}
           | {"overall": round(report.overall_heldout_mdape_pct, 1)},
           "train_mdape_pct": {c: round(v, 1) for c, v in report.train_mdape_pct.items()},
           "heldout_rows": dict(report.n_heldout),
           # the training rows' errors, which prediction intervals draw from
           "train_log_residual_quantiles": residual_quantiles(report.points),
           "range": dict(MEASURED_RANGE)}
    status = {"status": "fitted", "fitted_on": _FITTED_ON.get(report.gpu, data)}
    return status | top | {"fit": fit | extra}


def write_profile(profile: GpuProfile, report: CalibrationReport, date: str | None = None
                  ) -> Path:
    """Rewrite the ``calibration:`` block and the fitted all-reduce α lines of the profile's
    YAML in place; every other line (``sources:``, comments) is kept byte for byte."""
    path = profile_path(profile)
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    block = yaml.safe_dump({"calibration": calibration_block(report, date)}, sort_keys=False,
                           allow_unicode=True, width=100)
    start = next((i for i, ln in enumerate(lines) if ln.startswith("calibration:")), None)
    if start is None:
        at = next((i for i, ln in enumerate(lines) if ln.startswith("sources:")), len(lines))
        lines[at:at] = [block]
    else:
        end = start + 1
        while end < len(lines) and (lines[end].startswith((" ", "\t")) or not lines[end].strip()):
            end += 1
        lines[start:end] = [block]
    text = "".join(lines)
    for key in _ALPHA_KEYS:
        if key in report.params:
            value = f"{report.params[key]:.4g}"
            text, n = re.subn(rf"(?m)^(\s+{key}:)\s*[^#\n]*", rf"\g<1> {value}", text, count=1)
            if not n:
                text = re.sub(r"(?m)^(interconnect:\n)", rf"\g<1>  {key}: {value}\n", text,
                              count=1)
    try:
        yaml.safe_load(text)
    except yaml.YAMLError as e:  # never leave a broken profile behind
        raise CalibrationError(f"{path}: rewritten YAML would not parse ({e})") from e
    write_text(path, text)  # atomically: a crash never leaves the profile half-written
    return path


def _scatter(path: Path, title: str,
             points: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]) -> None:
    """Log-log predicted vs measured (ms), one colour per group, y = x and a ±10 % band;
    held-out points filled, training points hollow."""
    from sim.report.mpl_home import use_own_folder

    use_own_folder()  # matplotlib's files in batchsim's folder, not the home
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 6.0))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    lo, hi = np.inf, 0.0
    for i, (name, (pred, meas, held)) in enumerate(points.items()):
        p, m = np.asarray(pred) * 1e3, np.asarray(meas) * 1e3
        colour = _COLOURS.get(name, f"C{i}")
        ax.scatter(m[~held], p[~held], s=6, facecolors="none", edgecolors=colour, alpha=0.3,
                   linewidths=0.5)
        ax.scatter(m[held], p[held], s=6, color=colour, alpha=0.6, label=f"{name} (held-out)")
        both = np.concatenate([p, m])
        lo, hi = min(lo, both.min()), max(hi, both.max())
    x = np.geomspace(lo * 0.8, hi * 1.25, 50)
    ax.plot(x, x, "k-", lw=0.8, label="y = x")
    ax.fill_between(x, x * 0.9, x * 1.1, color="grey", alpha=0.25, label="±10 %")
    ax.set(xscale="log", yscale="log", xlabel="measured (ms)", ylabel="predicted (ms)",
           title=title)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    atomic_write(path, lambda p: fig.savefig(p, format="png", dpi=110))


def write_report(reports: list[CalibrationReport], out: Path) -> Path:
    """Write ``report.md`` (error table, parameters, hold-out design) and one scatter per GPU."""
    out.mkdir(parents=True, exist_ok=True)
    with OutputLock(out, "--report"):  # the lock file marks the folder as batchsim's
        return _write_report(reports, out)


def _write_report(reports: list[CalibrationReport], out: Path) -> Path:
    """``write_report``'s files, written under the folder's lock."""
    parts = ["# Roofline calibration report", "", report_table(reports), "", HOLDOUT_NOTE, "",
             "## Fitted parameters", "", params_table(reports), ""]
    for r in reports:
        png = f"{r.gpu}_pred_vs_meas.png"
        _scatter(out / png, f"{r.gpu}: held-out MdAPE {r.overall_heldout_mdape_pct:.1f} %",
                 r.points)
        parts += [f"## {r.gpu}", "", f"Data: `{r.data}`", "", f"![{r.gpu}]({png})", ""]
    path = out / "report.md"
    write_text(path, "\n".join(parts))
    return path
