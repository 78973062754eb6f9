"""Fuzzing the input layer: whatever a user feeds ``batchsim``, it runs or says why in one line.

The public contract for every config file, ``--set`` override and trace file:

- either the run succeeds — exit 0, ``summary.csv`` written, every run folder finished
  (``summary.json``, no ``error.txt``), every request finished with all its tokens or rejected
  with a reason, and the numbers are sane (finite arrival times, positive TTFT);
- or the input is refused — exit 2 and exactly one line on stderr, never a traceback;
- never exit 1 (an internal error), never a hang, never a runaway allocation.

Inputs are drawn by hypothesis: valid configs (tiny synthetic workloads, constant or linear
cost, unlimited or small KV, a small trace) mutated by deleting, inserting, renaming and
replacing keys with wrong types, zero/negative/huge numbers, NaN/inf, empty strings, bytes and
nested junk; raw YAML texts damaged byte by byte (bad encodings, tabs, anchors); random
``--set`` overrides; and trace files in the three formats (native, Vidur, Azure) with junk
cells, unsorted and duplicate rows, wrong columns, CRLF, BOMs, UTF-16/latin-1, trailing commas,
quoted numbers and truncation.

Each example calls ``sim.cli.main.main`` in-process (fast) under a guard: ``signal.setitimer``
turns a run longer than ``LIMIT_S`` into a failure (a hang) and ``RLIMIT_AS`` caps the extra
address space at ``HEADROOM_BYTES`` (a runaway allocation becomes a ``MemoryError``, exit 1).
The run is derandomised (the same examples in CI every time); ``BATCHSIM_FUZZ_SCALE=N``
multiplies the example counts and draws fresh ones, for longer local fuzzing sessions.

The bugs this fuzzing found are fixed and kept as minimal regression tests at the end of this
file. A new one gets a strict-xfail reproduction there and a clause in ``known_bug`` (which
steers the fuzz around its trigger) until it is fixed.
"""
from __future__ import annotations

import contextlib
import copy
import io
import math
import os
import resource
import signal
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow.parquet  # noqa: F401 - write_table's lazy import, paid up front (as below)
import pytest
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import sim.experiments.run  # noqa: F401 - imported up front so that no example's timer pays for it
import sim.report.markdown  # noqa: F401
from sim.cli.main import main
from sim.experiments.config import ConfigError, parse_override, set_dotted
from sim.experiments.results import read_json, read_table
from sim.experiments.schema import SCHEMA

#: Seconds one example may run before it counts as a hang.
LIMIT_S = 5.0
#: Address space an example may add to the test process before it counts as a runaway.
HEADROOM_BYTES = 2 << 30

SCALE = int(os.environ.get("BATCHSIM_FUZZ_SCALE", "1"))


def fuzz_settings(n: int) -> settings:
    """``n`` examples (times ``BATCHSIM_FUZZ_SCALE``); derandomised unless scaled up."""
    return settings(max_examples=n * SCALE, deadline=None, derandomize=SCALE == 1,
                    database=None if SCALE == 1 else settings.default.database,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                           HealthCheck.data_too_large])


# -- running one input under a guard ---------------------------------------------------------

class Hang(BaseException):
    """Raised by the timer: a ``BaseException`` so that no ``except Exception`` swallows it."""


def _vm_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


@contextlib.contextmanager
def guarded(limit_s: float = LIMIT_S, headroom: int = HEADROOM_BYTES):
    """Fail with ``Hang`` after ``limit_s`` seconds; cap new address space at ``headroom``."""
    def alarm(signum, frame):
        raise Hang(f"still running after {limit_s} s")

    old_handler = signal.signal(signal.SIGALRM, alarm)
    old_limit = resource.getrlimit(resource.RLIMIT_AS)
    cap = _vm_bytes() + headroom
    if old_limit[1] != resource.RLIM_INFINITY:
        cap = min(cap, old_limit[1])
    resource.setrlimit(resource.RLIMIT_AS, (cap, old_limit[1]))
    signal.setitimer(signal.ITIMER_REAL, limit_s)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old_handler)
        resource.setrlimit(resource.RLIMIT_AS, old_limit)


@dataclass
class Outcome:
    """What one CLI call did."""

    code: int
    out: str
    err: str


