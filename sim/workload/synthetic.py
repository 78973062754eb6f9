"""Synthetic workloads: arrival processes and token-length distributions, vectorised in numpy.

Every sampler takes an explicit ``numpy.random.Generator`` (no module-level RNG), so the same
seed gives the same workload. Arrival processes start at t = 0 (the first request arrives at
0; later ones follow the sampled interarrival gaps). Length samplers return int64 arrays
clamped to ``[min_tokens, max_tokens]`` (``min_tokens`` defaults to 1: a request always has a
prompt token and produces an output token).

Parametrisations (the ones the workload YAML exposes):

* ``poisson(rate)``: exponential gaps with mean ``1/rate``.
* ``gamma(rate, cv)``: gamma gaps with mean ``1/rate`` and coefficient of variation ``cv``
  (shape ``1/cv**2``); ``cv=1`` is Poisson, ``cv>1`` is burstier, ``cv<1`` smoother.
* ``constant(rate)``: deterministic gaps of ``1/rate``.
* ``lognormal(mean | median, sigma)``: ``sigma`` is the standard deviation of ``log(tokens)``;
  give either the distribution's ``mean`` (then ``mu = log(mean) - sigma**2/2``) or its
  ``median`` (then ``mu = log(median)``). Rounded to whole tokens before clamping.
* ``exponential(mean)``, ``uniform(lo, hi)`` (integers, both ends inclusive), ``fixed(value)``.
* ``empirical``: resample rows of a trace with replacement; ``empirical_pairs`` draws prompt
  and output from the same row, keeping their correlation.
"""
from __future__ import annotations

import numpy as np

from sim.core.errors import InputError
from sim.workload.limits import MAX_CV, MAX_SIGMA, MIN_CV
from sim.workload.traces import MAX_TOKENS  # the same bound as trace files

ARRIVAL_PROCESSES = ("poisson", "gamma", "constant")


def interarrival_gaps(process: str, rate: float, n: int, rng: np.random.Generator,
                      cv: float = 1.0) -> np.ndarray:
    """``n`` interarrival gaps in seconds for ``process`` with mean ``1/rate``."""
    if rate <= 0 or not np.isfinite(rate):
        raise InputError(f"rate must be a finite number > 0, got {rate}")
    if process == "poisson":
        return rng.exponential(1.0 / rate, n)
    if process == "gamma":
        if not MIN_CV <= cv <= MAX_CV:  # beyond, 1/cv**2 overflows or vanishes
            raise InputError(f"cv must be in [{MIN_CV:g}, {MAX_CV:g}], got {cv}")
        shape = 1.0 / cv**2
        return rng.gamma(shape, 1.0 / (rate * shape), n)
    if process == "constant":
        return np.full(n, 1.0 / rate)
    raise InputError(f"unknown arrival process {process!r}; choose from {ARRIVAL_PROCESSES}")


def arrival_times(process: str, rate: float, rng: np.random.Generator, *,
                  num_requests: int | None = None, duration_s: float | None = None,
                  cv: float = 1.0) -> np.ndarray:
    """Sorted arrival times starting at 0: ``num_requests`` of them, or all in ``[0, duration_s)``.

    With both limits, generation stops at whichever is reached first.
    """
    if num_requests is None and duration_s is None:
        raise InputError("give num_requests or duration_s")
    if num_requests is not None and num_requests < 0:
        raise InputError(f"num_requests must be >= 0, got {num_requests}")
    if num_requests is not None:
        n = num_requests
        t = np.concatenate(([0.0], np.cumsum(interarrival_gaps(process, rate, max(n - 1, 0),
                                                                rng, cv))))[:n]
    else:
        # Draw in blocks sized from the expected count so long horizons stay vectorised.
        assert duration_s is not None
        chunk = max(64, int(rate * duration_s * 1.1) + 64)
        parts, last = [np.zeros(1)], 0.0
        while last < duration_s:
            gaps = np.cumsum(interarrival_gaps(process, rate, chunk, rng, cv)) + last
            parts.append(gaps)
            last = float(gaps[-1])
        t = np.concatenate(parts)
    if duration_s is not None:
        t = t[t < duration_s]
    return t


def clamp_tokens(values: np.ndarray, min_tokens: int = 1, max_tokens: int | None = None
                 ) -> np.ndarray:
    """Round to whole tokens and clip to ``[min_tokens, max_tokens]`` as int64 (``max_tokens``
    defaults to ``MAX_TOKENS``, so a heavy-tailed draw cannot become an absurd request)."""
    v = np.rint(np.nan_to_num(np.asarray(values, dtype=np.float64), nan=1.0, posinf=np.inf))
    hi = MAX_TOKENS if max_tokens is None else max_tokens
    # Clip in float first so huge draws cannot overflow the int64 cast.
    return np.clip(v, max(1, min_tokens), hi).astype(np.int64)


def fixed(value: int, size: int) -> np.ndarray:
    """``size`` copies of ``value``."""
    return np.full(size, value, dtype=np.int64)


def uniform(lo: int, hi: int, size: int, rng: np.random.Generator) -> np.ndarray:
    """Integers uniform on ``[lo, hi]`` inclusive."""
    if hi < lo:
        raise InputError(f"uniform needs lo <= hi, got lo={lo}, hi={hi}")
    return rng.integers(lo, hi, size, endpoint=True, dtype=np.int64)


def lognormal(size: int, rng: np.random.Generator, *, sigma: float,
              mean: float | None = None, median: float | None = None) -> np.ndarray:
    """Lognormal token counts (float): log-std ``sigma`` and the given ``mean`` or ``median``."""
    if (mean is None) == (median is None):
        raise InputError("lognormal needs exactly one of mean or median")
    if not 0 <= sigma <= MAX_SIGMA:  # beyond, sigma**2 overflows
        raise InputError(f"sigma must be in [0, {MAX_SIGMA:g}], got {sigma}")
    if median is not None:
        mu = np.log(median)
    else:
        assert mean is not None  # exactly one of the two, checked above
        mu = np.log(mean) - sigma**2 / 2
    return rng.lognormal(mu, sigma, size)


def exponential(mean: float, size: int, rng: np.random.Generator) -> np.ndarray:
    """Exponential token counts (float) with the given mean."""
    return rng.exponential(mean, size)


def empirical(values: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
    """Resample ``values`` with replacement."""
    values = np.asarray(values)
    if values.size == 0:
        raise InputError("empirical distribution needs at least one value")
    return values[rng.integers(0, values.size, size)]


def empirical_pairs(prompt: np.ndarray, output: np.ndarray, size: int,
                    rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Resample (prompt, output) rows jointly, so their correlation is preserved."""
    if len(prompt) != len(output) or len(prompt) == 0:
        raise InputError("empirical_pairs needs two equal-length, non-empty arrays")
    idx = rng.integers(0, len(prompt), size)
    return np.asarray(prompt)[idx], np.asarray(output)[idx]
