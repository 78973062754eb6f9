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

