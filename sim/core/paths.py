"""Where the data folders of a source checkout are (``hardware_profiles/``, ``traces/``, ...).

Built-in profiles, traces and measurements are looked up in the checkout first and then in the
installed package data; every module that needs the checkout asks here, so moving a module
never breaks a data path.
"""
from __future__ import annotations

from pathlib import Path


def checkout_root() -> Path:
    """The folder that holds ``sim/`` (the repository root in a source checkout)."""
    return Path(__file__).resolve().parents[2]
