"""The engine core's bookkeeping: the scheduler (``sched/``) and the paged KV cache's blocks."""
