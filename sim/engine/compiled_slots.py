"""Named slots of the compiled interpreter's arrays and its codes, shared by its modules.

``sim.engine.compiled`` reads them through ``sim.engine.compiled_loop`` (which imports them),
so the Python driver and the compiled loop agree on every index and code.
"""
from __future__ import annotations

WAITING, RUNNING, FINISHED, REJECTED = 0, 1, 2, 3  # a request's status
# why a request was rejected (its message is built afterwards from its final counters)
NO_REASON, ON_ARRIVAL, OVER_BUDGET, PREEMPTED_TOO_OFTEN, OUTGREW = 0, 1, 2, 3, 4
BY_POLICY = 5  # a Python policy's ``Plan.reject`` (its words kept beside the arrays)
DONE, STALLED, PAUSED, IDLE, LOG_FULL, IRR_FULL = 0, 1, 2, 3, 4, 5  # how ``run`` returned
INVALID = 6  # ``apply_plan``: the plan breaks a rule (the reference names it)
# slots of ``params_i`` / ``params_f``
(P_BS, P_NUM_BLOCKS, P_CAPACITY, P_MAX_SEQS, P_MAX_TOKENS, P_MARK, P_LIMIT, P_COMPOSITION,
 P_WHOLE, P_CHUNK, P_ORDER, P_VICTIM, P_COST, P_LAYERS, P_TP, P_HAS_HORIZON, P_HOLD,
 P_BUCKET_WIDTH, P_NUM_BOUNDS) = range(19)
NUM_PARAMS_I = 19
# A run-to-completion batch's prompt buckets (``BatchSpec.bucket_by_prompt``): a width
# (``P_BUCKET_WIDTH`` > 0) or ``P_NUM_BOUNDS`` increasing bounds, in ``params_i`` after its
# ``NUM_PARAMS_I`` slots; neither: one queue.
# ``PF_WAIT``: how long a partial run-to-completion batch waits (``inf``: only full ones go)
PF_HORIZON, PF_WAIT = 0, 1
NUM_PARAMS_F = 2
# slots of the state ``st_i`` / ``st_f``
(S_NXT, S_KNOWN, S_ACCEPTING, S_N_RUN, S_N_HEAP, S_N_PENDING, S_PRE_SEQ, S_USED, S_N_LOG,
 S_N_IRR, S_STAMP, S_QUEUED, S_LIVE, S_SETTLED_FIRST, S_SETTLED_LAST, S_N_MEMBERS,
 S_N_REJOIN) = range(17)
NUM_STATE_I = 17
# A run-to-completion batch (``sim.engine.compiled_batch``): ``S_N_MEMBERS`` requests in the
# batch in flight, ``S_N_REJOIN`` of them preempted and waiting to rejoin it (outside the heap).
# Rows of the ``batch`` array: the members in the order they joined, then the plan's padding
# rows (tokens, context) beside each other.
B_MEMBERS, B_PAD_N, B_PAD_CTX = 0, 1, 2
NUM_BATCH_ROWS = 3
#: ``P_COMPOSITION`` of a run-to-completion batch (``compiled_plan.RUN_TO_COMPLETION``).
RUN_TO_COMPLETION = 3
# ``P_HOLD`` (the prefill side of a disaggregated cluster, ``sim.engine.compiled_handoff``): a
# finished request keeps its blocks until released, and every request that settles (finishes
# or is rejected) is chained in settling order: ``S_SETTLED_FIRST`` / ``S_SETTLED_LAST`` and
# each row's ``RI_NEXT_SETTLED`` hold a request index + 1 (0: none).
SF_NOW = 0
# columns of the step log (``sim.engine.compiled.INT_COLUMNS`` / ``FLOAT_COLUMNS`` name them)
(L_SEQS, L_PREFILL, L_DECODE, L_RECOMPUTED, L_WAITING, L_USED, L_REGULAR, L_LIVE, L_PAD_TOKENS,
 L_PAD_ROWS) = range(10)
L_START, L_DURATION, L_FLOPS, L_BYTES = range(4)
