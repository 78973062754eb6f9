"""Real benchmark results as batchsim reads them: ``vllm bench serve`` and guidellm reports.

**vllm bench serve** (``--save-result --save-detailed``) writes one JSON object with the run's
settings (``request_rate``, ``burstiness``, ``max_concurrency``, ``duration``) and, per request,
``input_lens``, ``output_lens``, ``ttfts`` (s) and ``itls`` (a list of inter-token gaps per
request, s); failed requests have an entry in ``errors`` and are skipped. It records no arrival
times: a replay draws them from the recorded rate (exponential gaps, or gamma ones with
``burstiness`` as the shape, as the benchmark client does; every request at t = 0 for
``request_rate: inf``).

**guidellm** (``guidellm benchmark --output-path X.json``) writes ``{"benchmarks": [...]}``; each
benchmark's ``requests.successful`` lists ``prompt_tokens``, ``output_tokens``, ``start_time``,
``first_token_time``, ``last_token_time`` and ``end_time`` (epoch s). Arrivals are the start
times (relative to the first); guidellm keeps no per-token gaps, so a request's ITLs are its
mean gap, ``(last − first token) / (output − 1)``, repeated.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sim.core.errors import InputError
from sim.core.fields import is_real
from sim.core.types import Request


class BenchResultError(InputError):
    """A benchmark result file is missing, unreadable or not in a known format."""


@dataclass(frozen=True)
class BenchRun:
    """One measured benchmark run: the requests and what was measured of each."""

    source: str
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    ttft_s: np.ndarray
    itls_s: tuple[np.ndarray, ...]  # per request: its inter-token gaps
    request_rate: float  # requests/s the client offered (inf: all at once)
    burstiness: float = 1.0
    arrival_s: np.ndarray | None = None  # recorded arrival times, when the format has them
    duration_s: float | None = None
    max_concurrency: int | None = None

    @property
    def e2e_s(self) -> np.ndarray:
        """Per request: first token plus every later gap."""
        return self.ttft_s + np.array([float(g.sum()) for g in self.itls_s])

    @property
    def tpot_s(self) -> np.ndarray:
        """Per request with two or more output tokens: (e2e − ttft) / (output − 1)."""
        many = self.output_tokens > 1
        return (self.e2e_s - self.ttft_s)[many] / (self.output_tokens[many] - 1)

    def arrivals(self, seed: int = 0) -> np.ndarray:
        """Arrival times: recorded ones, else drawn from the rate (see the module docstring)."""
        n = len(self.prompt_tokens)
        if self.arrival_s is not None:
            return self.arrival_s
        if math.isinf(self.request_rate):
            return np.zeros(n)
        rng = np.random.default_rng(seed)
        shape = self.burstiness
        gaps = rng.gamma(shape, 1.0 / (self.request_rate * shape), n)
        return np.cumsum(gaps) - gaps[0]

    def requests(self, seed: int = 0) -> list[Request]:
        """The measured requests with the same lengths, arriving as recorded (or drawn)."""
        return [Request(i, float(t), int(p), int(o)) for i, (t, p, o) in enumerate(zip(
            self.arrivals(seed), self.prompt_tokens, self.output_tokens, strict=True))]


def _array(data: dict[str, Any], key: str, source: str, whole: bool = False) -> np.ndarray:
    """The list ``data[key]`` as numbers (``_numbers``)."""
    value = data.get(key)
    if not isinstance(value, list):
        raise BenchResultError(f"missing list {key!r} (saved with --save-detailed?)",
                               source=source, field=key)
    return _numbers(value, source, key, whole)


def _numbers(value: Any, source: str, field: str, whole: bool = False,
             rows: Any = None) -> np.ndarray:
    """``value`` (a list) as finite non-negative floats (whole numbers if ``whole``), of the
    entries ``rows`` only if given; the first that is not one is a ``BenchResultError`` naming
    it (``ttfts[3]``)."""
    rows = range(len(value)) if rows is None else rows
    out = np.empty(len(rows))
    for k, i in enumerate(rows):
        v = value[i]
        ok = is_real(v) and math.isfinite(v) and v >= 0 and (not whole or float(v).is_integer())
        if not ok:
            kind = "a whole number >= 0" if whole else "a finite number >= 0"
            raise BenchResultError(f"must be {kind}, got {v!r}", source=source,
                                   field=f"{field}[{i}]")
        out[k] = v
    return out


def _rate(data: dict[str, Any], source: str) -> float:
    """The offered request rate: ``inf`` (all at once) or a finite number > 0."""
    rate = data.get("request_rate", "inf")
    if rate in ("inf", None) or (is_real(rate) and math.isinf(rate) and rate > 0):
        return math.inf
    if not is_real(rate) or not math.isfinite(rate) or rate <= 0:
        raise BenchResultError(f"must be a number > 0 or \"inf\", got {rate!r}", source=source,
                               field="request_rate")
    return float(rate)


def _from_vllm(data: dict[str, Any], source: str) -> BenchRun:
    """A ``vllm bench serve`` result object."""
    prompt = _array(data, "input_lens", source, whole=True)
    output = _array(data, "output_lens", source, whole=True)
    ttfts = data.get("ttfts")
    if not isinstance(ttfts, list):
        raise BenchResultError("missing list 'ttfts' (saved with --save-detailed?)",
                               source=source, field="ttfts")
    itls = data.get("itls")
    if not isinstance(itls, list) or not (len(prompt) == len(output) == len(ttfts) == len(itls)):
        raise BenchResultError("input_lens, output_lens, ttfts and itls must be lists of one "
                               "length", source=source, field="itls")
    errors = data.get("errors") or [""] * len(prompt)
    if not isinstance(errors, list) or len(errors) != len(prompt):
        raise BenchResultError("must be a list of one entry per request", source=source,
                               field="errors")
    ok = np.array([not e for e in errors], bool) & (output > 0)
    if not ok.any():
        raise BenchResultError("no successful request", source=source, field="errors")
    rate = _rate(data, source)
    idx = np.flatnonzero(ok)
    ttft = _numbers(ttfts, source, "ttfts", rows=idx.tolist())  # failed requests' are unused
    for i in idx:
        if not isinstance(itls[i], list):
            raise BenchResultError(f"must be a list of gaps, got {itls[i]!r}"[:200],
                                   source=source, field=f"itls[{i}]")
    return BenchRun(source, prompt[idx].astype(np.int64), output[idx].astype(np.int64),
                    ttft, tuple(_numbers(itls[i], source, f"itls[{i}]") for i in idx),
                    rate, _positive(data, "burstiness", source) or 1.0, None,
                    _positive(data, "duration", source),
                    _max_concurrency(data, source))


def _positive(data: dict[str, Any], key: str, source: str) -> float | None:
    """``data[key]``: ``None`` when absent or null, else it must be a finite number > 0 (a run
    of ``duration: 0`` or a ``burstiness`` of 0 was silently read as unset)."""
    value = data.get(key)
    if value is None:
        return None
    if not is_real(value) or not math.isfinite(value) or value <= 0:
        raise BenchResultError(f"must be a number > 0, got {value!r}"[:200], source=source,
                               field=key)
    return float(value)


def _max_concurrency(data: dict[str, Any], source: str) -> int | None:
    """The client's concurrency cap: absent or null (no cap), else a whole number >= 1."""
    value = data.get("max_concurrency")
    if value is None:
        return None
    if not is_real(value) or not math.isfinite(value) or not float(value).is_integer() \
            or value < 1:
        raise BenchResultError(f"must be a whole number >= 1 or null, got {value!r}"[:200],
                               source=source, field="max_concurrency")
    return int(value)


