"""What if: a recorded run replayed through the engine's own scheduler under another configuration.

``tracevllm traces whatif DIR --set max_num_batched_tokens=256 -o OUT`` answers "what would my traffic
have done under these settings?" without the model. From the trace of one run it takes the workload
(``viz/workload.py``), the configuration (the start-up spans: ``config.py``), a step-cost model and the
time between steps (``pace.py``), and replays the requests, at their recorded arrivals or at another
rate or number (``arrivals.py``), through the real ``Scheduler`` and ``KVCacheManager``, stepped by the
real ``EngineCore.step()`` over an executor that runs no model (``executor/simulated_executor.py``), on
a simulated clock (``engine.py``)::

    DIR ─▶ workload, configuration (+ --set), step-cost model, pace
              │
              ▼
    arrivals ─▶ EngineCore.step(): Scheduler, KVCacheManager ─▶ SimulatedExecutor (the clock moves by
              │                                                   the cost model's prediction)
              ▼
    the real tracers ─▶ OUT: a trace like any other, the same request ids (viz, traces check|explain|jaeger)

``command.py`` is the command, and what it prints: the recorded run beside the predicted one.
Importing this package loads nothing; nothing in it loads torch.
"""

# The EngineArgs options ``--set`` takes: what the scheduler and the KV cache read.
SETTINGS = ("max_num_batched_tokens", "max_num_seqs", "max_model_len", "enable_chunked_prefill",
            "long_prefill_token_threshold", "scheduler_reserve_full_isl", "watermark", "async_scheduling",
            "scheduling_policy", "block_size", "num_gpu_blocks_override", "kv_cache_memory_bytes",
            "enable_prefix_caching")
