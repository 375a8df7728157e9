"""Optimisation "cuda_graphs": decode steps replay a CUDA graph instead of launching every kernel.

A decode step of a small model is host-bound: each of its layers launches a dozen kernels from
Python (norms, four GEMMs, RoPE, two Triton attention kernels, SiLU-and-mul), and every launch costs
the host more than the GPU needs to run it. A CUDA graph records a whole forward's launches once; a
replay sends them to the GPU in one call. vLLM calls this ``CUDAGraphMode.FULL_DECODE_ONLY``;
nano-vllm's ``capture_cudagraph`` does the same.

A graph replays exactly what was captured: the same kernels, on the same memory, with the same
shapes. So ``CudaGraphs``:

- captures one graph per batch size of ``cuda_graph_sizes`` (1, 2, 4, then every multiple of 8 up
  to ``max_num_seqs``), at start-up, the largest first, all sharing one memory pool (only one runs
  at a time);
- keeps **persistent input buffers** (token ids, positions, slot mapping, sequence lengths, query
  start locations, block table) that every graph reads; a step copies its inputs into them and
  replays the graph of the smallest size that holds its batch;
- **pads** the batch to that size with rows that write nowhere (slot -1, which
  ``reshape_and_cache`` skips) and attend one cached key (sequence length 1), whose outputs are
  never read;
- captures the attention with the longest context (``max_seq_len = max_model_len``), so that the
  kernel's launch choices (the Triton kernel's split-KV) hold for every step the graph replays;
- runs every other step eagerly: prefills and mixed batches (their shapes vary too much to
  capture) and batches larger than the largest graph.

Only a backend whose layers plan nothing on the host per step can be captured
(``AttentionBackend.supports_cuda_graphs``: the Triton backend; the torch backend loops over the
sequences in Python), and only with one rank (no tensor or pipeline parallelism: their collectives
and stage-to-stage sends are not captured here). The LM head and the sampler run outside the graph,
on the real rows.
"""

from __future__ import annotations

import bisect

import numpy as np
import torch
from torch import nn

from tracevllm.attention.backends.abstract import AttentionMetadata, AttentionMetadataBuilder
from tracevllm.models.utils import IntermediateTensors


def cuda_graph_sizes(max_num_seqs: int) -> list[int]:
    """The batch sizes to capture, as vLLM's default: 1, 2, 4, then multiples of 8, up to the first
    that holds ``max_num_seqs`` requests."""
    sizes = [1, 2, 4, *range(8, max_num_seqs + 8, 8)]
    return sizes[:bisect.bisect_left(sizes, max_num_seqs) + 1]


class CudaGraphs:
    """Called as the model is (``runner.model_forward``): replays a graph for a decode batch that
    fits one, else calls the model. ``capture`` must run once, after the KV cache is bound."""

    def __init__(self, model: nn.Module, attn_metadata_builder: AttentionMetadataBuilder, max_num_seqs: int,
                 max_model_len: int, max_num_blocks_per_req: int, device: torch.device) -> None:
        self.model = model
        self.attn_metadata_builder = attn_metadata_builder
        self.max_model_len = max_model_len
        self.sizes = cuda_graph_sizes(max_num_seqs)
        n = self.sizes[-1]
        self.input_ids = torch.zeros(n, dtype=torch.int64, device=device)
        self.positions = torch.zeros(n, dtype=torch.int64, device=device)
        self.slot_mapping = torch.full((n,), -1, dtype=torch.int64, device=device)
        self.seq_lens = torch.ones(n, dtype=torch.int32, device=device)
        # One query token per row: row i's query is token i, in every decode step.
        self.query_start_loc = torch.arange(n + 1, dtype=torch.int32, device=device)
        self.block_table = torch.zeros(n, max_num_blocks_per_req, dtype=torch.int32, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}  # each graph's hidden states, in the shared pool

    def _forward(self, size: int) -> torch.Tensor:
        """The model's forward over the first ``size`` rows of the persistent buffers. New views every
        call, as a step's inputs are new tensors every step: optimisation "rope_cache" recognises a
        step by its positions tensor, and must gather again inside the capture, not reuse the
        warm-up's gather."""
        md = self.attn_metadata_builder.build(AttentionMetadata(
            num_actual_tokens=size,
            max_query_len=1,
            max_seq_len=self.max_model_len,
            query_start_loc=self.query_start_loc[:size + 1],
            seq_lens=self.seq_lens[:size],
            block_table=self.block_table[:size],
            slot_mapping=self.slot_mapping[:size],
            query_start_loc_cpu=np.arange(size + 1, dtype=np.int32),
            seq_lens_cpu=np.full(size, self.max_model_len, dtype=np.int32),
        ))
        return self.model(self.input_ids[:size], self.positions[:size], md)

    @torch.inference_mode()
    def capture(self) -> list[int]:
        """Capture one graph per size, the largest first (the pool then holds the largest forward's
        memory, which the smaller ones reuse). Each size runs once eagerly first, so that nothing the
        first call does (compiling Triton kernels, allocating) happens inside a capture. The buffers
        hold padding rows only, so neither run writes the KV cache. Returns the sizes captured."""
        pool = torch.cuda.graph_pool_handle()
        for size in reversed(self.sizes):
            self._forward(size)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.outputs[size] = self._forward(size)
            self.graphs[size] = graph
        torch.cuda.synchronize()
        return self.sizes

    def graph_size(self, attn_metadata: AttentionMetadata) -> int | None:
        """The size of the graph that runs this step, or None: the step runs eagerly."""
        if attn_metadata.max_query_len != 1 or attn_metadata.num_reqs > self.sizes[-1]:
            return None
        return self.sizes[bisect.bisect_left(self.sizes, attn_metadata.num_reqs)]

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, attn_metadata: AttentionMetadata,
                 intermediate_tensors: IntermediateTensors | None = None) -> torch.Tensor:
        assert intermediate_tensors is None, "graphs are captured with one rank: no pipeline stage sends to this one"
        size = self.graph_size(attn_metadata)
        if size is None:
            return self.model(input_ids, positions, attn_metadata)
        n = attn_metadata.num_reqs
        self.input_ids[:n].copy_(input_ids)
        self.positions[:n].copy_(positions)
        self.slot_mapping[:n].copy_(attn_metadata.slot_mapping)
        self.seq_lens[:n].copy_(attn_metadata.seq_lens)
        table = attn_metadata.block_table
        self.block_table[:n, :table.shape[1]].copy_(table)
        if n < size:  # rows a larger batch left: padding again (write nowhere, read one key)
            self.slot_mapping[n:size].fill_(-1)
            self.seq_lens[n:size].fill_(1)
        self.graphs[size].replay()
        return self.outputs[size][:n]
