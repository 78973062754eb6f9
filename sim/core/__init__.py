"""Core values every layer shares: requests, views, plans, step shapes and costs, the engine's
mutable request state, columnar request arrays and the one input-error class.
"""
