"""The hard bounds of every workload form, checked before anything is drawn or allocated.

Finite-but-huge numbers would otherwise overflow a float (``cv: 1e308`` squares to inf),
an int64 (``priority: 1e308``) or memory (a billion turns); past these bounds a spec is a
mistake, not a workload, and is refused with a message naming the key.
"""
from __future__ import annotations

#: Most requests one workload may hold: bounds memory (a request costs ~0.5 kB in the engine).
MAX_REQUESTS = 20_000_000
#: Largest arrival rate (requests per second): a million times any GPU's throughput.
MAX_RATE = 1e9
#: Range of a gamma process's coefficient of variation (shape ``1/cv**2`` stays a float
#: numpy can draw from: 1e12 .. 1e-4).
MIN_CV, MAX_CV = 1e-6, 100.0
#: Largest lognormal sigma (standard deviation of log tokens; 10 already spans e^±30).
MAX_SIGMA = 10.0
#: Largest magnitude of a request priority (as a trace file's ``priority`` column).
MAX_PRIORITY = 2**31
