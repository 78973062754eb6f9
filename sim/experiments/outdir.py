"""The output-folder guard: one place that decides where an experiment writes and keeps it safe.

- ``output_folder`` turns ``--out`` (or ``runs/<name>``) into an absolute path before anything
  is shipped to a worker, refuses names that could escape ``runs/`` and folders that cannot be
  used (an existing file, a read-only folder, a name too long, a symlink loop) with one
  ``InputError`` line.
- ``OutputLock`` holds an advisory lock on ``OUT/.batchsim.lock`` while a command writes there;
  a second command on the same folder is refused with a clear message instead of racing.
- ``clean_temp_files`` deletes only batchsim's own temporaries (``results.TEMP_MARK``).
- ``keep_previous_outputs`` moves another experiment's summary, report and plots (or another
  capacity search's answer) aside to ``OUT/previous/<n>/`` before a different one writes its
  own there.
- ``finished_summary`` says whether a run folder holds a complete, readable run: a 0-byte or
  truncated file (a power loss, a full disk) makes the run unfinished, so it is redone.
"""
from __future__ import annotations

import errno
import itertools
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from sim.core.errors import InputError
from sim.experiments.results import TABLE_SUFFIXES, TEMP_GLOB, is_temp_file

#: The lock file of an output folder (kept between commands: removing it would race).
LOCK_NAME = ".batchsim.lock"
#: Longest experiment name used as a folder name (file systems allow 255 bytes per name).
MAX_NAME_BYTES = 200
#: errno values that mean "this folder cannot be used" (the user's to fix: exit 2); any other
#: OSError (a full disk, too many open files) is an environment failure.
_UNUSABLE = {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENAMETOOLONG, errno.ELOOP,
             errno.ENOTDIR, errno.EEXIST, errno.EISDIR, errno.ENXIO, errno.ENODEV}


class OutputFolderError(InputError):
    """An output folder that cannot be used, or one another command is writing into."""


def check_name(name: Any, source: str) -> str:
    """``name`` if it can be a folder under ``runs/``: one non-empty path component, no
    ``..``, no separator, no NUL, at most ``MAX_NAME_BYTES`` bytes."""
    text = name if isinstance(name, str) else ""
    problem = None
    if not text.strip():
        problem = "must not be empty"
    elif text in (".", "..") or "/" in text or "\\" in text or "\0" in text:
        problem = "must be a plain folder name (no '/', '\\', '..' or NUL)"
    elif len(text.encode("utf-8", "surrogateescape")) > MAX_NAME_BYTES:
        problem = f"longer than {MAX_NAME_BYTES} bytes"
    if problem:
        raise OutputFolderError(f"{problem}, got {name!r}; it names the output folder runs/<name>"
                                " (or pass --out)", source=source, field="name")
    return text


def output_folder(out: str | Path | None, name: Any, source: str, suffix: str = "",
                  subfolder: str = "runs") -> Path:
    """The absolute output folder (``out``, else ``runs/<name><suffix>``), created with its
    ``subfolder`` and checked to be writable; every problem is one ``OutputFolderError``
    line."""
    if out is None:
        path = Path("runs") / (check_name(name, source) + suffix)
    elif not isinstance(out, str | os.PathLike):
        raise OutputFolderError(f"--out: expected a folder path, got {type(out).__name__}")
    elif not str(out).strip() or "\0" in str(out):
        raise OutputFolderError(f"--out: not a usable folder name: {str(out)!r}")
    else:
        path = Path(out).expanduser()
    path = Path(os.path.abspath(path))  # workers may run elsewhere: never ship a relative path
    try:
        if path.exists() and not path.is_dir():
            raise OutputFolderError(f"--out {path}: exists and is not a folder")
        check_own_folder(path)
        (path / subfolder).mkdir(parents=True, exist_ok=True)
        if not os.access(path, os.W_OK | os.X_OK):
            raise OSError(errno.EACCES, "permission denied", str(path))
    except OSError as e:
        if e.errno not in _UNUSABLE:
            raise
        raise OutputFolderError(f"--out {path}: cannot use it as the output folder: "
                                f"{e.strerror or e}") from None
    return path


