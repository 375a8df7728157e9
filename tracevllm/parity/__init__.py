"""Parity: tracevllm's scheduler and KV cache held to schedules recorded from vLLM itself.

tracevllm follows vLLM 0.32.0 (``golden.VLLM_VERSION``). ``tests/parity/record_vllm.py`` runs a
workload through vLLM's own engine core and writes what its scheduler decided, step by step, as a
golden schedule; here the same workload is run again through tracevllm and the two compared::

    golden.py        the golden file: options, requests (and the tokens vLLM sampled), steps
    rerun.py         the workload again through EngineCore.step(), Scheduler, KVCacheManager (no model)
    schedule_log.py  tracevllm's steps in the golden's terms, heard from the engine's events
    compare.py       step by step: how many the same, the first divergent one, the rule involved
    command.py       tracevllm parity GOLDEN... [--set KEY=VALUE] [--trace-out DIR]
    golden_trace.py  a golden read as a viz ``Trace``, so that ``tracevllm traces diff DIR GOLDEN``
                     holds a tracevllm run against vLLM's

docs/parity.md says how the goldens are recorded and what was found.
Importing this package loads nothing; ``golden.py`` needs only the standard library.
"""
