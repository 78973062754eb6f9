"""batchsim's version, recorded in every result file so a result says what produced it."""
from __future__ import annotations

__version__ = "0.1.0"
