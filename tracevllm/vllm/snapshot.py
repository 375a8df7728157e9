"""vLLM's scheduler between two steps, as tracevllm's ``EngineSnapshot``: where a live client starts.

A client of the live page that joins a running vLLM (``live.py``) never heard the events that built
the engine it sees, so its ``Hello`` carries them as state, in the shape tracevllm's own engine sends
(``tracevllm/engine/snapshot.py``), told in the trace's names (``TracingScheduler``'s)::

    vLLM's Scheduler                          EngineSnapshot
    kv_holding_waiting, waiting ──────────▶  requests: the queues in vLLM's admission order ("waiting",
    running ──────────────────────────────▶            "preempted"), then the batch ("running"); each with
                                                       its trace id, tokens, preemptions, the blocks
    kv_cache_manager (req_to_blocks) ─────▶            it holds (vLLM's ``req_to_blocks``), its trace
    TracingScheduler.waiting_reasons ─────▶            context and why it waits, as last recorded
    block_pool.blocks (a hash) ───────────▶  cached_block_ids: what the prefix cache can still find

Taken under the scheduler's ``step_lock`` (``tracing_scheduler.py``), so that the events recorded
after it, applied to it, account for every block: each ``BlocksFreed`` names a block its request
holds here or took since.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vllm.v1.request import RequestStatus

from tracevllm.engine.snapshot import EngineSnapshot, RequestSnapshot

if TYPE_CHECKING:
    from tracevllm.vllm.tracing_scheduler import TracingScheduler

# Any other unfinished status (a grammar, remote KV or a streaming session awaited) waits in a queue.
_STATUS = {RequestStatus.RUNNING: "running", RequestStatus.PREEMPTED: "preempted"}


def take_vllm_snapshot(scheduler: TracingScheduler) -> EngineSnapshot:
    """vLLM's requests and KV blocks now; the caller holds ``scheduler.step_lock``."""
    recorded = scheduler.waiting_reasons.recorded  # by vLLM's ids, naming vLLM's ids
    requests = []
    for r in [*scheduler.kv_holding_waiting, *scheduler.waiting, *scheduler.running]:
        rid = r.request_id
        traced = scheduler._id(rid)
        waiting = recorded.get(rid)
        requests.append(RequestSnapshot(
            traced, _STATUS.get(r.status, "waiting"), r.arrival_time, r.num_prompt_tokens, r.num_computed_tokens,
            scheduler.num_cached_tokens.get(rid, 0), r.num_output_tokens, r.num_preemptions,
            scheduler._held_block_ids(rid), scheduler.trace_headers.get(rid),
            None if waiting is None else scheduler._traced(waiting)))
    cached = [block.block_id for block in scheduler.kv_cache_manager.block_pool.blocks if block.block_hash is not None]
    return EngineSnapshot(requests, cached)