def invoke(*argv: str, limit_s: float = LIMIT_S) -> Outcome:
    """``batchsim ARGV`` in-process, guarded, with stdout and stderr captured."""
    out, err = io.StringIO(), io.StringIO()
    try:
        with guarded(limit_s), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(argv))
            except SystemExit as e:  # argparse
                code = e.code if isinstance(e.code, int) else 1
    except Hang as e:
        raise AssertionError(f"hang: batchsim {' '.join(argv)[:300]}: {e}") from None
    return Outcome(code, out.getvalue(), err.getvalue())


def assert_refused_cleanly(res: Outcome) -> None:
    """Exit 2 with exactly one line on stderr, no traceback."""
    assert res.code == 2, res.err
    assert "Traceback" not in res.err, res.err
    assert res.err.count("\n") == 1 and res.err.endswith("\n"), repr(res.err)
    assert res.err.startswith("batchsim: error: "), res.err


def assert_finished_cleanly(out: Path) -> None:
    """Exit 0 left a complete output folder whose every request ended properly."""
    summary = pd.read_csv(out / "summary.csv")
    assert len(summary) >= 1
    folders = sorted((out / "runs").iterdir())
    assert len(folders) >= summary["run_id"].nunique()  # equal sweep points share a folder
    for folder in folders:
        assert not (folder / "error.txt").exists(), (folder / "error.txt").read_text()
        assert (folder / "summary.json").exists(), folder
        s = read_json(folder / "summary.json")
        cfg = yaml.safe_load((folder / "config.yaml").read_text())
        df = read_table(folder / "requests")
        horizon = cfg["limits"]["horizon_s"] is not None
        allowed = {"finished", "rejected"} | ({"waiting", "running"} if horizon else set())
        assert set(df["status"]) <= allowed, set(df["status"])
        fin, rej = df[df["status"] == "finished"], df[df["status"] == "rejected"]
        assert (fin["num_generated"] == fin["num_output_tokens"]).all()
        assert (rej["reason"].astype(str).str.len() > 0).all()
        assert df["arrival_s"].map(math.isfinite).all() and (df["arrival_s"] >= 0).all()
        assert (df["num_prompt_tokens"] >= 1).all() and (df["num_output_tokens"] >= 1).all()
        assert (fin["ttft_s"] > 0).all(), "a token came out in zero time"
        assert (fin["e2e_s"] >= fin["ttft_s"]).all()
        if cfg["metrics"]["warmup_s"] == 0 and cfg["metrics"]["cooldown_s"] == 0:
            assert s["completed"] + s["num_rejected"] + s["num_unfinished"] == len(df)


def check(res: Outcome, out: Path) -> None:
    """The contract: a clean success or a clean one-line refusal, nothing else."""
    errors = "".join(p.read_text() for p in out.glob("runs/*/error.txt"))
    assert res.code in (0, 2), f"exit {res.code}:\n{res.err}\n{errors}"
    if res.code == 2:
        assert_refused_cleanly(res)
    else:
        assert_finished_cleanly(out)


# -- valid starting points ---------------------------------------------------------------------

SMALL_TRACE = ("arrival_s,num_prompt_tokens,num_output_tokens\n"
               "0,12,3\n0.01,40,2\n0.01,7,5\n0.2,100,1\n0.35,64,4\n")

