"""KVCacheManager: which physical blocks each request's tokens live in.

The scheduler asks it two things: how much of a new request's prompt is already cached
(``get_computed_blocks``) and whether there is room for the tokens it wants to compute this step
(``allocate_slots``). Block tables are per request; the blocks themselves live in the BlockPool.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from tracevllm.core.block_pool import BlockPool
from tracevllm.core.event_recorder import EventRecorder
from tracevllm.core.events import BlocksAllocated, BlocksFreed, PrefixCacheHit, PrefixCacheLookup
from tracevllm.core.kv_cache_utils import KVCacheBlock, hash_new_full_blocks
from tracevllm.request import Request, RequestStatus


@dataclass
class KVCacheBlocks:
    blocks: list[KVCacheBlock] = field(default_factory=list)

    def get_block_ids(self) -> list[int]:
        return [b.block_id for b in self.blocks]

    def __add__(self, other: "KVCacheBlocks") -> "KVCacheBlocks":
        return KVCacheBlocks(self.blocks + other.blocks)

    @staticmethod
    def create_empty() -> "KVCacheBlocks":
        return KVCacheBlocks([])


@dataclass(frozen=True, slots=True)
class KVShortage:
    """Why ``allocate_slots`` refused: it needed ``num_blocks_needed`` free blocks (for the request's whole
    sequence when ``full_sequence``, else for the tokens asked) beyond the ``num_watermark_blocks`` it
    must leave free, and ``num_free_blocks`` were free."""

    num_blocks_needed: int
    num_free_blocks: int
    full_sequence: bool = False
    num_watermark_blocks: int = 0


@dataclass
class PrefixCacheStats:
    requests: int = 0  # lookups made
    queries: int = 0  # tokens looked up
    hits: int = 0  # tokens found cached

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0


class KVCacheManager:
    """Records who holds which block (``BlocksAllocated``, ``PrefixCacheHit``, ``BlocksFreed``), so
    that replaying the events gives every block's reference count at any moment."""

    def __init__(self, num_gpu_blocks: int, block_size: int, max_model_len: int, enable_caching: bool = True,
                 recorder: EventRecorder | None = None, watermark: float = 0.0) -> None:
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.enable_caching = enable_caching
        # Blocks an admission leaves free while other requests are scheduled (vLLM's watermark: a share
        # of all the blocks, the null block included).
        self.watermark_blocks = int(watermark * num_gpu_blocks)
        self.recorder = recorder or EventRecorder()
        self.block_pool = BlockPool(num_gpu_blocks, enable_caching, self.recorder)
        self.req_to_blocks: defaultdict[str, list[KVCacheBlock]] = defaultdict(list)
        # How many of a request's leading blocks are registered in the prefix cache.
        self.num_cached_block: dict[str, int] = {}
        self.prefix_cache_stats = PrefixCacheStats()

    def get_computed_blocks(self, request: Request) -> tuple[KVCacheBlocks, int]:
        """The longest cached prefix of the request, in whole blocks, and its length in tokens.

        The last token is never counted, even if the whole sequence is cached: it must be computed
        again to produce the logits that sample the next token. A request that asks for prompt
        logprobs gets no hit (as in vLLM): they need the logits of every prompt position.
        """
        if not self.enable_caching or request.sampling_params.prompt_logprobs is not None:
            return KVCacheBlocks.create_empty(), 0
        max_hit_blocks = (request.num_tokens - 1) // self.block_size
        # A resumed request looks up its generated tokens too: hash every full block it may hit.
        hash_new_full_blocks(self.block_size, request.all_token_ids[: max_hit_blocks * self.block_size],
                             request.block_hashes)
        hits: list[KVCacheBlock] = []
        for block_hash in request.block_hashes[:max_hit_blocks]:
            block = self.block_pool.get_cached_block(block_hash)
            if block is None:
                break
            hits.append(block)
        num_hit_tokens = len(hits) * self.block_size
        self.prefix_cache_stats.requests += 1
        self.prefix_cache_stats.queries += request.num_tokens
        self.prefix_cache_stats.hits += num_hit_tokens
        return KVCacheBlocks(hits), num_hit_tokens

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: KVCacheBlocks | None = None,
        full_sequence_must_fit: bool = False,
        has_scheduled_reqs: bool = True,
    ) -> KVCacheBlocks | None:
        """Make room for ``num_new_tokens`` more tokens; None (and no change at all) if it can't.

        The request's block list afterwards::

            | computed blocks | new computed blocks | new blocks                      |
            | (already held)  | (prefix-cache hit)  | (for the tokens computed now)   |
            <-- request.num_computed_tokens + num_new_computed_tokens --><-- num_new_tokens -->

        Two gates, vLLM's, come first (``refusal`` says which one refused):
        - ``full_sequence_must_fit`` (the scheduler's ``scheduler_reserve_full_isl``, for a waiting
          request): the free blocks must hold the request's whole sequence, not only this step's chunk.
          Otherwise chunked prefill admits a long prompt on its first chunk, runs out of blocks halfway
          through it and preempts someone, step after step;
        - the watermark: a waiting or preempted request leaves ``watermark_blocks`` free when other
          requests are already scheduled (``has_scheduled_reqs``).

        Returns only the new blocks. Blocks that become full are registered in the prefix cache,
        generated tokens included, so a later request can hit them.
        """
        if self.refusal(request, num_new_tokens, num_new_computed_tokens, new_computed_blocks, full_sequence_must_fit,
                        has_scheduled_reqs) is not None:
            return None
        hit_blocks = new_computed_blocks.blocks if new_computed_blocks is not None else []
        num_computed_tokens = request.num_computed_tokens + num_new_computed_tokens
        num_new_blocks = self._num_new_blocks(request, num_computed_tokens + num_new_tokens, len(hit_blocks))

        self.block_pool.touch(hit_blocks)
        req_blocks = self.req_to_blocks[request.request_id]
        req_blocks.extend(hit_blocks)
        new_blocks = self.block_pool.get_new_blocks(num_new_blocks, request.request_id) if num_new_blocks > 0 else []
        req_blocks.extend(new_blocks)
        if self.recorder.enabled:
            if hit_blocks:
                self.recorder.record(PrefixCacheHit(request.request_id, [b.block_id for b in hit_blocks],
                                                  num_new_computed_tokens))
            if new_blocks:
                self.recorder.record(BlocksAllocated(request.request_id, [b.block_id for b in new_blocks]))

        if self.enable_caching:
            self.cache_blocks(request, num_computed_tokens + num_new_tokens)
        return KVCacheBlocks(new_blocks)

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        """Hash the request's blocks that its first ``num_tokens`` tokens fill (as far as their ids
        are known) and register them in the prefix cache. A decode fills a block once every
        ``block_size`` steps: the other steps return at once."""
        req_blocks = self.req_to_blocks[request.request_id]
        num_full_blocks = min(num_tokens, request.num_tokens) // self.block_size
        num_cached = self.num_cached_block.get(request.request_id, 0)
        if num_full_blocks > num_cached:
            hash_new_full_blocks(
                self.block_size, request.all_token_ids[: num_full_blocks * self.block_size], request.block_hashes
            )
            self.block_pool.cache_full_blocks(request.request_id, req_blocks, request.block_hashes, num_cached,
                                              num_full_blocks)
            self.num_cached_block[request.request_id] = num_full_blocks

    def refusal(self, request: Request, num_new_tokens: int, num_new_computed_tokens: int = 0,
                new_computed_blocks: KVCacheBlocks | None = None, full_sequence_must_fit: bool = False,
                has_scheduled_reqs: bool = True) -> KVShortage | None:
        """Why ``allocate_slots`` with these arguments refuses (None: it does not)."""
        free = self.block_pool.get_num_free_blocks()
        waiting = request.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED)
        reserve = self.watermark_blocks if has_scheduled_reqs and waiting else 0
        if full_sequence_must_fit:
            whole = request.num_tokens - request.num_computed_tokens - num_new_computed_tokens
            needed = self.get_num_blocks_to_allocate(request, whole, num_new_computed_tokens, new_computed_blocks)
            if needed + reserve > free:
                return KVShortage(needed, free, True, reserve)
        needed = self.get_num_blocks_to_allocate(request, num_new_tokens, num_new_computed_tokens, new_computed_blocks)
        return KVShortage(needed, free, False, reserve) if needed + reserve > free else None

    def get_num_blocks_to_allocate(self, request: Request, num_new_tokens: int, num_new_computed_tokens: int = 0,
                                   new_computed_blocks: KVCacheBlocks | None = None) -> int:
        """How many free blocks ``allocate_slots`` with these arguments takes: the new blocks, plus the
        hit blocks that sit in the free queue (counted there as free, but about to be used)."""
        hit_blocks = new_computed_blocks.blocks if new_computed_blocks is not None else []
        num_tokens = request.num_computed_tokens + num_new_computed_tokens + num_new_tokens
        return _num_blocks_taken(self._num_new_blocks(request, num_tokens, len(hit_blocks)), hit_blocks)

    def _num_new_blocks(self, request: Request, num_tokens: int, num_hit_blocks: int) -> int:
        """Blocks to take from the pool so that the request's first ``num_tokens`` tokens (up to
        ``max_model_len``) have slots, beyond those it holds and its ``num_hit_blocks`` prefix hits."""
        num_tokens_need_slot = min(num_tokens, self.max_model_len)
        num_held = len(self.req_to_blocks.get(request.request_id, ()))
        return -(-num_tokens_need_slot // self.block_size) - num_held - num_hit_blocks

    def describe_lookup(self, request: Request, num_hit_blocks: int) -> PrefixCacheLookup:
        """Why ``get_computed_blocks`` found ``num_hit_blocks`` blocks for ``request`` and no more
        (for observers; it looks nothing up again)."""
        if not self.enable_caching:
            return PrefixCacheLookup(0, 0, "prefix_caching_off")
        if request.sampling_params.prompt_logprobs is not None:
            return PrefixCacheLookup(0, 0, "prompt_logprobs")
        num_looked_up = (request.num_tokens - 1) // self.block_size
        if num_hit_blocks < num_looked_up:
            return PrefixCacheLookup(num_looked_up, num_hit_blocks, "not_cached", request.block_hashes[num_hit_blocks])
        return PrefixCacheLookup(num_looked_up, num_hit_blocks, "partial_block")

    def free(self, request: Request) -> None:
        """Release the request's blocks, last block first.

        Freed cached blocks join the free queue's tail in this order (the others its head:
        ``BlockPool.free_blocks``), so when the pool must evict, it takes a request's *last* blocks
        before its first ones: the start of a prefix (likely shared by the next request) stays cached
        longest.
        """
        blocks = self.req_to_blocks.pop(request.request_id, [])
        ordered = list(reversed(blocks))
        self.block_pool.free_blocks(ordered)
        self.num_cached_block.pop(request.request_id, None)
        if ordered and self.recorder.enabled:
            self.recorder.record(BlocksFreed(request.request_id, [b.block_id for b in ordered]))

    def get_block_ids(self, request_id: str) -> list[int]:
        return [b.block_id for b in self.req_to_blocks.get(request_id, [])]

    def reset_prefix_cache(self) -> bool:
        return self.block_pool.reset_prefix_cache()

    def make_prefix_cache_stats(self) -> PrefixCacheStats:
        stats, self.prefix_cache_stats = self.prefix_cache_stats, PrefixCacheStats()
        return stats

    @property
    def usage(self) -> float:
        return self.block_pool.get_usage()

    @property
    def num_free_blocks(self) -> int:
        return self.block_pool.get_num_free_blocks()


def _num_blocks_taken(num_new_blocks: int, hit_blocks: list[KVCacheBlock]) -> int:
    """Free blocks an allocation takes: its new blocks, and its hit blocks that sit in the free queue
    (counted there as free, but about to be used)."""
    return max(num_new_blocks, 0) + sum(1 for b in hit_blocks if b.ref_cnt == 0)
