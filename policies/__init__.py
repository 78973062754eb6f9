"""Batching policies: one small module each, registered by name (see ``policies.registry``)."""
from __future__ import annotations

from policies import continuous  # noqa: F401  (registers the policy)
from policies.registry import Policy, PolicyError, make_policy, register, registered

__all__ = ["Policy", "PolicyError", "make_policy", "register", "registered"]
