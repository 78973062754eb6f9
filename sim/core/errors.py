"""The one class of user-input errors.

Every problem a user can fix (a config key, a trace row, a profile field, a policy parameter, an
API argument) raises a subclass of ``InputError``. It carries where the problem is (``source``:
a file or argument name; ``field``: a dotted path or a row) and what is wrong (``problem``), and
its ``str()`` is the one line the CLI prints before exiting with code 2. Code that catches user
errors catches this class alone, so a module can move or a new error kind can appear without
a clean message turning into a traceback. It subclasses ``ValueError`` so callers of the
Python API can keep catching what they always caught.
"""
from __future__ import annotations


class InputError(ValueError):
    """Bad user input: ``source: field: problem``, any part of which may be absent.

    ``InputError("kv.block_size: must be >= 1")`` (one preformatted message) and
    ``InputError("must be >= 1", source="exp.yaml", field="kv.block_size")`` both work;
    ``within(source)`` returns the same error located in a file.
    """

    def __init__(self, problem: str, *, source: str | None = None,
                 field: str | None = None) -> None:
        self.problem = problem
        self.source = source
        self.field = field
        super().__init__(str(self))

    def __str__(self) -> str:
        parts = [p for p in (self.source, self.field) if p]
        return ": ".join([*parts, self.problem])

    def within(self, source: str) -> InputError:
        """This error, attributed to ``source`` (a file name) unless it already names one."""
        if self.source is not None:
            return self
        located = type(self).__new__(type(self))
        InputError.__init__(located, self.problem, source=source, field=self.field)
        return located



class EnvironmentFailure(Exception):
    """The machine stopped the work, not the input or the code: a full disk, no memory, a file
    or process limit, an unreachable cluster, results a worker could not deliver.

    ``str()`` is one line saying what happened; the CLI prints it and exits with code 1, never
    calling it a bug. Finished runs are kept, so re-running after fixing the cause resumes.
    """


#: What an ``OSError`` errno means for the user (anything else shows the system's own words).
_ERRNO_MEANING = {
    "ENOSPC": "no space left on device",
    "EDQUOT": "disk quota exceeded",
    "EFBIG": "file too large (the file-size limit, ulimit -f)",
    "EMFILE": "too many open files (the per-process limit, ulimit -n)",
    "ENFILE": "too many open files on this system",
    "ENOMEM": "out of memory",
    "EROFS": "read-only file system",
    "EIO": "input/output error (a failing disk or network filesystem)",
    "EAGAIN": "resource temporarily unavailable (a process or thread limit, ulimit -u)",
}


def environment_failure(exc: BaseException) -> EnvironmentFailure | None:
    """``exc`` as an ``EnvironmentFailure`` when it is one (out of memory, an ``OSError`` from
    the system: disk, limits, network), else ``None`` (a bug or a user error)."""
    import errno

    if isinstance(exc, EnvironmentFailure):
        return exc
    if isinstance(exc, MemoryError):
        return EnvironmentFailure("out of memory (the machine's memory or the address-space "
                                  "limit, ulimit -v); finished runs are kept")
    if not isinstance(exc, OSError) or isinstance(exc, InputError):
        return None
    code = errno.errorcode.get(exc.errno or -1, "")
    what = _ERRNO_MEANING.get(code) or exc.strerror or str(exc) or type(exc).__name__
    where = f" ({exc.filename})" if getattr(exc, "filename", None) else ""
    return EnvironmentFailure(f"{what}{where}; finished runs are kept, re-run to resume")
