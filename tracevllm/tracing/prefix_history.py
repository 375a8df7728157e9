"""PrefixCacheHistory: what the engine forgets about cached blocks, kept to explain prefix misses.

The engine records a missed lookup with the hash of the first block it did not find
(``PrefixCacheLookup``, reason ``not_cached``) and nothing more: it keeps no history. This observer
keeps the history from the pool's events, so that a miss can be told apart:

- ``never_stored``: no request ever stored a block with that content (as far back as it remembers);
- ``evicted``: one did, and the block was handed out at step s to make room for request r;
- ``cleared``: one did, and ``reset_prefix_cache`` forgot it.

It remembers the last ``max_hashes`` hashes stored (1 Mi: about 100 MB at worst); an older one reads
as ``never_stored``.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from tracevllm.core.events import AllBlocksCleared, BlocksEvicted, BlocksStored


@dataclass(frozen=True, slots=True)
class MissCause:
    reason: str  # never_stored, evicted or cleared
    evicted_step: int = 0  # for evicted: the step, and the request the block went to
    evicted_for: str = ""


_STORED = MissCause("stored")  # still cached: not a miss (two requests computing one block at once)
_CLEARED = MissCause("cleared")


class PrefixCacheHistory:
    def __init__(self, max_hashes: int = 1 << 20) -> None:
        self.max_hashes = max_hashes
        self.cached_hash: dict[int, bytes] = {}  # block id -> the hash its content is stored under
        self.fate: OrderedDict[bytes, MissCause] = OrderedDict()  # hash -> what became of it, newest last

    def stored(self, e: BlocksStored) -> None:
        """A hash stored again keeps the fate it had: the admission whose miss it explains stores its
        blocks before its ``RequestScheduled`` is recorded, and a later miss means a later fate."""
        for block_id, block_hash in zip(e.block_ids, e.block_hashes):
            self.cached_hash[block_id] = block_hash
            self._remember(block_hash, self.fate.get(block_hash, _STORED))

    def evicted(self, e: BlocksEvicted, step: int) -> None:
        for block_id in e.block_ids:
            block_hash = self.cached_hash.pop(block_id, None)
            if block_hash is not None:
                self._remember(block_hash, MissCause("evicted", step, e.request_id))

    def cleared(self, _: AllBlocksCleared) -> None:
        for block_hash in self.cached_hash.values():
            self._remember(block_hash, _CLEARED)
        self.cached_hash.clear()

    def explain_miss(self, block_hash: bytes) -> MissCause:
        """Why the block with this hash was not in the cache."""
        cause = self.fate.get(block_hash)
        return MissCause("never_stored") if cause is None or cause is _STORED else cause

    def _remember(self, block_hash: bytes, cause: MissCause) -> None:
        self.fate[block_hash] = cause
        self.fate.move_to_end(block_hash)
        if len(self.fate) > self.max_hashes:
            self.fate.popitem(last=False)
