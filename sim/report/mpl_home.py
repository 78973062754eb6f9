"""Where matplotlib keeps its files when batchsim draws: batchsim's own folder, not the home.

The first import of matplotlib creates its configuration folder and writes a font list under
the user's home (``~/.config/matplotlib``, ``~/.cache/matplotlib``). batchsim writes nothing
outside its own files, so before matplotlib is imported it is pointed at a folder inside the
installed package (``sim/.matplotlib``; numba keeps its cache of batchsim's compiled code in
the package too), or, when the package cannot be written to, at a temporary folder removed
when the process ends. A folder the user chose (``MPLCONFIGDIR`` set) is left as it is. One
effect: a ``matplotlibrc`` in the home folder does not restyle batchsim's plots (they look
the same on every machine); ``MATPLOTLIBRC`` or ``MPLCONFIGDIR`` still select one.
"""
from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

#: The folder inside the package that holds matplotlib's configuration and font cache.
PACKAGE_FOLDER = Path(__file__).resolve().parent.parent / ".matplotlib"


def use_own_folder() -> str | None:
    """Set ``MPLCONFIGDIR`` to batchsim's folder unless it is set or matplotlib is already
    imported (its folders then were chosen by whoever imported it); return the folder set."""
    if os.environ.get("MPLCONFIGDIR") or "matplotlib" in sys.modules:
        return None
    folder = _writable(PACKAGE_FOLDER)
    if folder is None:
        folder = tempfile.mkdtemp(prefix="batchsim-matplotlib-")
        atexit.register(shutil.rmtree, folder, True)
    os.environ["MPLCONFIGDIR"] = folder
    return folder


def _writable(folder: Path) -> str | None:
    """``folder`` as a string once it exists and can be written to, else ``None``."""
    try:
        folder.mkdir(exist_ok=True)
    except OSError:
        return None
    return str(folder) if os.access(folder, os.W_OK | os.X_OK) else None
