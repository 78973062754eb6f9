"""Writing and reading a run's files safely: atomic writes; tables in Parquet.

Layout of an experiment output folder::

    OUT/experiment.yaml          the experiment as loaded (sweep included)
    OUT/summary.csv              one row per finished run: run_id, label, swept keys, metrics
    OUT/runs/<run_id>/config.yaml    the resolved config of that run (run_id = its hash)
    OUT/runs/<run_id>/requests.parquet, steps.parquet, itl_irregular.npy (older folders:
                                 requests.csv, steps.csv, which are still read)
    OUT/runs/<run_id>/summary.json   written last: its presence marks the run finished
    OUT/runs/<run_id>/error.txt      a failed run's error (the sweep goes on)
    OUT/plots/*.png, OUT/report.md

Every file is written to a temporary name in the same folder and renamed into place, so a
crash or Ctrl-C never leaves a half-written file under its final name. Temporary names carry
``TEMP_MARK`` (``.NAME.batchsim-XXXX.tmp``), so the debris of a killed run can be told apart from a
user's own ``.*.tmp`` files and only batchsim's are cleaned.
"""
from __future__ import annotations

import errno
import json
import os
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from sim.core.errors import InputError

#: What marks a temporary file as batchsim's own: ``.NAME.batchsim-XXXX.tmp``.
TEMP_MARK = ".batchsim-"
#: The glob pattern of batchsim's temporary files (see ``is_temp_file``).
TEMP_GLOB = f".*{TEMP_MARK}*.tmp"
#: The forms a result table takes (``write_table``), in the order they are looked for.
TABLE_SUFFIXES = (".parquet", ".csv")


class ResultFileError(InputError):
    """A result file that cannot be read (truncated, corrupt): one line naming it."""


def is_temp_file(path: Path) -> bool:
    """True when ``path`` is named like a temporary file of ``atomic_write``."""
    name = path.name
    return name.startswith(".") and name.endswith(".tmp") and TEMP_MARK in name[1:]


def atomic_write(path: Path, write: Callable[[Path], object]) -> None:
    """Call ``write(tmp)`` on a temporary file beside ``path``, flush it to disk, then rename it
    to ``path``. The temporary file is named ``.NAME.batchsim-XXXX.tmp`` (``TEMP_MARK``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}{TEMP_MARK}", suffix=".tmp",
                               dir=path.parent)
    os.close(fd)
    try:
        write(Path(tmp))
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; results are meant to be shared
        _fsync(tmp)  # the data reaches the disk before the name does
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync(str(path.parent))  # and the new name itself survives a power loss


def _fsync(path: str) -> None:
    """Flush ``path``'s contents (a file, or a folder's entries) to disk (``write`` may have
    closed its own handle). A file system that cannot sync a folder is left as it is."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as e:
        if not os.path.isdir(path) or e.errno not in (errno.EINVAL, errno.ENOTSUP):
            raise
    finally:
        os.close(fd)


def write_text(path: Path, text: str) -> None:
    """Atomically write ``text`` to ``path``."""
    atomic_write(path, lambda p: p.write_text(text, encoding="utf-8"))


def write_json(path: Path, data: Any) -> None:
    """Atomically write ``data`` as indented JSON (NaN kept as JSON's NaN extension)."""
    write_text(path, json.dumps(data, indent=1, sort_keys=True, default=_plain) + "\n")


def plain_data(value: Any) -> Any:
    """``value`` with every numpy scalar (``np.int64(8)``, ``np.float64``) made the Python
    number it holds, through dicts, lists and tuples: an override or sweep given from Python
    as a numpy value is valid config, and YAML's safe dumper (``experiment.yaml``,
    ``capacity.yaml``) cannot write it."""
    if isinstance(value, Mapping):
        return {k: plain_data(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain_data(v) for v in value]
    if hasattr(value, "item") and hasattr(value, "dtype"):  # a numpy scalar or 0-d array
        return value.item()
    return value


def _plain(value: Any) -> Any:
    """JSON fallback for numpy scalars."""
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


def write_table(stem: Path, df: pd.DataFrame, metadata: dict[str, str]) -> Path:
    """Write ``df`` as ``stem.parquet``, ``metadata`` in the file's schema metadata under
    ``batchsim.<key>``; return the path written.

    Always Parquet (pyarrow is a dependency): the same command writes the same files whatever
    else is installed, and a million-row table stays small and exact (float64 round trips).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pandas(df, preserve_index=False)
    meta = {**(table.schema.metadata or {}),
            **{f"batchsim.{k}".encode(): str(v).encode() for k, v in metadata.items()}}
    table = table.replace_schema_metadata(meta)
    path = stem.with_suffix(".parquet")
    atomic_write(path, lambda p: pq.write_table(table, p))
    return path


def read_table(stem: Path) -> pd.DataFrame:
    """Read ``stem.parquet`` or ``stem.csv`` written by ``write_table``; a missing, truncated
    or corrupt file is a ``ResultFileError`` naming it."""
    path = stem.with_suffix(".parquet")
    if not path.exists():
        path = stem.with_suffix(".csv")
    if not path.exists():
        raise ResultFileError(f"{stem}.parquet (or .csv): no such result file")
    try:
        if path.suffix == ".parquet":
            return pd.read_parquet(path)
        return pd.read_csv(path, comment="#")
    except (OSError, ValueError, pd.errors.ParserError) as e:
        # pyarrow's ArrowInvalid is a ValueError; a truncated file is one of these
        first = (str(e).splitlines() or [type(e).__name__])[0]
        raise ResultFileError(f"{path}: cannot read this result file (truncated or corrupt: "
                              f"{first}); re-run the experiment to redo the run") from None


def read_json(path: Path) -> Any:
    """Read a JSON file."""
    return json.loads(path.read_text(encoding="utf-8"))