BASES: list[dict[str, Any]] = [
    {"name": "synthetic", "seed": 1, "cost": {"kind": "constant", "step_s": 0.01},
     "kv": {"unlimited": True},
     "workload": {"arrival": {"process": "poisson", "rate": 20}, "num_requests": 12,
                  "prompt_tokens": {"dist": "uniform", "lo": 4, "hi": 60},
                  "output_tokens": {"dist": "uniform", "lo": 1, "hi": 8}},
     "policy": {"name": "continuous", "max_num_seqs": 4}, "output": {"plots": False}},
    {"name": "small-kv", "seed": 3, "cost": {"kind": "linear", "base_s": 0.005,
                                             "per_token_s": 1e-5},
     "kv": {"num_blocks": 12, "block_size": 8},
     "workload": {"arrival": {"process": "gamma", "rate": 30, "cv": 2.0}, "num_requests": 10,
                  "prompt_tokens": {"dist": "lognormal", "median": 20, "sigma": 0.8,
                                    "max": 90},
                  "output_tokens": {"dist": "exponential", "mean": 4}},
     "policy": {"name": "static", "batch_size": 3, "timeout_s": 0.1},
     "slos": {"ttft_ms": 100}, "output": {"plots": False}},
    {"name": "trace", "seed": 0, "cost": {"kind": "constant", "step_s": 0.005},
     "kv": {"num_blocks": 40, "block_size": 4},
     "workload": {"trace": "t.csv", "max_requests": 5},
     "policy": {"name": "chunked_prefill", "token_budget": 32, "max_num_seqs": 3},
     "output": {"plots": False}},
    {"name": "mix-sweep", "seed": 5, "cost": {"kind": "constant", "step_s": 0.01},
     "kv": {"num_blocks": 30, "block_size": 16, "allocator": "slab", "reserve_tokens": 64},
     "workload": {"arrival": {"process": "constant", "rate": 50}, "num_requests": 8,
                  "mix": [{"fraction": 0.5, "prompt_tokens": {"dist": "fixed", "value": 8},
                           "output_tokens": {"dist": "fixed", "value": 2}},
                          {"fraction": 0.5, "tenant": "b",
                           "prompt_tokens": {"dist": "uniform", "lo": 1, "hi": 30},
                           "output_tokens": {"dist": "uniform", "lo": 1, "hi": 4}}]},
     "policies": [{"name": "dynamic", "max_batch_size": 2, "max_wait_s": 0.02},
                  {"name": "continuous", "label": "cb"}],
     "sweep": {"seed": [5, 6]}, "metrics": {"warmup_s": 0.02},
     "output": {"plots": False}},
    {"name": "horizon", "seed": 2, "cost": {"kind": "constant", "step_s": 0.02},
     "kv": {"unlimited": True}, "limits": {"horizon_s": 0.1},
     "workload": {"arrival": {"process": "poisson", "rate": 40}, "duration_s": 0.3,
                  "prompt_tokens": {"dist": "fixed", "value": 16},
                  "output_tokens": {"dist": "fixed", "value": 6}},
     "policy": "continuous", "output": {"plots": False}},
]


def _schema_names(node: dict[str, Any]) -> set[str]:
    names = set(node)
    for v in node.values():
        if isinstance(v, dict):
            names |= _schema_names(v)
    return names


#: Key names a mutation may use: every schema key, workload and policy key, plus near-misses.
KEY_NAMES = sorted(_schema_names(SCHEMA) | {
    "arrival", "process", "rate", "cv", "num_requests", "duration_s", "prompt_tokens",
    "output_tokens", "lengths", "dist", "value", "lo", "hi", "mean", "median", "sigma", "min",
    "max", "trace", "sort", "start_s", "max_requests", "time_scale", "mix", "fraction",
    "tenant", "priority", "max_prompt_tokens", "max_output_tokens", "label", "batch_size",
    "timeout_s", "max_num_seqs", "max_num_batched_tokens", "token_budget", "chunk_size",
    "watermark", "ordering", "max_wait_s", "max_batch_size", "bucket_by_prompt", "mode",
    "nme", "worklod", "", " ", "workload.rate"})

#: Numbers at the edges: zero, negative, tiny, huge, non-finite. Huge stays absurd (>= 1e12):
#: a legitimately large but slow workload is not what this file hunts.
EDGE_NUMBERS = [0, -1, 1, 2, -0.0, 0.5, 1.5, -1e-9, 1e-9, 10**12, 2**63, 10**30, 1e300,
                -1e300, math.nan, math.inf, -math.inf]

scalars = st.one_of(
    st.none(), st.booleans(), st.sampled_from(EDGE_NUMBERS), st.integers(-5, 40),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=6),
    st.sampled_from(["", "continuous", "poisson", "fixed", "paged", "slab", "constant",
                     "t.csv", "azure-conv", "llama-3-8b", "h100-sxm", "1e3", "0x10", "~",
                     "yes", "null", ".nan"]),
    st.binary(max_size=6))
keys = st.sampled_from(KEY_NAMES) | st.text(max_size=5) | st.integers(-3, 3)
junk = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(keys, inner, max_size=3), max_leaves=6)


def deep(depth: int) -> Any:
    """A list nested ``depth`` levels (YAML parsers are recursive)."""
    v: Any = 1
    for _ in range(depth):
        v = [v]
    return v


