"""Where the data folders of a source checkout are (``hardware_profiles/``, ``traces/``, ...).

Built-in profiles, traces and measurements are looked up in the checkout first and then in the
installed package data; every module that needs the checkout asks here, so moving a module
never breaks a data path. ``is_gzip`` is the one test of whether a data file is compressed: by
its bytes, never its name (pandas would decompress a plain ``t.zip`` by its suffix and fail).
"""
from __future__ import annotations

from pathlib import Path


def checkout_root() -> Path:
    """The folder that holds ``sim/`` (the repository root in a source checkout)."""
    return Path(__file__).resolve().parents[2]


#: The first two bytes of every gzip file (RFC 1952).
GZIP_MAGIC = b"\x1f\x8b"


def is_gzip(path: Path) -> bool:
    """True when ``path`` starts with the gzip magic bytes (its name does not matter)."""
    try:
        with open(path, "rb") as fh:
            return fh.read(2) == GZIP_MAGIC
    except OSError:
        return False
