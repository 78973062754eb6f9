"""Batching policies: one small module each, registered by name (see ``policies.registry``)."""
from __future__ import annotations

# The registry's names are bound before the policy modules load: those import ``sim``, whose
# ``simulate`` imports ``make_policy`` back from this package while it is still initializing.
from policies.registry import (
    DEFAULT_POLICY,
    Policy,
    PolicyError,
    make_policy,
    register,
    registered,
)

# isort: split
# Importing each policy module registers it.
from policies import chunked_prefill, continuous, dynamic, scheduler, static  # noqa: F401

__all__ = ["DEFAULT_POLICY", "Policy", "PolicyError", "make_policy", "register", "registered"]
