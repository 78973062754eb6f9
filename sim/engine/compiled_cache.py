"""Whether numba's on-disk cache already holds the compiled interpreter on this machine.

The first run that takes the compiled interpreter compiles it (about 15 s here); every later
process loads it from numba's cache in about a second. ``simulate`` asks ``loop_is_cached``
before it takes the interpreter for a mid-sized run: with a cold cache the compile costs more
than the general engine spends on such a run, so the first impression (the quickstart on a
fresh machine) stays fast. Results are bit-identical on either engine, so this decides speed
only.
"""
from __future__ import annotations


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


def loop_is_cached(routed: bool = False, planned: bool = False) -> bool:
    """True when numba's cache holds the compiled loop (and, for a routed run, the routing
    loop, ``compiled_route``; for a Python policy's plans, ``compiled_loop.apply_plan``) for
    the current sources; False when the next run would compile. Reading the index takes
    about a millisecond (asked only of runs of 1,000 requests or more).
    """
    from sim.engine import compiled_loop  # imports numba

    if not _cached(compiled_loop.apply_plan if planned else compiled_loop.run):
        return False
    if routed:
        from sim.engine import compiled_route

        return _cached(compiled_route.route_span)
    return True
