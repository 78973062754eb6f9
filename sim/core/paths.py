"""Where data files are: the checkout's data folders, and the files an experiment names.

Built-in profiles, traces and measurements are looked up in the checkout first and then in the
installed package data; every module that needs the checkout asks here, so moving a module
never breaks a data path. A relative file path written in an experiment (``model``,
``hardware``, ``engine``, ``workload.trace``) is resolved from the experiment file's folder,
never from the working directory, so an experiment runs the same from anywhere.
never breaks a data path. ``is_gzip`` is the one test of whether a data file is compressed: by
its bytes, never its name (pandas would decompress a plain ``t.zip`` by its suffix and fail).
"""
from __future__ import annotations

from pathlib import Path


def checkout_root() -> Path:
    """The folder that holds ``sim/`` (the repository root in a source checkout)."""
    return Path(__file__).resolve().parents[2]


#: Suffixes of profile files (GPU, model, engine YAML; a Hugging Face ``config.json``).
PROFILE_SUFFIXES = (".yaml", ".yml", ".json")


def names_a_file(text: str) -> bool:
    """True when a profile value is a file path rather than a built-in name: it ends in a
    profile suffix or contains a ``/`` (a model value with a ``/`` may also be a Hugging Face
    id such as ``meta-llama/Meta-Llama-3-70B``)."""
    return text.endswith(PROFILE_SUFFIXES) or "/" in text


def resolve_from(value: str, base_dir: Path | None) -> str:
    """``value`` with a relative file path resolved from ``base_dir`` (an experiment's folder).

    Built-in names, absolute paths and values without ``base_dir`` come back unchanged; so does
    a ``/``-containing value with no profile suffix that is no file there (a Hugging Face id).
    """
    if base_dir is None or not names_a_file(value):
        return value
    path = Path(value).expanduser()
    if path.is_absolute():
        return str(path)
    candidate = Path(base_dir) / path
    if candidate.exists() or path.suffix in PROFILE_SUFFIXES:
        return str(candidate)
    return value
#: The first two bytes of every gzip file (RFC 1952).
GZIP_MAGIC = b"\x1f\x8b"


def is_gzip(path: Path) -> bool:
    """True when ``path`` starts with the gzip magic bytes (its name does not matter)."""
    try:
        with open(path, "rb") as fh:
            return fh.read(2) == GZIP_MAGIC
    except OSError:
        return False
