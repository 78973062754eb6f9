"""Whether numba's on-disk cache already holds the compiled interpreter on this machine, and
how a driver calls a compiled function without numba's type dispatch.

The first run that takes the compiled interpreter compiles it (about 15 s here); every later
process loads it from numba's cache in about a second. ``simulate`` asks ``loop_is_cached``
before it takes the interpreter for a mid-sized run: with a cold cache the compile costs more
than the general engine spends on such a run, so the first impression (the quickstart on a
fresh machine) stays fast. Results are bit-identical on either engine, so this decides speed
only.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any


def _cached(dispatcher: object) -> bool:
    """True when ``dispatcher`` is compiled in this process already, or numba's cache index
    of it is there and matches its source's stamp (numba's own test before it loads a cached
    overload)."""
    if getattr(dispatcher, "overloads", None):
        return True
    try:
        index = dispatcher._cache._cache_file._load_index()  # type: ignore[attr-defined]
    except (AttributeError, OSError, EOFError, ValueError):  # numba's cache layout moved
        return True  # decide on size alone, as without this check
    return bool(index)


def loop_is_cached(routed: bool = False, planned: bool = False, series: bool = False,
                   batches: bool = False) -> bool:
    """True when numba's cache holds the compiled loop (``compiled_batch.run_batches`` for
    run-to-completion ``batches``; and, for a routed run, the routing loop,
    ``compiled_route``; for a Python policy's plans, ``compiled_loop.apply_plan``; for the
    general engine's skipped stretches and steps, ``compiled_skip.decode_series`` and
    ``shape_step``) for the current sources; False when the next run would compile. Reading
    the index takes about a millisecond (asked only of runs of 1,000 requests or more).
    """
    if series:
        from sim.engine import compiled_skip  # imports numba

        return _cached(compiled_skip.decode_series) and _cached(compiled_skip.shape_step)
    if batches:
        from sim.engine import compiled_batch  # imports numba

        return _cached(compiled_batch.run_batches)
    from sim.engine import compiled_loop  # imports numba

    if not _cached(compiled_loop.apply_plan if planned else compiled_loop.run):
        return False
    if routed:
        from sim.engine import compiled_route

        return _cached(compiled_route.route_span)
    return True


def direct(dispatcher: Any, args: tuple[Any, ...]) -> Callable[..., Any]:
    """``dispatcher``'s compiled form for arguments of ``args``' types, to be called without
    numba's type dispatch (a few microseconds a call: what a driver that calls it at every
    step, with arguments of the same types each time, need not pay); ``dispatcher`` itself
    when it is not compiled for them or numba's layout moved. Ask after a call with ``args``.
    The caller keeps the types: the compiled form converts what it is given without asking."""
    try:
        compiled = dispatcher.overloads.get(tuple(map(dispatcher.typeof_pyval, args)))
    except AttributeError:
        return dispatcher
    return dispatcher if compiled is None else compiled.entry_point
