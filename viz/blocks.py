"""Replaying the steps' KV block changes: the blocks each request holds after every step.

Each ``engine_step`` lists, per request, the block references the step took
(``step.blocks_allocated.*``: new blocks and prefix-cache hits) and dropped (``step.blocks_freed.*``:
finished, aborted and preempted requests). Within one step a request may take and then drop (it
finishes, or the priority policy preempts it after scheduling it), never drop and then take (a
request preempted in a step is not admitted again in the same step). So applying a step's takes and
then its drops, step after step from the first, gives each request's block table in order, and::

    step 7   request "0": [0, 1, 2, 3, 15]     block 1 held by "0" and "5": reference count 2
             request "5": [1, 2, 12]           (a prefix-cache hit shares the block)

    (blocks held by at least one request) + step.num_free_blocks + trace.num_null_blocks == step.num_gpu_blocks

where the null block (block 0, vLLM's, in traces of format 4 or later) is never held and never free.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

BlockTables = dict[str, tuple[int, ...]]


class BlockReplayError(ValueError):
    """A request drops a block reference it does not hold: a block's reference count would go below
    zero (``BlockPool.free_blocks``' "freed twice"), or steps are missing from the trace."""

    def __init__(self, step: int, request_id: str, block_id: int) -> None:
        super().__init__(f"step {step}: request {request_id!r} drops block {block_id}, which it does not hold "
                         "(are steps missing from the trace?)")
        self.step, self.request_id, self.block_id = step, request_id, block_id


def unflatten(req_ids: Sequence[str], nums: Sequence[int], block_ids: Sequence[int]) -> BlockTables:
    """``step.blocks_*.{req_ids,num,block_ids}`` as ``{req_id: block ids}``: ``req_ids[i]`` has the
    next ``nums[i]`` entries of ``block_ids``."""
    if len(req_ids) != len(nums) or sum(nums) != len(block_ids):
        raise ValueError(f"block changes do not add up: {len(req_ids)} requests, counts {list(nums)}, "
                         f"{len(block_ids)} block ids")
    tables, start = {}, 0
    for req_id, n in zip(req_ids, nums):
        tables[req_id] = tuple(block_ids[start:start + n])
        start += n
    return tables


def replay_blocks(changes: Iterable[tuple[int, BlockTables, BlockTables]]) -> list[BlockTables]:
    """For each ``(step number, taken, dropped)`` in step order, the block tables after that step."""
    held: dict[str, list[int]] = {}
    after = []
    for number, taken, dropped in changes:
        for req_id, block_ids in taken.items():
            held.setdefault(req_id, []).extend(block_ids)
        for req_id, block_ids in dropped.items():
            table = held.get(req_id, [])
            for block_id in block_ids:
                if block_id not in table:
                    raise BlockReplayError(number, req_id, block_id)
                table.remove(block_id)
            if not table:
                held.pop(req_id, None)
        after.append({req_id: tuple(table) for req_id, table in held.items()})
    return after
