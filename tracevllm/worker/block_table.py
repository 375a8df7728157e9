"""BlockTable: each batch row's physical KV block ids, kept on the host between steps.

Row ``i`` holds the block ids of the request in batch slot ``i``; only the first
``num_blocks_per_row[i]`` entries are meaningful. Each step appends the blocks the scheduler added,
and ``compute_slot_mapping`` turns token positions into cache slots
(``block_id * block_size + position % block_size``) for the whole batch at once.
"""

from __future__ import annotations

import numpy as np
import torch


class BlockTable:
    def __init__(self, max_num_reqs: int, max_num_blocks_per_req: int, block_size: int) -> None:
        self.block_size = block_size
        self.max_num_blocks_per_req = max_num_blocks_per_req
        self.block_table_np = np.zeros((max_num_reqs, max_num_blocks_per_req), dtype=np.int32)
        self.num_blocks_per_row = np.zeros(max_num_reqs, dtype=np.int32)

    def append_row(self, block_ids: list[int], row: int) -> None:
        if not block_ids:
            return
        start = self.num_blocks_per_row[row]
        self.block_table_np[row, start : start + len(block_ids)] = block_ids
        self.num_blocks_per_row[row] = start + len(block_ids)

    def add_row(self, block_ids: list[int], row: int) -> None:
        self.num_blocks_per_row[row] = 0
        self.append_row(block_ids, row)

    def move_row(self, src: int, dst: int) -> None:
        n = self.num_blocks_per_row[src]
        self.block_table_np[dst, :n] = self.block_table_np[src, :n]
        self.num_blocks_per_row[dst] = n

    def compute_slot_mapping(self, req_indices: np.ndarray, positions: np.ndarray) -> np.ndarray:
        block_ids = self.block_table_np[req_indices, positions // self.block_size]
        return block_ids.astype(np.int64) * self.block_size + positions % self.block_size

    def get_device_tensor(self, num_reqs: int, device: torch.device) -> torch.Tensor:
        """The first ``num_reqs`` rows, trimmed to the longest row, on ``device``."""
        width = int(self.num_blocks_per_row[:num_reqs].max(initial=1))
        return torch.from_numpy(self.block_table_np[:num_reqs, :width]).to(device, non_blocking=True)
