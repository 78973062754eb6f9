"""The `batchsim` command line."""
from __future__ import annotations

from sim.cli.main import main

__all__ = ["main"]
