"""Routers: which replica an arriving request joins. One small module per family, registered
by name (see ``routers.base``); like ``policies``, this package imports only ``sim.core``."""
from __future__ import annotations

from routers.base import Router, RouterError, make_router, register, registered

# isort: split
# Importing each module registers its routers.
from routers import affinity, balance, weighted  # noqa: F401

__all__ = ["Router", "RouterError", "make_router", "register", "registered"]
