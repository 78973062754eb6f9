"""The deployment a run simulates when it names none, from Python, YAML and the command line
alike (a module of constants only, so the command line can read them without loading a model).
"""
from __future__ import annotations

#: The engine profile of a run that names none. ``vllm-v0`` is the only engine generation whose
#: overheads (TP terms included) are fitted to measurements; the newer profiles are derived from
#: it. At TP 1 it has the numbers the old ``vllm`` profile had (``vllm`` is now its alias), so
#: TP 1 results did not change when the generations came.
DEFAULT_ENGINE = "vllm-v0"
#: The model and GPU of a run that names none (a YAML without ``model:`` / ``hardware:``,
#: ``sim.simulate`` without ``cost``, ``batchsim validate`` without ``--model`` /
#: ``--hardware``): Llama-3-8B on one H100 SXM.
DEFAULT_MODEL = "llama-3-8b"
DEFAULT_HARDWARE = "h100-sxm"
