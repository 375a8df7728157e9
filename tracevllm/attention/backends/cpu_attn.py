"""The CPU attention backend: the torch backend's idea, with its work sent to C++ ops on this CPU.

vLLM: ``vllm/v1/attention/backends/cpu_attn.py``. The same cache, metadata and attention as the torch
backend (``torch_attn.py``, whose impl this one extends); what differs is who does the work:

* **Which op runs** is decided once, at start-up, by ``choose_cpu_attention_ops`` (vLLM's
  ``_get_attn_isa``), from this CPU's instructions, the model's dtype and heads, the cache's block
  size and the optimisations left on. Decode rows (query_len 1) go to one call of a C++ op that reads
  each row's K/V in place through its block table, with its two products on AMX tiles
  (``cpu_amx_decode``), on AVX512-BF16 dot products (``cpu_vec_decode``) or on float32 vector
  registers (``cpu_paged_decode``); prefill rows go to one
  call of a C++ flash attention, on AMX tiles (``cpu_amx_prefill``) or on AVX512-BF16 dot products
  (``cpu_vec_prefill``). Where none applies, the torch backend's gather + SDPA (``"sdpa"``) runs.
  The start-up log and the "Load model" span (``attention.backend``) say what was chosen.
* **The step's plan** (optimisation "decode_plan", ``DecodePlan``): the rows that decode and prefill,
  the SDPA path's decode buckets and the ops' index tensors are the same for every layer of a step;
  the builder makes one plan per step, which the first layer fills and the others read.

The choice travels in the step's metadata (``CPUAttentionMetadata.ops``), as vLLM's ``isa`` does:
the layers carry no switches. The ops live in ``attention/ops/`` (a ``.py`` beside each ``.cpp``).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Literal

import torch

from tracevllm.attention.backends.abstract import (
    AttentionBackend, AttentionImpl, AttentionMetadata, AttentionMetadataBuilder,
)
from tracevllm.attention.backends.torch_attn import DecodeBucket, StepRows, TorchAttentionImpl
from tracevllm.attention.ops import cpu_amx_decode, cpu_amx_prefill, cpu_paged_decode, cpu_vec_decode

if TYPE_CHECKING:
    from tracevllm.optimizations import OptimizationConfig

DecodeOp = Literal["cpu_amx_decode", "cpu_vec_decode", "cpu_paged_decode", "sdpa"]
PrefillOp = Literal["cpu_amx_prefill", "cpu_vec_prefill", "sdpa"]
# How each op loads (cpu_extension.py builds it once per machine): both prefill choices are one op.
_LOADERS = {"cpu_amx_decode": cpu_amx_decode.load, "cpu_vec_decode": cpu_vec_decode.load,
            "cpu_paged_decode": cpu_paged_decode.load, "cpu_amx_prefill": cpu_amx_prefill.load,
            "cpu_vec_prefill": cpu_amx_prefill.load}
# The decode ops take the same arguments (cpu_paged_decode.paged_decode_attention's).
_DECODE_OPS = {"cpu_amx_decode": cpu_amx_decode.amx_decode_attention,
               "cpu_vec_decode": cpu_vec_decode.vec_decode_attention,
               "cpu_paged_decode": cpu_paged_decode.paged_decode_attention}


@dataclass(frozen=True)
class CPUAttentionOps:
    """What serves a step's decode rows and what its prefill rows: the optimisation's name, or
    ``"sdpa"``, the torch backend's plain path."""

    decode: DecodeOp = "sdpa"
    prefill: PrefillOp = "sdpa"


def choose_cpu_attention_ops(impl: AttentionImpl, dtype: torch.dtype, block_size: int,
                             config: OptimizationConfig) -> CPUAttentionOps:
    """The one place that decides which attention runs on this CPU, for a model whose layers have
    ``impl``'s heads. Each row kind takes the first op that this CPU and model allow, whose switch is
    on and whose C++ op builds (``cpu_extension.py``; the two builds run side by side)::

        decode rows   cpu_amx_decode    AMX tiles (Intel Sapphire Rapids, later), bf16, block size a multiple
                                        of 16, head size 64/128/192/256, at most 16 query heads a KV head;
                                        needs the switch cpu_paged_decode on as well
                      cpu_vec_decode    AVX512-BF16 dot products (AMD Zen 4, Zen 5, or AMX's CPUs with
                                        cpu_amx_decode off), bf16, head size 64/128/192/256, at most
                                        16 query heads a KV head, any block size; needs cpu_paged_decode
                      cpu_paged_decode  float32 vector registers, any dtype, head size 16/32/64/128/256
                      sdpa              gather + SDPA (torch_attn.py)
        prefill rows  cpu_amx_prefill   AMX tiles, bf16, head size 64/128/192/256; a CPU with tiles
                                        uses them or SDPA, never the next line
                      cpu_vec_prefill   AVX512-BF16 dot products and no AMX (AMD Zen 4), same sizes
                      sdpa              one SDPA per prefill row (torch_attn.py)
    """
    decode: list[DecodeOp] = []
    if config.enabled("cpu_paged_decode"):
        if (config.enabled("cpu_amx_decode") and block_size % 16 == 0
                and cpu_amx_decode.supports(impl.num_heads, impl.num_kv_heads, impl.head_dim, dtype)):
            decode.append("cpu_amx_decode")
        if config.enabled("cpu_vec_decode") and cpu_vec_decode.supports(impl.num_heads, impl.num_kv_heads,
                                                                         impl.head_dim, dtype):
            decode.append("cpu_vec_decode")
        if cpu_paged_decode.supports(impl.head_dim):
            decode.append("cpu_paged_decode")
    prefill: list[PrefillOp] = []
    if cpu_amx_prefill.supports(impl.head_dim, dtype):
        if config.enabled("cpu_amx_prefill"):
            prefill.append("cpu_amx_prefill")
    elif config.enabled("cpu_vec_prefill") and cpu_amx_prefill.supports(impl.head_dim, dtype, amx=False):
        prefill.append("cpu_vec_prefill")
    with ThreadPoolExecutor(max_workers=2) as pool:
        chosen_decode, chosen_prefill = pool.map(_first_that_loads, (decode, prefill))
    return CPUAttentionOps(chosen_decode, chosen_prefill)


