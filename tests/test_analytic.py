"""Queueing-theory validation of the engine (the Ciw way: seeds, warm-up, stated tolerances).

With ``ConstantCost(step_s=D)`` and ``max_num_seqs=1`` the engine is a single FCFS server whose
service time is ``N * D`` for a request of ``N`` output tokens (one prefill step yields the
first token, each decode step one more), so classic results apply:

- M/D/1 and M/G/1: the engine's waiting times equal the Lindley recursion on the same arrivals
  request by request (exact), and their mean matches Pollaczek–Khinchine,
  ``W = lambda E[S^2] / (2 (1 - rho))``; the M/D/1 p99 matches the exact (Erlang/Crommelin)
  waiting-time distribution ``P(W <= t) = (1 - rho) sum_{k=0}^{floor(t/D)} (lambda (kD - t))^k
  / k! e^{-lambda (kD - t)}``.
- Static batching at low load: the mean batch-formation wait is ``(b - 1) / (2 lambda)``.
- Little's law ``L = lambda W`` on every registered policy.
- Saturation throughput of continuous batching against its closed form.

Tolerances. The sample mean of a queue's waiting times is strongly autocorrelated; its relative
standard error over ``n`` customers is ``c / sqrt(n)`` with ``c`` measured once from 300
independent runs of the Lindley recursion (n = 100 000 each): for the M/D/1 mean c = 3.6, 5.3,
7.5 at rho = 0.5, 0.7, 0.8 and for its p99 c = 5.5, 9.2, 14.4 (the ``C_MEAN``/``C_P99`` tables
round them up). The samples are sized so that the issue's targets — 3 % for the mean, 5 % for
the p99 — are at least three standard errors (``assert_supported``), and the checks assert the
targets themselves: about 1.6 M simulated requests in all, some 30 seconds on two cores now that
``max_num_seqs=1`` continuous batching runs on the compiled interpreter (``sim.engine.compiled``).
"""
from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
from helpers import check_invariants, lindley_waits, poisson_arrivals, requests
from scipy.optimize import brentq

import policies
import sim
from sim.core.arrays import TraceArrays

SEEDS = (11, 12, 13, 14)
WARMUP = 1000  # requests dropped at the start of every seed's run (the queue starts empty)
D = 0.01

# Relative standard error x sqrt(n) of the mean and p99 waiting time (see module docstring).
C_MEAN = {0.5: 3.7, 0.7: 5.5, 0.8: 7.8}
C_P99 = {0.5: 5.7, 0.7: 9.5, 0.8: 15.0}
# Requests per seed: enough for every target to be three standard errors (pooled, warm-up off).
MD1_N = {0.5: 36_000, 0.7: 83_000, 0.8: 205_000}
MG1_N = 86_000


def assert_supported(target: float, c: float, n: int) -> float:
    """``target``, after checking that a sample of ``n`` resolves it: 3 SE <= target."""
    assert 3 * c / math.sqrt(n) <= target, f"{n} samples cannot resolve {target:.0%}"
    return target


def run_single_server(arrivals, outputs, prompt=16):
    n = len(arrivals)  # columnar requests (ids = rows): hundreds of thousands, no objects
    reqs = TraceArrays(np.asarray(arrivals, dtype=float), np.full(n, prompt, dtype=np.int64),
                       np.broadcast_to(np.asarray(outputs, dtype=np.int64), (n,)).copy())
    return sim.simulate(reqs, policy={"name": "continuous", "max_num_seqs": 1},
                        cost=sim.ConstantCost(step_s=D))


def waits(res) -> np.ndarray:
    df = res.requests
    return (df["first_scheduled_s"] - df["arrival_s"]).to_numpy()