def _from_guidellm(bench: dict[str, Any], source: str) -> BenchRun:
    """One benchmark of a guidellm report."""
    if not isinstance(bench, dict):
        raise BenchResultError(f"expected a benchmark object, got {bench!r}"[:200], source=source)
    requests = bench.get("requests")
    reqs = requests.get("successful") if isinstance(requests, dict) else None
    if not isinstance(reqs, list) or not reqs:
        raise BenchResultError("benchmark without requests.successful", source=source,
                               field="requests.successful")
    try:
        cols = {k: np.array([float(r[k]) for r in reqs]) for k in (
            "prompt_tokens", "output_tokens", "start_time", "first_token_time",
            "last_token_time")}
    except (KeyError, TypeError, ValueError) as e:
        raise BenchResultError(f"request field {e} missing or not a number", source=source,
                               field="requests.successful") from None
    for key, col in cols.items():  # NaN, inf and negative lengths would replay as nonsense
        bad = ~np.isfinite(col) | ((col < 0) if key.endswith("tokens") else False)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise BenchResultError(f"must be a finite number (tokens >= 0), got {col[i]!r}",
                                   source=source, field=f"requests.successful[{i}].{key}")
    out = cols["output_tokens"].astype(np.int64)
    gap = (cols["last_token_time"] - cols["first_token_time"]) / np.maximum(out - 1, 1)
    start = cols["start_time"]
    arrival = start - start.min()
    span = float(arrival.max())
    rate = (len(reqs) - 1) / span if span > 0 else math.inf
    return BenchRun(source, cols["prompt_tokens"].astype(np.int64), out,
                    cols["first_token_time"] - start,
                    tuple(np.full(max(int(o) - 1, 0), g) for o, g in zip(out, gap, strict=True)),
                    rate, 1.0, arrival)


def load_bench_results(path: str | Path) -> list[BenchRun]:
    """Every run in a ``vllm bench serve`` JSON or a guidellm report (one run per benchmark)."""
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except OSError as e:
        raise BenchResultError(f"cannot read ({e.strerror or e})", source=str(p)) from None
    except (ValueError, UnicodeDecodeError) as e:
        raise BenchResultError(f"not JSON ({e})", source=str(p)) from None
    if isinstance(data, dict) and isinstance(data.get("benchmarks"), list):
        if not data["benchmarks"]:  # it printed a header and no table, exit 0
            raise BenchResultError("no benchmark entries (a guidellm report needs at least one "
                                   "benchmark with requests)", source=str(p), field="benchmarks")
        return [_from_guidellm(b, f"{p}#benchmarks[{i}]") for i, b in
                enumerate(data["benchmarks"])]
    if isinstance(data, dict) and "input_lens" in data:
        return [_from_vllm(data, str(p))]
    raise BenchResultError("neither a vllm bench serve result (input_lens, ttfts, itls ...) nor "
                           "a guidellm report (benchmarks: [...])", source=str(p))


def vllm_result_json(prompt: np.ndarray, output: np.ndarray, ttft_s: np.ndarray,
                     itls_s: list[list[float]], request_rate: float, duration_s: float
                     ) -> dict[str, Any]:
    """A result object in ``vllm bench serve``'s saved format (the fields batchsim reads), for
    writing sample files and round-trip tests."""
    return {"backend": "vllm", "request_rate": "inf" if math.isinf(request_rate)
            else request_rate, "burstiness": 1.0, "max_concurrency": None,
            "duration": duration_s, "completed": len(prompt),
            "input_lens": [int(x) for x in prompt], "output_lens": [int(x) for x in output],
            "ttfts": [float(x) for x in ttft_s], "itls": itls_s,
            "errors": [""] * len(prompt)}
