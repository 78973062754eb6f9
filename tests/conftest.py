"""Shared test fixtures: a compact way to write small request traces."""
from __future__ import annotations

import pytest

import sim


@pytest.fixture
def trace():
    """Build requests from ``(arrival_s, num_prompt_tokens, num_output_tokens)`` rows; ids 0.."""

    def make(*rows: tuple[float, int, int]) -> list[sim.Request]:
        return [sim.Request(i, a, p, o) for i, (a, p, o) in enumerate(rows)]

    return make