def md1_cdf(t: float, lam: float, d: float) -> float:
    """Exact M/D/1 FCFS waiting-time distribution (Erlang 1909 / Crommelin 1932).

    The alternating sum cancels catastrophically in floating point once ``lam * t`` exceeds
    ~20, so it is evaluated with 60 significant digits.
    """
    with mpmath.workdps(60):
        lam_, d_, t_ = mpmath.mpf(lam), mpmath.mpf(d), mpmath.mpf(t)
        total = mpmath.fsum((lam_ * (k * d_ - t_)) ** k / mpmath.factorial(k)
                            * mpmath.exp(-lam_ * (k * d_ - t_))
                            for k in range(int(t // d) + 1))
        return float((1 - lam_ * d_) * total)


def md1_quantile(q: float, lam: float, d: float) -> float:
    return brentq(lambda t: md1_cdf(t, lam, d) - q, 0.0, 60 * d, xtol=1e-9 * d)


# -- M/D/1 -------------------------------------------------------------------------------------

def test_md1_cdf_formula_is_right():
    # The formula itself, against a large Lindley sample (independent of the engine).
    lam, rho = 0.8 / D, 0.8
    rng = np.random.default_rng(0)
    n = 400_000
    w = lindley_waits(poisson_arrivals(lam, n, rng), np.full(n, D))[WARMUP:]
    assert md1_cdf(0.0, lam, D) == pytest.approx(1 - rho)
    for t in (0.5 * D, D, 3 * D, 10 * D):
        assert md1_cdf(t, lam, D) == pytest.approx(np.mean(w <= t), abs=0.01)
    assert md1_cdf(50 * D, lam, D) == pytest.approx(1.0, abs=1e-6)


@pytest.mark.parametrize("rho", [0.5, 0.7, 0.8])
def test_md1_waiting_time_matches_pollaczek_khinchine_and_the_exact_distribution(rho):
    lam = rho / D
    n = MD1_N[rho]
    pooled = []
    for seed in SEEDS:
        arrivals = poisson_arrivals(lam, n, np.random.default_rng(seed))
        res = run_single_server(arrivals, 1)
        w = waits(res)
        # The engine is the Lindley recursion, request by request ...
        exact = lindley_waits(arrivals, np.full(n, D))
        np.testing.assert_allclose(w, exact, rtol=0, atol=1e-9 * arrivals[-1])
        # ... and an idle server starts a request at its arrival instant, not at a step grid.
        idle = exact == 0
        assert (res.requests["first_scheduled_s"].to_numpy()[idle] == arrivals[idle]).all()
        np.testing.assert_allclose(res.requests["ttft_s"] - w, D, rtol=1e-9)
        pooled.append(w[WARMUP:])
    w = np.concatenate(pooled)
    m = len(w)
    pk = rho * D / (2 * (1 - rho))
    assert w.mean() == pytest.approx(pk, rel=assert_supported(0.03, C_MEAN[rho], m))
    p99 = md1_quantile(0.99, lam, D)
    assert np.percentile(w, 99) == pytest.approx(p99, rel=assert_supported(0.05, C_P99[rho], m))
    # The atom at zero: a share 1 - rho of requests finds the server idle (PASTA); its SE is
    # below 0.9 / sqrt(n) at these loads (same Lindley measurement).
    assert np.mean(w == 0) == pytest.approx(1 - rho, abs=3 * 0.9 / math.sqrt(m))


# -- M/G/1 -------------------------------------------------------------------------------------

def test_mg1_mean_wait_matches_pollaczek_khinchine():
    # N ~ uniform{1, 2, 3} output tokens: S = N D, E[S] = 2 D, E[S^2] = 14/3 D^2, rho = 0.7.
    # c = 5.6 for this queue (300 Lindley runs, as above).
    rho, es, es2 = 0.7, 2 * D, 14 / 3 * D**2
    lam = rho / es
    n = MG1_N
    pooled = []
    for seed in SEEDS:
        rng = np.random.default_rng(100 + seed)
        arrivals = poisson_arrivals(lam, n, rng)
        outputs = rng.integers(1, 4, n)
        w = waits(run_single_server(arrivals, outputs))
        np.testing.assert_allclose(w, lindley_waits(arrivals, outputs * D), rtol=0,
                                   atol=1e-9 * arrivals[-1])
        pooled.append(w[WARMUP:])
    w = np.concatenate(pooled)
    pk = lam * es2 / (2 * (1 - rho))
    assert w.mean() == pytest.approx(pk, rel=assert_supported(0.03, 5.8, len(w)))


# -- static batching: a batch-service queue ----------------------------------------------------

def test_static_batching_formation_wait_is_b_minus_1_over_2_lambda():
    """Batch size b, no timeout, every request N tokens: FCFS groups of b consecutive arrivals
    form the batches. The k-th member (k = 1..b) waits for the b - k later arrivals, a sum of
    b - k exponential gaps, so E[formation wait] = (1/b) sum_k (b - k)/lambda = (b-1)/(2 lambda).
    The server adds a wait only if the previous batch still runs when the batch fills: an
    E_b/D/1 queue with service N D; at lambda N D = 0.25, b = 4 that needs 4 arrivals within
    one service (probability 1.3e-4), so its share of the mean is below 1e-4. The per-batch
    mean has relative SE 0.62 / sqrt(batches): 3 % is over 3 SE with 4 x 1500 batches."""
    if "static" not in policies.registered():
        pytest.skip("no 'static' policy registered")
    b, n_out = 4, 2
    lam = 0.25 / (n_out * D)
    n = 4 * 1500
    pooled = []
    for seed in SEEDS:
        arrivals = poisson_arrivals(lam, n, np.random.default_rng(200 + seed))
        reqs = requests(arrivals, 16, n_out)
        res = sim.simulate(reqs, policy={"name": "static", "batch_size": b, "timeout_s": None},
                           cost=sim.ConstantCost(step_s=D))
        start = res.requests["first_scheduled_s"].to_numpy()
        # Exactly: batch j starts when its last member has arrived and batch j-1 is done.
        last = arrivals[b - 1::b]
        want = np.empty(n // b)
        free = 0.0
        for j, a in enumerate(last):
            want[j] = max(a, free)
            free = want[j] + n_out * D
        np.testing.assert_allclose(start, np.repeat(want, b), rtol=0, atol=1e-9 * arrivals[-1])
        pooled.append(start - arrivals)
    w = np.concatenate(pooled)
    assert w.mean() == pytest.approx((b - 1) / (2 * lam), rel=0.03)


# -- Little's law on every policy --------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(policies.registered()))
def test_littles_law_holds_for_every_policy(name):
    """Time-average number in system (exact integral over a window that drops the first and
    last 10 % of arrivals) equals the window's arrival rate times the mean E2E of the requests
    arriving in it, within 2 % (the only gap is the boundary: requests straddling the window's
    edges, whose contributions cancel in expectation)."""
    rng = np.random.default_rng(5)
    n, lam = 3000, 12.0
    arrivals = poisson_arrivals(lam, n, rng)
    reqs = requests(arrivals, rng.integers(1, 65, n), rng.integers(1, 17, n))
    res = sim.simulate(reqs, policy={"name": name}, cost=sim.ConstantCost(step_s=D))
    check_invariants(res, reqs)
    df = res.requests
    assert (df["status"] == "finished").all()
    a, f = df["arrival_s"].to_numpy(), df["finish_s"].to_numpy()
    t0, t1 = np.quantile(arrivals, [0.1, 0.9])
    area = np.clip(np.minimum(f, t1) - np.maximum(a, t0), 0, None).sum()
    big_l = area / (t1 - t0)
    inside = (a >= t0) & (a < t1)
    lam_hat = inside.sum() / (t1 - t0)
    w = (f - a)[inside].mean()
    assert big_l > 0.5  # a queue worth the name, not an empty system
    assert big_l == pytest.approx(lam_hat * w, rel=0.02)


# -- saturation throughput ---------------------------------------------------------------------

def saturation_throughput(B, N, P, base, per_tok, per_seq):
    """Requests/s of continuous batching with all B slots always busy (derivation below).

    Every request occupies one slot for exactly N steps (its prefill step yields token 1, each
    of N - 1 decode steps one more), so a full batch completes B / N requests per step on
    average. A request computes P + N - 1 tokens over its life, so per completed request the
    steps cost N (base + B per_seq) / B seconds of fixed and row costs plus (P + N - 1)
    per_tok of token cost: X = B / (N (base + B per_seq) + B (P + N - 1) per_tok)."""
    return B / (N * (base + B * per_seq) + B * (P + N - 1) * per_tok)


COST = {"base": 0.004, "per_tok": 2e-5, "per_seq": 3e-4}


@pytest.mark.parametrize("mode", ["vllm", "orca"])
def test_saturation_with_all_requests_at_once_runs_in_lockstep_cohorts(mode):
    # M = 5 B requests at t = 0: cohorts of B are prefilled together and finish together, so
    # both modes run exactly 5 cohorts of N full steps, and the makespan is exact.
    B, N, P = 8, 12, 32
    cost = sim.LinearCost(base_s=COST["base"], per_token_s=COST["per_tok"],
                          per_seq_s=COST["per_seq"])
    reqs = requests(np.zeros(5 * B), P, N)
    res = sim.simulate(reqs, policy={"name": "continuous", "max_num_seqs": B, "mode": mode},
                       cost=cost, checks=True)
    x = saturation_throughput(B, N, P, **COST)
    assert res.requests["finish_s"].max() == pytest.approx(5 * B / x, rel=1e-12)
    assert (res.steps["num_seqs"] == B).all()


def test_saturation_throughput_of_orca_mode_under_poisson_overload():
    # Orca admits new prompts into the very step after a slot frees, so with a backlog every
    # step runs B rows: the closed form holds for staggered finishes too. Arrivals at 3x the
    # capacity; throughput is measured between the 500th and the last-but-500 completion.
    B, N, P = 8, 12, 32
    x = saturation_throughput(B, N, P, **COST)
    rng = np.random.default_rng(9)
    n = 3000
    reqs = requests(poisson_arrivals(3 * x, n, rng), P, N)
    cost = sim.LinearCost(base_s=COST["base"], per_token_s=COST["per_tok"],
                          per_seq_s=COST["per_seq"])
    res = sim.simulate(reqs, policy={"name": "continuous", "max_num_seqs": B, "mode": "orca"},
                       cost=cost)
    f = np.sort(res.requests["finish_s"].to_numpy())
    lo, hi = 500, n - 500
    measured = (hi - lo) / (f[hi] - f[lo])
    assert measured == pytest.approx(x, rel=0.02)
    mid = res.steps[(res.steps["start_s"] >= f[lo]) & (res.steps["start_s"] < f[hi])]
    assert (mid["num_seqs"] == B).all()