def _first_that_loads(ops: list[str]) -> str:
    return next((op for op in ops if _LOADERS[op]()), "sdpa")


class DecodePlan:
    """Optimisation "decode_plan": what every layer of a step works out alike from the step's
    metadata, worked out once and read by the others: the rows that decode and prefill (at once),
    then, by the first layer that needs them, the SDPA path's decode buckets (one list per sliding
    window) and the index tensors the C++ ops take. ``CPUAttentionMetadataBuilder.build`` makes one
    per step; with the switch off, each layer makes its own, as the torch backend does."""

    def __init__(self, md: AttentionMetadata) -> None:
        self.rows = StepRows.of(md)
        self._buckets: dict[tuple[int | None, int], list[DecodeBucket]] = {}
        self._decode_index: tuple[torch.Tensor, torch.Tensor] | None = None
        self._prefill_index: torch.Tensor | None = None

    def decode_buckets(self, impl: TorchAttentionImpl, md: AttentionMetadata, block_size: int) -> list[DecodeBucket]:
        key = (impl.sliding_window, block_size)
        if key not in self._buckets:
            self._buckets[key] = impl._decode_buckets(md, block_size, self.rows.decode)
        return self._buckets[key]

    def decode_index(self, md: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor]:
        """The decode ops' ``rows`` and ``tokens``: the decode requests and their query rows."""
        if self._decode_index is None:
            self._decode_index = (torch.from_numpy(self.rows.decode).to(torch.long),
                                  torch.from_numpy(md.query_start_loc_cpu[self.rows.decode]).to(torch.long))
        return self._decode_index

    def prefill_index(self) -> torch.Tensor:
        """The prefill op's ``rows``: the prefill requests."""
        if self._prefill_index is None:
            self._prefill_index = torch.tensor(self.rows.prefill, dtype=torch.long)
        return self._prefill_index


@dataclass(slots=True)
class CPUAttentionMetadata(AttentionMetadata):
    """The step's metadata, with the ops chosen at start-up and the step's plan (None: optimisation
    "decode_plan" off, each layer plans alone)."""

    ops: CPUAttentionOps
    plan: DecodePlan | None


_COMMON_FIELDS = [f.name for f in fields(AttentionMetadata)]


class CPUAttentionMetadataBuilder(AttentionMetadataBuilder):
    def __init__(self, impl: AttentionImpl, dtype: torch.dtype, block_size: int,
                 optimization_config: OptimizationConfig) -> None:
        self.ops = choose_cpu_attention_ops(impl, dtype, block_size, optimization_config)
        self.decode_plan = optimization_config.enabled("decode_plan")

    def build(self, md: AttentionMetadata) -> CPUAttentionMetadata:
        common = {name: getattr(md, name) for name in _COMMON_FIELDS}
        return CPUAttentionMetadata(**common, ops=self.ops, plan=DecodePlan(md) if self.decode_plan else None)

    def describe(self) -> str:
        return f"decode: {self.ops.decode}, prefill: {self.ops.prefill}"


class CPUAttentionImpl(TorchAttentionImpl):
    """The torch backend's attention, each row kind sent to the op chosen at start-up
    (``attn_metadata.ops``); where that is ``"sdpa"``, the torch backend's own code runs."""

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        attn_metadata: CPUAttentionMetadata,
    ) -> torch.Tensor:
        md, ops = attn_metadata, attn_metadata.ops
        plan = md.plan if md.plan is not None else DecodePlan(md)
        rows = plan.rows
        flat_k, flat_v = self._write_kv(key, value, kv_cache, md.slot_mapping, rows.all_slotted)
        key_cache, value_cache = kv_cache
        block_size = key_cache.shape[1]
        output = torch.empty_like(query)
        if len(rows.decode) and ops.decode == "sdpa":
            self._decode(query, flat_k, flat_v, plan.decode_buckets(self, md, block_size), output)
        elif len(rows.decode):
            _DECODE_OPS[ops.decode](output, query, key_cache, value_cache, md.block_table, md.seq_lens,
                                    *plan.decode_index(md), self.scale, self.sliding_window)
        if rows.prefill and ops.prefill == "sdpa":
            for row in rows.prefill:
                self._prefill(query, key, value, flat_k, flat_v, block_size, md, row, output)
        elif rows.prefill:
            cpu_amx_prefill.prefill_attention(output, query, key_cache, value_cache, md.block_table, md.query_start_loc,
                                              md.seq_lens, plan.prefill_index(), self.scale, self.sliding_window,
                                              amx=ops.prefill == "cpu_amx_prefill")
        return output


class CPUAttentionBackend(AttentionBackend):
    name = "cpu"
    # The switches this backend serves: with all of them off, "auto" picks the torch backend.
    optimizations = ("decode_plan", "cpu_paged_decode", "cpu_amx_decode", "cpu_vec_decode", "cpu_amx_prefill",
                     "cpu_vec_prefill")

    @staticmethod
    def get_impl_cls() -> type[AttentionImpl]:
        return CPUAttentionImpl

    @staticmethod
    def get_builder_cls() -> type[AttentionMetadataBuilder]:
        return CPUAttentionMetadataBuilder
