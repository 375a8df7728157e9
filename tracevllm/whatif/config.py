"""The configuration a what-if replays under: the recorded run's own, read from its start-up spans,
then changed by ``--set KEY=VALUE``.

A trace of format 3 or later carries the scheduler's and the KV cache's whole configuration on its
start-up spans: ``EngineCore init`` (``max_num_seqs``, the policy, ``max_num_batched_tokens`` as
fitted, ``max_model_len``, chunked prefill) and ``Allocate KV cache`` (the blocks, their size, prefix
caching). ``--set`` takes the ``EngineArgs`` options the scheduler and the KV cache read
(``SETTINGS``), spelt and typed as ``EngineArgs`` declares them, and the result is built as the
engine builds it, into a ``SchedulerConfig`` and a ``CacheConfig``, whose own checks refuse a bad
value with the engine's message.

The KV cache keeps the recorded run's memory unless told otherwise: ``block_size=32`` on a run of
1,000 blocks of 16 tokens gives 500 blocks; ``kv_cache_memory_bytes`` sizes it from the recorded
bytes per token; ``num_gpu_blocks_override`` sets the blocks outright.
"""

from __future__ import annotations

import difflib
import types
import typing
from dataclasses import dataclass, replace
from typing import Any

from tracevllm.config import CacheConfig, SchedulerConfig
from tracevllm.core.stages import SCHEDULER_CONFIG_ATTRS
from tracevllm.engine.arg_utils import EngineArgs
from tracevllm.tracing.schema import Attr, SpanName
from tracevllm.whatif import SETTINGS
from viz.model import Trace

CONFIG_FORMAT = 3  # the first trace format (``schema.TRACE_FORMAT``) whose start-up carries the configuration
# What a trace recorded before the start-up carried these ran with: tracevllm checked only a prompt's
# first chunk before admitting it (vLLM's rule before 0.32), kept no watermark and scheduled synchronously.
_RECORDED_LATER = {Attr.SCHEDULER_RESERVE_FULL_ISL: False, Attr.WATERMARK: 0.0, Attr.ASYNC_SCHEDULING: False}
_RECORDED = (*(a for a in SCHEDULER_CONFIG_ATTRS if a not in _RECORDED_LATER), Attr.NUM_GPU_BLOCKS, Attr.BLOCK_SIZE,
             Attr.ENABLE_PREFIX_CACHING)
_TRUE, _FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")


