"""The engine: the SimPy replica loop (the reference, with plan validation and exact event
skipping), the fast paths, and `simulate`, which picks between them.
"""