def paths(tree: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path to a node of a nested dict/list tree (the root excluded)."""
    out = []
    items = tree.items() if isinstance(tree, dict) else (
        enumerate(tree) if isinstance(tree, list) else ())
    for k, v in items:
        out.append(prefix + (k,))
        out += paths(v, prefix + (k,))
    return out


def parent_of(tree: Any, path: tuple) -> Any:
    for k in path[:-1]:
        tree = tree[k]
    return tree


@st.composite
def mutated_configs(draw) -> dict[str, Any]:
    """A valid base config with one to four random mutations."""
    cfg = copy.deepcopy(draw(st.sampled_from(BASES)))
    for _ in range(draw(st.integers(1, 4))):
        ps = paths(cfg)
        op = draw(st.sampled_from(["delete", "replace", "replace", "edge", "rename", "insert",
                                   "deep"]))
        path = draw(st.sampled_from(ps)) if ps else ()
        parent = parent_of(cfg, path) if path else cfg
        if op == "insert" or not path:
            target = parent if isinstance(parent, dict) else cfg
            target[draw(keys)] = draw(junk)
        elif op == "delete":
            del parent[path[-1]]
        elif op == "replace":
            parent[path[-1]] = draw(junk)
        elif op == "edge":
            parent[path[-1]] = draw(st.sampled_from(EDGE_NUMBERS))
        elif op == "deep":
            parent[path[-1]] = deep(draw(st.integers(2, 40)))
        elif isinstance(parent, dict):  # rename
            parent[draw(keys)] = parent.pop(path[-1])
    return cfg


def all_keys(tree: Any) -> list[Any]:
    """Every mapping key anywhere in a nested tree."""
    out: list[Any] = []
    if isinstance(tree, dict):
        for k, v in tree.items():
            out += [k] + all_keys(v)
    elif isinstance(tree, list):
        for v in tree:
            out += all_keys(v)
    return out


def dicts(tree: Any) -> list[dict]:
    """Every mapping anywhere in a nested tree, the tree itself included."""
    out: list[dict] = []
    if isinstance(tree, dict):
        out.append(tree)
        for v in tree.values():
            out += dicts(v)
    elif isinstance(tree, list):
        for v in tree:
            out += dicts(v)
    return out


def _num(d: dict, key: str) -> float | None:
    v = d.get(key)
    ok = isinstance(v, (int, float)) and not isinstance(v, bool)
    return float(v) if ok and math.isfinite(v) else None


def known_bug(cfg: Any) -> bool:
    """True when ``cfg`` hits a known, still unfixed bug (none today; add clauses with an
    xfail reproduction below when the fuzz finds one)."""
    return False


def run_config_text(text: str | bytes, *extra: str, limit_s: float = LIMIT_S) -> Outcome:
    """Write the config (and the small trace beside it), run it, check the contract."""
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        (root / "t.csv").write_text(SMALL_TRACE)
        exp = root / "exp.yaml"
        if isinstance(text, bytes):
            exp.write_bytes(text)
        else:
            exp.write_text(text, encoding="utf-8")
        res = invoke("run", str(exp), "--out", str(root / "out"), "--quiet", "--no-plots",
                     *extra, limit_s=limit_s)
        check(res, root / "out")
    return res


def dump(cfg: Any) -> str:
    return yaml.safe_dump(cfg, allow_unicode=True, sort_keys=False)


# -- raw YAML texts ------------------------------------------------------------------------------

RAW_SNIPPETS = [
    "\t", "\x00", "\xff", ": ", "- ", "{", "}", "[", "]", "&a ", "*a", "*zz", "<<: *a", "!!binary",
    "!!python/object/apply:os.system ['true']", "? [a, b]\n: 1", "---\n", "...\n", "%YAML 1.1\n",
    "#", "'", '"', "|\n", "~", ".nan", ".inf", "-.inf", "0x1F", "0o17", "1_000", "2001-01-01",
    "\ufeff", "\u2028", "é", "\U0001F600",
]

#: A hand-written config with comments, flow and block style and an anchor (a valid start).
RAW_BASE = """\
# a tiny experiment
name: raw
seed: 4
cost: {kind: constant, step_s: 0.01}
kv: &kv
  num_blocks: 64
  block_size: 16
workload:
  arrival: {process: poisson, rate: 25}
  num_requests: 9
  prompt_tokens: &len {dist: uniform, lo: 3, hi: 40}
  output_tokens: *len
policy: {name: continuous, max_num_seqs: 3}
output: {plots: false}
"""


@st.composite
def raw_configs(draw) -> bytes:
    """A valid YAML text damaged at the text and byte level, in some encoding."""
    text = draw(st.sampled_from([RAW_BASE, dump(BASES[0]), dump(BASES[3])]))
    for _ in range(draw(st.integers(1, 3))):
        lines = text.split("\n")
        i = draw(st.integers(0, len(lines) - 1))
        op = draw(st.sampled_from(["snippet", "text", "dup", "drop", "indent", "cut"]))
        if op == "snippet":
            pos = draw(st.integers(0, len(lines[i])))
            lines[i] = lines[i][:pos] + draw(st.sampled_from(RAW_SNIPPETS)) + lines[i][pos:]
        elif op == "text":
            lines[i] = draw(st.text(max_size=12))
        elif op == "dup":
            lines.insert(i, lines[i])
        elif op == "drop":
            del lines[i]
        elif op == "indent":
            lines[i] = draw(st.sampled_from(["\t", " ", "   "])) + lines[i]
        else:
            lines = lines[:i]
        text = "\n".join(lines)
    if draw(st.booleans()):
        text = text.replace("\n", "\r\n")
    encoding = draw(st.sampled_from(["utf-8", "utf-8", "utf-8-sig", "utf-16", "utf-32",
                                     "latin-1"]))
    data = text.encode(encoding, errors="replace")
    if draw(st.integers(0, 4)) == 0:
        pos = draw(st.integers(0, len(data)))
        data = data[:pos] + draw(st.binary(min_size=1, max_size=8)) + data[pos:]
    return data


# -- --set overrides -----------------------------------------------------------------------------

def _dotted(node: dict[str, Any], prefix: str = "") -> list[str]:
    out = []
    for k, v in node.items():
        out += _dotted(v, f"{prefix}{k}.") if isinstance(v, dict) else [prefix + k]
    return out


SET_KEYS = sorted(set(_dotted(SCHEMA)) | {
    "workload.arrival.rate", "workload.arrival.process", "workload.num_requests",
    "workload.duration_s", "workload.prompt_tokens.dist", "workload.prompt_tokens.hi",
    "workload.output_tokens", "workload.trace", "workload.mix", "policy.name",
    "policy.max_num_seqs", "policy.label", "policy.batch_size", "sweep.seed",
    "sweep.workload.arrival.rate", "zip.seed", "workload", "policy", "kv", "limits",
    "nme", "kv.num_blocks.x", "a..b", ".seed", "seed.", "", " "})


@st.composite
def set_args(draw) -> list[str]:
    """One to three ``--set KEY=VALUE`` arguments with schema, near-miss and junk keys."""
    out = []
    for _ in range(draw(st.integers(1, 3))):
        key = draw(st.sampled_from(SET_KEYS) | st.text(max_size=8))
        value = draw(st.one_of(
            st.sampled_from(["", "1", "0", "-1", "1.0e+12", "1000000000000", ".nan", ".inf",
                             "null", "true", "[1, 2]", "[]", "{}", "{a: 1}", "[1", "x: y: z",
                             "continuous", "poisson", "'1'", "*a", "&a 1", "!!binary AA==",
                             "{name: static, batch_size: 2}", "é", "\x00"]),
            st.text(max_size=10),
            junk.map(lambda v: yaml.safe_dump(v, default_flow_style=True, width=10**6)
                     .strip())))
        sep = draw(st.sampled_from(["=", "=", "=", "", "=="]))
        out.append(f"--set={key}{sep}{value}")
    return out


# -- trace files ---------------------------------------------------------------------------------

TRACE_COLUMNS = {
    "native": ("arrival_s", "num_prompt_tokens", "num_output_tokens"),
    "vidur": ("arrived_at", "num_prefill_tokens", "num_decode_tokens"),
    "azure": ("TIMESTAMP", "ContextTokens", "GeneratedTokens"),
}
CELL_JUNK = ["", " ", "nan", "NaN", "inf", "-inf", "-1", "0", "-0", "1e30", "1e7", "10000001",
             "abc", '"12"', "'12'", "1.5", "0x10", " 7 ", "1_000", "١٢", "1e400", "9" * 30,
             "true", "NULL", "NA", '"1,2"', '"', "2023-13-45 99:99:99", "1e-300", "12.0", "+3",
             "\x00", "é", "2023-11-16 18:15:46", "1e9", "1000000001"]


def _stamp(t: float) -> str:
    whole = int(t)
    return f"2023-11-16 18:{15 + whole // 60:02d}:{whole % 60:02d}.{int((t % 1) * 1e7):07d}"


@st.composite
def trace_files(draw) -> bytes:
    """A valid trace in one of the three formats, then damaged cell, row, line and byte-wise."""
    fmt = draw(st.sampled_from(sorted(TRACE_COLUMNS)))
    n = draw(st.integers(1, 8))
    t, rows = 0.0, []
    for _ in range(n):
        t += draw(st.sampled_from([0.0, 0.001, 0.05, 0.3, 1.0]))
        stamp = _stamp(t) if fmt == "azure" else repr(round(t, 6))
        rows.append([stamp, str(draw(st.integers(1, 300))), str(draw(st.integers(1, 12)))])
    header = list(TRACE_COLUMNS[fmt])
    if fmt == "native" and draw(st.booleans()):
        header.append(draw(st.sampled_from(["priority", "tenant", "prefix_id"])))
        for r in rows:
            r.append(draw(st.sampled_from(["0", "3", "a", "", "-2", "1.5", "NA"])))
    for _ in range(draw(st.integers(0, 4))):
        op = draw(st.sampled_from(["cell", "cell", "swap", "dup", "drop_row", "drop_col",
                                   "rename", "extra_col", "short_row", "quote", "space"]))
        if not header:  # every column dropped already: nothing left to damage
            break
        i = draw(st.integers(0, len(rows) - 1)) if rows else 0
        j = draw(st.integers(0, len(header) - 1))
        if op == "cell" and rows and j < len(rows[i]):
            rows[i][j] = draw(st.sampled_from(CELL_JUNK) | st.text(max_size=6))
        elif op == "swap" and len(rows) > 1:
            k = draw(st.integers(0, len(rows) - 1))
            rows[i], rows[k] = rows[k], rows[i]
        elif op == "dup" and rows:
            rows.insert(i, list(rows[i]))
        elif op == "drop_row" and rows:
            del rows[i]
        elif op == "drop_col":
            del header[j]
            for r in rows:
                del r[j:j + 1]
        elif op == "rename":
            # (not header[j] + " ": test_header_with_spaces_is_read_or_refused)
            header[j] = draw(st.sampled_from(["", "x", header[j].upper(), "arrival_s",
                                              "TIMESTAMP", f'"{header[j]}"']))
        elif op == "extra_col":
            header.append("extra")
            for r in rows:
                r.append("1")
        elif op == "short_row" and rows:
            rows[i] = rows[i][:-1]
        elif op == "quote":
            rows = [[f'"{c}"' for c in r] for r in rows]
        elif op == "space":
            rows = [[f" {c} " for c in r] for r in rows]
    lines = [",".join(header)] + [",".join(r) for r in rows]
    if draw(st.integers(0, 5)) == 0:
        lines = [line + "," for line in lines]  # trailing commas
    if draw(st.integers(0, 5)) == 0:
        lines.insert(draw(st.integers(1, len(lines))), "")  # a blank line
    eol = draw(st.sampled_from(["\n", "\n", "\r\n", "\r"]))
    text = eol.join(lines) + (eol if draw(st.booleans()) else "")
    encoding = draw(st.sampled_from(["utf-8", "utf-8", "utf-8", "utf-8-sig", "utf-16",
                                     "latin-1"]))
    data = text.encode(encoding, errors="replace")
    cut = draw(st.integers(0, 9))
    if cut == 0:
        data = data[:draw(st.integers(0, len(data)))]
    elif cut == 1:
        pos = draw(st.integers(0, len(data)))
        data = data[:pos] + draw(st.binary(min_size=1, max_size=8)) + data[pos:]
    return data


def run_trace(data: bytes, sort: bool) -> None:
    """``trace-stats`` and ``run`` on the trace: each runs or refuses in one line."""
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        (root / "t.csv").write_bytes(data)
        stats = invoke("trace-stats", str(root / "t.csv"))
        assert stats.code in (0, 2), stats.err
        if stats.code == 2:
            assert_refused_cleanly(stats)
        cfg = {"name": "trace-fuzz", "cost": {"kind": "constant", "step_s": 0.01},
               "kv": {"num_blocks": 200, "block_size": 16},
               "workload": {"trace": "t.csv", "sort": sort},
               "policy": {"name": "continuous", "max_num_batched_tokens": 512},
               "output": {"plots": False}}
        (root / "exp.yaml").write_text(dump(cfg))
        res = invoke("run", str(root / "exp.yaml"), "--out", str(root / "out"), "--quiet")
        check(res, root / "out")
        if not sort:
            assert (res.code == 0) == (stats.code == 0), (stats.err, res.err)
        if res.code == 0:
            df = read_table(next((root / "out" / "runs").iterdir()) / "requests")
            assert f"requests         {len(df):,}" in stats.out or sort


# -- the fuzz tests ------------------------------------------------------------------------------

def test_every_base_config_runs():
    for cfg in BASES:
        run_config_text(dump(cfg))
    run_config_text(RAW_BASE)


@fuzz_settings(450)
@given(cfg=mutated_configs())
def test_mutated_configs_run_or_fail_in_one_line(cfg):
    assume(not known_bug(cfg))
    run_config_text(dump(cfg))


@fuzz_settings(300)
@given(data=raw_configs())
def test_damaged_yaml_bytes_run_or_fail_in_one_line(data):
    run_config_text(data)


@fuzz_settings(300)
@given(base=st.sampled_from(BASES), args=set_args())
def test_random_set_overrides_run_or_fail_in_one_line(base, args):
    cfg = copy.deepcopy(base)
    merged = copy.deepcopy(base)
    with contextlib.suppress(ConfigError):
        for a in args:
            set_dotted(merged, *parse_override(a[len("--set="):]))
    assume(not known_bug(merged))
    run_config_text(dump(cfg), *args)


@fuzz_settings(450)
@given(data=trace_files(), sort=st.booleans())
def test_damaged_trace_files_run_or_fail_in_one_line(data, sort):
    run_trace(data, sort)


# -- regression tests: the minimal reproductions of the bugs this fuzzing found (all fixed) -----

TINY = """\
name: tiny
seed: 1
cost: {kind: constant, step_s: 0.01}
kv: {unlimited: true}
workload:
  arrival: {process: poisson, rate: 20}
  num_requests: 5
  prompt_tokens: {dist: fixed, value: 8}
  output_tokens: {dist: fixed, value: 2}
policy: {name: continuous}
output: {plots: false}
"""


def tiny(**replace: str) -> str:
    """``TINY`` with whole lines replaced: ``tiny(policy="policy: {name: [a]}")``."""
    lines = TINY.splitlines()
    for key, line in replace.items():
        lines = [line if x.startswith(f"{key}:") or x.startswith(f"  {key}:") else x
                 for x in lines]
    return "\n".join(lines) + "\n"


def refused(text: str | bytes, fragment: str = "", *extra: str, limit_s: float = 2.5) -> None:
    """Running ``text`` exits 2 with one line naming ``fragment`` (and not slowly)."""
    res = run_config_text(text, *extra, limit_s=limit_s)
    assert res.code == 2, res.err
    assert fragment in res.err, res.err


def test_tiny_config_runs():
    assert run_config_text(TINY).code == 0


def test_non_string_key_inside_workload_is_refused():
    refused(TINY.replace("  num_requests: 5", "  num_requests: 5\n  0: 1"), "workload")


def test_non_string_key_inside_policy_is_refused():
    refused(tiny(policy="policy: {name: continuous, 1: 2}"), "policy")


@pytest.mark.parametrize("line", ["policy: {name: [a]}", "policies: [[1]]",
                                  "policy: {name: {a: 1}}"])
def test_policy_name_of_wrong_type_is_refused(line):
    refused(tiny(policy=line), "polic")


def test_policy_choice_of_unhashable_type_is_refused():
    refused(tiny(policy="policy: {name: continuous, ordering: [fcfs]}"), "policy.ordering")


@pytest.mark.parametrize("param", ["token_budget", "max_num_seqs"])
def test_null_chunked_prefill_limit_is_refused(param):
    refused(tiny(policy=f"policy: {{name: chunked_prefill, {param}: null}}"), param)


def test_integer_step_time_beyond_int64_is_written_or_refused():
    run_config_text(tiny(cost="cost: {kind: constant, step_s: 9223372036854775808}"))


def test_absurd_num_requests_is_refused_not_allocated():
    refused(tiny(num_requests="  num_requests: 1000000000000"), "workload.num_requests")


def test_absurd_synthetic_duration_is_refused_not_allocated():
    refused(tiny(num_requests="  duration_s: 1.0e+12"), "workload.duration_s")


def test_absurd_replica_count_is_refused_quickly():
    refused(TINY + "parallelism: {replicas: 1000000000}\n", "parallelism.replicas")


def test_absurd_fixed_length_is_refused():
    refused(tiny(prompt_tokens="  prompt_tokens: {dist: fixed, value: 1000000000000}",
                 policy="policy: {name: chunked_prefill}"), "workload.prompt_tokens")


def test_fixed_length_beyond_int64_is_refused():
    refused(tiny(prompt_tokens="  prompt_tokens: {dist: fixed, value: 10000000000000000000}"),
            "workload.prompt_tokens.value")


def test_uniform_bound_beyond_int64_names_the_field():
    refused(tiny(prompt_tokens="  prompt_tokens: {dist: uniform, lo: 1, "
                               "hi: 10000000000000000000}"), "workload.prompt_tokens.hi")


@pytest.mark.parametrize("dist", ["{dist: lognormal, median: 10, sigma: 1000}",
                                  "{dist: exponential, mean: 1.0e+300}"])
def test_heavy_tailed_lengths_stay_in_range(dist):
    res = run_config_text(tiny(prompt_tokens=f"  prompt_tokens: {dist}"), limit_s=2.0)
    assert res.code in (0, 2), res.err  # check() has already verified a 0 is a clean run


def test_arrivals_beyond_float_precision_are_refused():
    refused(tiny(arrival="  arrival: {process: poisson, rate: 1.0e-300}"),
            "workload.arrival.rate")


def test_step_time_below_clock_resolution_is_refused():
    refused(tiny(cost="cost: {kind: constant, step_s: 1.0e-300}"), "cost.step_s")


def test_deeply_nested_yaml_is_refused():
    refused(TINY + "description: " + "[" * 1000 + "]" * 1000 + "\n", "exp.yaml")


def test_integer_literal_too_long_to_convert_is_refused():
    refused(tiny(seed="seed: 1" + "0" * 5000), "exp.yaml")


ALIAS_BOMB = "\n".join(
    ["    a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    + [f"    a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 8)])


def test_alias_bomb_in_policy_label_is_refused_quickly():
    refused(tiny(policy="policy:\n  name: continuous\n  label:\n" + ALIAS_BOMB), "policy.label")


def test_failed_runs_are_reported_even_when_quiet(monkeypatch):
    import sim.experiments.runner

    def boom(*args, **kwargs):
        raise RuntimeError("simulated internal error")

    monkeypatch.setattr(sim.experiments.runner, "simulate_config", boom)
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "exp.yaml").write_text(TINY)
        res = invoke("run", str(Path(d) / "exp.yaml"), "--out", str(Path(d) / "out"),
                     "--quiet")
    assert res.code == 1
    assert "simulated internal error" in res.err, repr(res.err)


def test_bad_argument_is_one_line():
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "exp.yaml").write_text(TINY)
        assert_refused_cleanly(invoke("run", str(Path(d) / "exp.yaml"), "--jobs", "two"))


def test_header_with_spaces_is_read_or_refused():
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "t.csv"
        path.write_text("arrival_s ,num_prompt_tokens,num_output_tokens\n0,1,1\n")
        res = invoke("trace-stats", str(path))
    assert res.code == 0 or (res.code == 2 and res.err.count("\n") == 1), res.err


def test_fully_quoted_trace_is_read():
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "t.csv"
        path.write_text('"arrival_s","num_prompt_tokens","num_output_tokens"\n"0","12","3"\n')
        res = invoke("trace-stats", str(path))
    assert res.code == 0, res.err


def test_duplicate_config_key_is_refused():
    refused(TINY + "seed: 2\n", "seed")