@dataclass(frozen=True)
class SimulationConfig:
    """The scheduler's and the KV cache's configuration (``cache.num_gpu_blocks`` set), and the
    recorded KV bytes per token (None when the trace does not say: ``kv_cache_memory_bytes`` is then
    refused)."""

    scheduler: SchedulerConfig
    cache: CacheConfig
    kv_bytes_per_token: float | None = None

    @staticmethod
    def recorded(trace: Trace) -> SimulationConfig:
        """The run's configuration, from its start-up spans (ValueError when they lack it)."""
        a: dict[str, Any] = {}
        for span in trace.spans:
            if span.name in (SpanName.ENGINE_CORE_INIT, SpanName.ALLOCATE_KV_CACHE):
                a.update(span.attributes)
        if missing := [key for key in _RECORDED if key not in a]:
            raise ValueError(
                f"{trace.directory}: the start-up spans lack {', '.join(missing)}: the run was recorded before "
                f"traces carried the engine's configuration (trace format {trace.trace_format}, a what-if needs "
                f"{CONFIG_FORMAT} or later), or without its start-up; record the run again with this version of "
                "tracevllm")
        a = {**_RECORDED_LATER, **a}
        scheduler = SchedulerConfig(**{name: a[attr] for attr, name in SCHEDULER_CONFIG_ATTRS.items()})
        num_blocks, block_size = a[Attr.NUM_GPU_BLOCKS], a[Attr.BLOCK_SIZE]
        cache = CacheConfig(block_size=block_size, enable_prefix_caching=a[Attr.ENABLE_PREFIX_CACHING],
                            num_gpu_blocks=num_blocks)
        kv_bytes = a.get(Attr.KV_CACHE_BYTES)
        return SimulationConfig(scheduler, cache, kv_bytes / (num_blocks * block_size) if kv_bytes else None)

    def with_settings(self, settings: dict[str, Any]) -> SimulationConfig:
        """This configuration changed by ``settings`` (``parse_settings``'s), checked as the engine
        checks its own (ValueError naming the option)."""
        s = settings
        values = dict(
            max_num_seqs=s.get("max_num_seqs", self.scheduler.max_num_seqs),
            max_num_batched_tokens=s.get("max_num_batched_tokens", self.scheduler.max_num_batched_tokens),
            max_model_len=s.get("max_model_len", self.scheduler.max_model_len),
            policy=s.get("scheduling_policy", self.scheduler.policy),
            enable_chunked_prefill=s.get("enable_chunked_prefill", self.scheduler.enable_chunked_prefill),
            long_prefill_token_threshold=s.get("long_prefill_token_threshold",
                                               self.scheduler.long_prefill_token_threshold),
            scheduler_reserve_full_isl=s.get("scheduler_reserve_full_isl", self.scheduler.scheduler_reserve_full_isl),
            watermark=s.get("watermark", self.scheduler.watermark),
            async_scheduling=s.get("async_scheduling", self.scheduler.async_scheduling))
        try:
            scheduler = SchedulerConfig(**values)
        except ValueError as e:
            raise ValueError(f"{e}{_companion_setting(s, values)}") from None
        if scheduler.max_model_len < 1:
            raise ValueError(f"max_model_len must be >= 1, got {scheduler.max_model_len}.")
        block_size = s.get("block_size", self.cache.block_size)
        cache = CacheConfig(block_size=block_size,
                            enable_prefix_caching=s.get("enable_prefix_caching", self.cache.enable_prefix_caching),
                            num_gpu_blocks_override=s.get("num_gpu_blocks_override"),
                            kv_cache_memory_bytes=s.get("kv_cache_memory_bytes"))
        cache.num_gpu_blocks = self._num_blocks(cache)
        usable = cache.num_gpu_blocks - 1  # block 0 is the null block (core/block_pool.py)
        if usable * block_size < scheduler.max_model_len:
            blocks_needed = -(-scheduler.max_model_len // block_size) + 1
            raise ValueError(
                f"The KV cache holds {cache.num_gpu_blocks} blocks of {block_size} tokens, {usable} of them for "
                f"requests (block 0 is the null block): {usable * block_size} tokens, fewer than max_model_len "
                f"({scheduler.max_model_len}), which the engine refuses too: add --set max_model_len="
                f"{usable * block_size} or --set num_gpu_blocks_override={blocks_needed}.")
        return replace(self, scheduler=scheduler, cache=cache)

    def _num_blocks(self, cache: CacheConfig) -> int:
        """As many blocks as the recorded memory holds at the new block size, unless an option says."""
        if cache.num_gpu_blocks_override is not None:
            return cache.num_gpu_blocks_override
        if cache.kv_cache_memory_bytes is not None:
            if self.kv_bytes_per_token is None:
                raise ValueError("kv_cache_memory_bytes: the trace does not record the KV cache's bytes "
                                 f"({Attr.KV_CACHE_BYTES}); set num_gpu_blocks_override instead.")
            return max(1, int(cache.kv_cache_memory_bytes // (self.kv_bytes_per_token * cache.block_size)))
        return max(1, self.cache.num_gpu_blocks * self.cache.block_size // cache.block_size)

    def attributes(self) -> dict[str, dict[str, str | int | float]]:
        """What the start-up spans of a run under this configuration carry, per span (as recorded)."""
        s, c = self.scheduler, self.cache
        return {
            SpanName.ENGINE_CORE_INIT: {attr: getattr(s, name) for attr, name in SCHEDULER_CONFIG_ATTRS.items()},
            SpanName.ALLOCATE_KV_CACHE: {
                Attr.NUM_GPU_BLOCKS: c.num_gpu_blocks, Attr.BLOCK_SIZE: c.block_size,
                Attr.ENABLE_PREFIX_CACHING: c.enable_prefix_caching,
                **({Attr.KV_CACHE_BYTES: round(self.kv_bytes_per_token * c.num_gpu_blocks * c.block_size)}
                   if self.kv_bytes_per_token else {})},
        }


def _companion_setting(settings: dict[str, Any], values: dict[str, Any]) -> str:
    """The engine checks two pairs of options against each other (``SchedulerConfig``):
    ``max_num_batched_tokens >= max_num_seqs`` and, with chunked prefill off, ``max_num_batched_tokens
    >= max_model_len``. When ``--set`` changed one of a pair and the recorded value of the other no
    longer fits, the exact ``--set`` to add ("" when both were set, or neither rule is broken)."""
    budget, seqs, model_len = values["max_num_batched_tokens"], values["max_num_seqs"], values["max_model_len"]
    if budget < seqs:
        pair = [("max_num_seqs", seqs, budget), ("max_num_batched_tokens", budget, seqs)]
    elif not values["enable_chunked_prefill"] and budget < model_len:
        pair = [("max_num_batched_tokens", budget, model_len), ("max_model_len", model_len, budget)]
    else:
        return ""
    for key, recorded, fits in pair:
        if key not in settings:
            return f" The recorded run had {key}={recorded}: add --set {key}={fits}."
    return ""


def parse_settings(pairs: list[str]) -> dict[str, Any]:
    """``["max_num_seqs=8", "enable_prefix_caching=false"]`` as ``{"max_num_seqs": 8, ...}``, each value
    of its ``EngineArgs`` field's type (a ``Literal``'s values are its choices); ValueError for an
    unknown key, with the close ones, or a value of the wrong kind."""
    hints = typing.get_type_hints(EngineArgs)
    settings: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        key = key.strip().replace("-", "_")
        if not sep:
            raise ValueError(f"--set takes KEY=VALUE, got {pair!r}")
        if key not in SETTINGS:
            close = difflib.get_close_matches(key, SETTINGS, n=2)
            hint = f" Did you mean {' or '.join(close)}?" if close else ""
            raise ValueError(f"--set {key}: not a scheduling or KV cache option of EngineArgs.{hint} "
                             f"The options: {', '.join(SETTINGS)}.")
        settings[key] = _parse_value(key, text.strip(), hints[key])
    return settings


def _parse_value(key: str, text: str, hint: Any) -> Any:
    members = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    literal = next((m for m in members if typing.get_origin(m) is typing.Literal), None)
    if literal is not None:
        choices = typing.get_args(literal)
        value = next((c for c in choices if str(c) == text), None)
        if value is None:
            raise ValueError(f"--set {key}={text}: must be one of {', '.join(map(str, choices))}")
        return value
    if bool in members:
        if text.lower() not in _TRUE + _FALSE:
            raise ValueError(f"--set {key}={text}: must be true or false")
        return text.lower() in _TRUE
    kind, name = (float, "a number") if float in members else (int, "an integer")
    try:
        return kind(text)
    except ValueError:
        raise ValueError(f"--set {key}={text}: must be {name}") from None
