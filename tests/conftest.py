"""Shared test setup: a reproducible hypothesis profile and a compact way to write traces.

Property tests draw the same examples on every run (``derandomize``), so CI is deterministic
and a failure seen once is seen again; set ``BATCHSIM_HYPOTHESIS=explore`` to search with
fresh random examples instead.
"""
from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

import sim
import sim.report  # noqa: F401 - matplotlib's files in batchsim's folder, not the home

settings.register_profile("ci", derandomize=True, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("explore", deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("explore" if os.environ.get("BATCHSIM_HYPOTHESIS") == "explore" else "ci")


@pytest.fixture
def trace():
    """Build requests from ``(arrival_s, num_prompt_tokens, num_output_tokens)`` rows; ids 0.."""

    def make(*rows: tuple[float, int, int]) -> list[sim.Request]:
        return [sim.Request(i, a, p, o) for i, (a, p, o) in enumerate(rows)]

    return make