def check_own_folder(path: Path, flag: str = "--out",
                     writes: str = "summary.csv, report.md, plots/...") -> None:
    """Refuse an existing, non-empty folder that batchsim did not write: it would replace the
    user's files of its names there (``writes``; ``flag`` is the option that named it).
    batchsim's own folders hold the lock file every writing command creates, or (folders
    older than the lock) a ``runs/`` or ``probes/`` folder; one of hidden files only counts as
    empty."""
    if not path.is_dir() or (path / LOCK_NAME).exists() or any(
            (path / sub).is_dir() for sub in ("runs", "probes")):
        return
    with os.scandir(path) as entries:  # hidden files (.DS_Store, .gitkeep) leave it empty
        names = sorted(itertools.islice((e.name for e in entries if not e.name.startswith(".")),
                                        4))
    if names:
        shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
        raise OutputFolderError(f"{flag} {path}: a folder of other files ({shown}), not a "
                                "batchsim output folder; batchsim would replace files there "
                                f"({writes}): give a new or empty folder")


class OutputLock:
    """An exclusive advisory lock (``fcntl.flock``) on ``folder/.batchsim.lock``, held by the
    command writing into ``folder`` (a context manager). The lock dies with its process, so a
    killed command never leaves a stale lock; the file records the holder's pid for the
    message."""

    def __init__(self, folder: Path, flag: str = "--out") -> None:
        self.path = folder / LOCK_NAME
        self.flag = flag
        self.fd: int | None = None

    def __enter__(self) -> OutputLock:
        try:
            import fcntl
        except ImportError:  # not POSIX (Windows): no lock, as the docs say
            return self
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            if e.errno not in _UNUSABLE:
                raise
            raise OutputFolderError(f"{self.flag} {self.path.parent}: cannot create its lock file: "
                                    f"{e.strerror or e}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno not in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES):
                # a file system without locks (some network mounts): go on unlocked
                os.close(fd)
                return self
            holder = os.read(fd, 32).decode("ascii", "replace").strip() or "?"
            os.close(fd)
            # ``flag`` is an option (--out) or, for ``batchsim plot DIR``, the command's name
            other = f" or choose another {self.flag}" if self.flag.startswith("-") else ""
            raise OutputFolderError(
                f"{self.flag} {self.path.parent}: another batchsim command (pid {holder}) is "
                f"writing into this folder; wait for it to finish{other}") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self.fd = fd
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing releases the flock
            self.fd = None


#: The top-level outputs of an experiment: what a different experiment run into the same
#: folder would replace (its runs, named by their configs, are shared and stay).
EXPERIMENT_OUTPUTS = ("experiment.yaml", "summary.csv", "summary_by_seed.csv", "report.md",
                      "report.html", "plots")
#: The keys of ``experiment.yaml`` that decide what the outputs hold (not where the file was).
_DEFINING = ("experiment", "overrides", "sweeps")
#: The outputs of a capacity search (``batchsim capacity``, ``--split-gpus``), its record
#: ``capacity.yaml`` first; its probes, named by their configs, are shared and stay.
CAPACITY_OUTPUTS = ("capacity.yaml", "capacity.csv", "search.csv", "split.csv")
#: The keys of ``capacity.yaml`` that decide what a search's answer is.
CAPACITY_DEFINING = ("experiment", "overrides", "sweeps", "slos", "tolerance")


def outputs_record(source: Path, base_dir: Path | str,
                   overrides: Iterable[str] | Mapping[str, Any] | None,
                   sweeps: Mapping[str, Any] | None, experiment: Any,
                   **deciding: Any) -> dict[str, Any]:
    """What a command records of the outputs it writes (``experiment.yaml``, a capacity
    search's ``capacity.yaml``): the file and folder it read, its overrides (a list of
    strings or a mapping) and sweeps, what else decides them (``deciding``: a search's SLOs
    and tolerance) and the experiment as loaded; as YAML reads it back, so a re-run of the
    same command compares equal to the file (``keep_previous_outputs``: a resume)."""
    import yaml

    record = {"source": str(source), "base_dir": str(base_dir),
              "overrides": dict(overrides) if isinstance(overrides, Mapping)
              else list(overrides or []),
              **({"sweeps": dict(sweeps)} if sweeps else {}), **deciding,
              "experiment": experiment}
    loaded: dict[str, Any] = yaml.safe_load(yaml.safe_dump(record, sort_keys=False))
    return loaded


def keep_previous_outputs(out: Path, record: dict[str, Any],
                          outputs: tuple[str, ...] = EXPERIMENT_OUTPUTS,
                          defining: tuple[str, ...] = _DEFINING) -> Path | None:
    """When ``out`` holds the outputs of another experiment than ``record`` (what the new
    ``experiment.yaml`` will say), move them to ``out/previous/<n>/`` (the first free ``n``)
    and return that folder; ``None`` when there is nothing to keep (no experiment there yet,
    or the same experiment again: a resume). ``outputs`` (the record file first) and
    ``defining`` name another kind of outputs: those of a capacity search
    (``CAPACITY_OUTPUTS``, ``CAPACITY_DEFINING``). Outputs without their record (it was
    deleted, or a folder older than the record) are of an unknown experiment: kept too."""
    import yaml

    exp = out / outputs[0]
    if not exp.is_file():
        if not any((out / name).exists() for name in outputs):
            return None
        old = None
    else:
        try:
            old = yaml.safe_load(exp.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            old = None
    if isinstance(old, dict) and all(old.get(k) == record.get(k) for k in defining):
        return None
    for n in itertools.count(1):
        dest = out / "previous" / str(n)
        if not dest.exists():
            break
    dest.mkdir(parents=True)
    for name in outputs:
        if (out / name).exists():
            os.replace(out / name, dest / name)
    return dest


def clean_temp_files(out: Path) -> int:
    """Delete batchsim's temporary files (``.NAME.batchsim-XXXX.tmp``) left by a killed run.

    Only the folders batchsim writes into are looked at (``out``, ``out/runs/*``,
    ``out/plots``, ``out/probes``) and only files ``atomic_write`` names are deleted: a user's
    own ``.*.tmp`` files stay. Final names are only ever created by an atomic rename and the
    folder is locked (``OutputLock``), so such a temporary file is never anything but debris.
    Returns how many files were deleted.
    """
    if not out.is_dir():
        return 0
    runs = out / "runs"
    folders = [out, out / "plots", out / "probes",
               *sorted(p for p in runs.glob("*") if p.is_dir())]
    count = 0
    for folder in folders:
        for tmp in folder.glob(TEMP_GLOB):
            if is_temp_file(tmp) and tmp.is_file() and not tmp.is_symlink():
                tmp.unlink(missing_ok=True)
                count += 1
    return count


def _intact_table(folder: Path, stem: str) -> bool:
    """``stem`` exists as a non-truncated Parquet file (magic bytes at both ends) or a
    non-empty CSV; cheap: no table is parsed."""
    for suffix in TABLE_SUFFIXES:
        path = folder / f"{stem}{suffix}"
        try:
            size = path.stat().st_size
        except OSError:
            continue
        if suffix == ".csv":
            return size > 0
        if size < 12:
            return False
        with path.open("rb") as fh:
            head = fh.read(4)
            fh.seek(-4, os.SEEK_END)
            return head == b"PAR1" and fh.read(4) == b"PAR1"
    return False


def finished_summary(folder: Path, rid: str | None = None) -> dict[str, Any] | None:
    """The summary of the finished run in ``folder``, or ``None`` when the run is unfinished,
    failed, or damaged (``summary.json`` unreadable or of another run, a result table or
    ``itl_irregular.npy`` missing or truncated): such a run is redone."""
    try:
        summary = json.loads((folder / "summary.json").read_text(encoding="utf-8"))
        npy = (folder / "itl_irregular.npy").stat().st_size
    except (OSError, ValueError):
        return None
    if not isinstance(summary, dict) or summary.get("run_id") != (rid or folder.name):
        return None
    if npy < 10 or not all(_intact_table(folder, s) for s in ("requests", "steps")):
        return None
    return summary
