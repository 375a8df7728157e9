"""The workloads whose schedules are recorded from vLLM (``record_vllm.py``) into ``tests/data/vllm_schedules/``.

Each scenario forces one part of the scheduler or the KV cache: chunked prefill at a small budget,
preemption by recompute, prefix caching, the long-prefill cap, ``max_num_seqs``, priorities, stops,
``n > 1``, ``max_model_len``, aborts, the watermark. Prompts are random token ids (seeded: the same
scenario always makes the same prompts); every request is greedy unless it says otherwise (vLLM samples ``n > 1``).

A request arrives just before step ``arrive_before_step`` (steps count ``Scheduler.schedule()`` calls
from 1; an engine left with nothing to do takes the next arrivals at once) and, if
``abort_before_step`` is set, is aborted just before that step. ``stop_at``: the request stops at the
first token it generated at that position or later, in a first, stop-free run, that it had not
generated before (its ``stop_token_ids`` are that token).

Standard library only: the recorder imports this file in vLLM's virtual environment.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from collections.abc import Callable
from typing import Any

BLOCK_SIZE = 32  # vLLM's CPU attention needs a multiple of 32
VOCAB_SIZE = 512  # the recorder's tiny model
FIRST_TOKEN_ID = 3  # 0-2: pad, BOS, EOS


@dataclass
class RequestSpec:
    prompt_token_ids: list[int]
    max_tokens: int
    arrive_before_step: int = 1
    abort_before_step: int | None = None
    n: int = 1
    priority: int = 0
    ignore_eos: bool = True
    min_tokens: int = 0
    stop_at: int | None = None
    temperature: float = 0.0
    seed: int | None = None


@dataclass
class Scenario:
    name: str
    description: str
    options: dict[str, Any]
    requests: list[RequestSpec] = field(default_factory=list)


DEFAULT_OPTIONS: dict[str, Any] = {
    "block_size": BLOCK_SIZE, "enable_prefix_caching": True, "enable_chunked_prefill": True,
    "long_prefill_token_threshold": 0, "scheduling_policy": "fcfs", "scheduler_reserve_full_isl": True,
    "watermark": 0.0,
}


def _options(**kw: Any) -> dict[str, Any]:
    return {**DEFAULT_OPTIONS, **kw}


def _prompt(rng: random.Random, length: int) -> list[int]:
    return [rng.randrange(FIRST_TOKEN_ID, VOCAB_SIZE) for _ in range(length)]


def _prompts(rng: random.Random, n: int, lo: int, hi: int) -> list[list[int]]:
    return [_prompt(rng, rng.randint(lo, hi)) for _ in range(n)]


def chunked_prefill_small_budget() -> Scenario:
    rng = random.Random(1)
    reqs = [RequestSpec(p, rng.randint(30, 80)) for p in _prompts(rng, 6, 40, 300)]
    reqs += [RequestSpec(p, rng.randint(30, 80), arrive_before_step=30) for p in _prompts(rng, 4, 40, 200)]
    return Scenario("chunked_prefill_small_budget", "a budget of 32 tokens: every prompt in chunks, decodes first",
                    _options(max_num_batched_tokens=32, max_num_seqs=4, num_gpu_blocks_override=64,
                             max_model_len=1024), reqs)


def preemption_recompute() -> Scenario:
    rng = random.Random(2)
    reqs = [RequestSpec(p, rng.randint(32, 128)) for p in _prompts(rng, 16, 32, 256)]
    return Scenario("preemption_recompute", "a KV cache of 24 blocks for 16 requests: preemption by recompute",
                    _options(max_num_batched_tokens=128, max_num_seqs=8, num_gpu_blocks_override=24,
                             max_model_len=512), reqs)


def shared_system_prompt() -> Scenario:
    rng = random.Random(3)
    system = _prompt(rng, 160)
    reqs = []
    for wave, step in enumerate((1, 25, 60)):
        for suffix in _prompts(rng, 6 if wave == 0 else 5, 8, 100):
            reqs.append(RequestSpec(system + suffix, rng.randint(16, 48), arrive_before_step=step))
    return Scenario("shared_system_prompt", "16 requests behind one 160-token system prompt, in three waves: "
                    "prefix-cache hits", _options(max_num_batched_tokens=256, max_num_seqs=8,
                                                  num_gpu_blocks_override=64, max_model_len=1024), reqs)


def long_prompt_ahead() -> Scenario:
    rng = random.Random(4)
    reqs = [RequestSpec(_prompt(rng, 960), 32)]
    reqs += [RequestSpec(p, rng.randint(60, 120)) for p in _prompts(rng, 10, 16, 64)]
    return Scenario("long_prompt_ahead", "a 960-token prompt ahead of ten short ones",
                    _options(max_num_batched_tokens=128, max_num_seqs=16, num_gpu_blocks_override=64,
                             max_model_len=1024), reqs)


def long_prefill_threshold() -> Scenario:
    rng = random.Random(5)
    reqs = [RequestSpec(_prompt(rng, 700), 24)]
    for step in (3, 8, 20, 20, 35, 50):
        reqs.append(RequestSpec(_prompt(rng, rng.randint(100, 300)), rng.randint(40, 100), arrive_before_step=step))
    return Scenario("long_prefill_threshold", "long_prefill_token_threshold=64: a lone long prompt, then company",
                    _options(max_num_batched_tokens=256, max_num_seqs=8, num_gpu_blocks_override=64,
                             max_model_len=1024, long_prefill_token_threshold=64), reqs)


def max_num_seqs_limit() -> Scenario:
    rng = random.Random(6)
    reqs = [RequestSpec(p, rng.randint(20, 60)) for p in _prompts(rng, 12, 16, 120)]
    return Scenario("max_num_seqs_limit", "max_num_seqs=3: twelve requests, three at a time",
                    _options(max_num_batched_tokens=512, max_num_seqs=3, num_gpu_blocks_override=64,
                             max_model_len=1024), reqs)


def priority_preemption() -> Scenario:
    rng = random.Random(7)
    reqs = [RequestSpec(p, rng.randint(32, 96), priority=rng.randint(1, 3)) for p in _prompts(rng, 8, 32, 200)]
    for step in (10, 15, 20, 30, 40, 45, 60, 70):
        reqs.append(RequestSpec(_prompt(rng, rng.randint(32, 200)), rng.randint(32, 96), arrive_before_step=step,
                                priority=rng.randint(0, 2)))
    return Scenario("priority_preemption", "scheduling_policy=priority, 24 blocks: urgent arrivals preempt by priority",
                    _options(max_num_batched_tokens=128, max_num_seqs=8, num_gpu_blocks_override=24,
                             max_model_len=512, scheduling_policy="priority"), reqs)


def priority_self_preemption() -> Scenario:
    """The low-priority request, first in the running list, needs a block when none is free: it is its
    own victim, and the step's running loop ends there (the requests after it wait for the next step)."""
    rng = random.Random(17)
    reqs = [RequestSpec(_prompt(rng, 58), 173, priority=3),
            RequestSpec(_prompt(rng, 13), 110, arrive_before_step=2, priority=2),
            RequestSpec(_prompt(rng, 35), 54, arrive_before_step=3, priority=0),
            RequestSpec(_prompt(rng, 41), 107, arrive_before_step=6, priority=2),
            RequestSpec(_prompt(rng, 28), 40, arrive_before_step=6, priority=2)]
    return Scenario("priority_self_preemption", "scheduling_policy=priority, 14 blocks: a request that preempts "
                    "itself ends the step's running loop", _options(
                        max_num_batched_tokens=128, max_num_seqs=8, num_gpu_blocks_override=14, max_model_len=416,
                        scheduling_policy="priority"), reqs)


def stop_tokens() -> Scenario:
    rng = random.Random(8)
    reqs = []
    for i, p in enumerate(_prompts(rng, 12, 16, 160)):
        max_tokens = rng.randint(48, 128)
        if i % 3 == 0:
            reqs.append(RequestSpec(p, max_tokens, stop_at=rng.randint(4, max_tokens - 4)))
        elif i % 3 == 1:
            reqs.append(RequestSpec(p, max_tokens, stop_at=rng.randint(8, max_tokens - 2), min_tokens=4))
        else:
            reqs.append(RequestSpec(p, max_tokens, ignore_eos=False))
    return Scenario("stop_tokens", "stop tokens, EOS and max_tokens finishing requests mid-batch",
                    _options(max_num_batched_tokens=256, max_num_seqs=8, num_gpu_blocks_override=64,
                             max_model_len=1024), reqs)


def n_samples() -> Scenario:
    rng = random.Random(9)
    shared = _prompt(rng, 64)
    reqs = []
    for i in range(6):
        prompt = (shared if i % 2 else []) + _prompt(rng, rng.randint(20, 120))
        reqs.append(RequestSpec(prompt, rng.randint(40, 90), n=2 if i == 5 else 3, arrive_before_step=1 + 6 * i,
                                temperature=1.0))  # vLLM refuses n > 1 greedy, and a seed on CPU
    return Scenario("n_samples", "n > 1: the samples of a request share its prompt's blocks",
                    _options(max_num_batched_tokens=128, max_num_seqs=12, num_gpu_blocks_override=48,
                             max_model_len=1024), reqs)


def max_model_len_prompt() -> Scenario:
    rng = random.Random(10)
    reqs = [RequestSpec(_prompt(rng, 255), 16), RequestSpec(_prompt(rng, 250), 64),
            RequestSpec(_prompt(rng, 200), 100),
            # the 6th token is the last max_model_len allows: where it is a stop token, a stop, not the length
            *(RequestSpec(_prompt(rng, 250), 64, stop_at=5) for _ in range(3))]
    reqs += [RequestSpec(p, rng.randint(32, 80), arrive_before_step=2) for p in _prompts(rng, 6, 16, 64)]
    reqs += [RequestSpec(p, rng.randint(60, 120), arrive_before_step=40) for p in _prompts(rng, 4, 100, 200)]
    return Scenario("max_model_len_prompt", "max_model_len=256: a prompt of 255 tokens, others capped by the length",
                    _options(max_num_batched_tokens=64, max_num_seqs=8, num_gpu_blocks_override=48,
                             max_model_len=256), reqs)


def aborts() -> Scenario:
    rng = random.Random(11)
    reqs = [RequestSpec(p, rng.randint(32, 64)) for p in _prompts(rng, 10, 32, 200)]
    reqs[9].abort_before_step = 3  # still waiting
    reqs[1].abort_before_step = 4  # mid-prefill
    reqs[0].abort_before_step = 40  # decoding
    reqs.append(RequestSpec(_prompt(rng, 100), 48, arrive_before_step=20, abort_before_step=22))
    return Scenario("aborts", "requests aborted while waiting, mid-prefill and while decoding",
                    _options(max_num_batched_tokens=64, max_num_seqs=6, num_gpu_blocks_override=32,
                             max_model_len=512), reqs)


def mixed_random() -> Scenario:
    rng = random.Random(12)
    reqs = [RequestSpec(p, rng.randint(32, 128)) for p in _prompts(rng, 24, 32, 512)]
    return Scenario("mixed_random", "24 random prompts of 32-512 tokens, 48 blocks, budget 256, max_num_seqs 8",
                    _options(max_num_batched_tokens=256, max_num_seqs=8, num_gpu_blocks_override=48,
                             max_model_len=1024), reqs)


def prefix_cache_under_preemption() -> Scenario:
    rng = random.Random(13)
    prefix = _prompt(rng, 96)
    reqs = [RequestSpec(prefix + p, rng.randint(32, 96), arrive_before_step=1 + 4 * (i // 4))
            for i, p in enumerate(_prompts(rng, 14, 16, 120))]
    return Scenario("prefix_cache_under_preemption", "a shared 96-token prefix in a 20-block cache: which cached "
                    "blocks survive eviction", _options(max_num_batched_tokens=128, max_num_seqs=8,
                                                        num_gpu_blocks_override=20, max_model_len=512), reqs)


def no_prefix_caching() -> Scenario:
    rng = random.Random(14)
    reqs = [RequestSpec(p, rng.randint(32, 96)) for p in _prompts(rng, 14, 32, 200)]
    return Scenario("no_prefix_caching", "prefix caching off, 24 blocks: preemption, freed blocks reused last-in first",
                    _options(max_num_batched_tokens=128, max_num_seqs=8, num_gpu_blocks_override=24,
                             max_model_len=512, enable_prefix_caching=False), reqs)


def watermark() -> Scenario:
    rng = random.Random(15)
    reqs = [RequestSpec(p, rng.randint(32, 96), arrive_before_step=1 + 3 * i)
            for i, p in enumerate(_prompts(rng, 14, 32, 200))]
    return Scenario("watermark", "watermark=0.1: admissions keep 4 of 40 blocks free while others run",
                    _options(max_num_batched_tokens=128, max_num_seqs=8, num_gpu_blocks_override=40,
                             max_model_len=512, watermark=0.1), reqs)


def admission_first_chunk_only() -> Scenario:
    """vLLM's admission before 0.32, which scheduler_reserve_full_isl=False brings back."""
    scenario = mixed_random()
    scenario.options["scheduler_reserve_full_isl"] = False
    return Scenario("admission_first_chunk_only", "mixed_random with scheduler_reserve_full_isl=False: a prompt is "
                    "admitted when its first chunk fits, then preempted when the rest does not", scenario.options,
                    scenario.requests)


def chunked_prefill_off() -> Scenario:
    rng = random.Random(16)
    reqs = [RequestSpec(p, rng.randint(24, 64)) for p in _prompts(rng, 12, 64, 600)]
    return Scenario("chunked_prefill_off", "enable_chunked_prefill=False: a prompt waits for room for all of it",
                    _options(max_num_batched_tokens=1024, max_num_seqs=8, num_gpu_blocks_override=64,
                             max_model_len=1024, enable_chunked_prefill=False), reqs)


def scheduled_asynchronously(scenario: Callable[[], Scenario]) -> Callable[[], Scenario]:
    """``scenario`` with ``async_scheduling`` on (vLLM's default): each step scheduled before the last
    one's tokens are back, with output placeholders."""
    def make() -> Scenario:
        s = scenario()
        return Scenario(f"{s.name}_async", f"{s.description}; scheduled asynchronously",
                        {**s.options, "async_scheduling": True}, s.requests)
    return make


SYNCHRONOUS = (
    chunked_prefill_small_budget, preemption_recompute, shared_system_prompt, long_prompt_ahead,
    long_prefill_threshold, max_num_seqs_limit, priority_preemption, priority_self_preemption, stop_tokens, n_samples,
    max_model_len_prompt, aborts, mixed_random, admission_first_chunk_only, prefix_cache_under_preemption,
    no_prefix_caching, watermark, chunked_prefill_off,
)
# Asynchronous scheduling changes what each of these forces: preemptions with a batch in flight (their
# tokens arrive stale), stops on a token not yet known (one step more), the max_tokens and
# max_model_len caps of a placeholder, aborts in flight, prefix-cache blocks filled by a placeholder.
ASYNCHRONOUS = tuple(scheduled_asynchronously(f) for f in (
    chunked_prefill_small_budget, preemption_recompute, shared_system_prompt, priority_preemption, stop_tokens,
    n_samples, max_model_len_prompt, aborts, mixed_random, prefix_cache_under_preemption,
))
SCENARIOS = {f().name: f for f in (*SYNCHRONOUS, *ASYNCHRONOUS)}


def random_workload(seed: int) -> Scenario:
    """A workload no test uses: random prompt and output lengths (some behind a shared prefix, some
    arriving later, a few aborted), a small KV cache, a random budget and ``max_num_seqs``, and now
    and then the priority policy, a watermark or a long-prefill cap."""
    rng = random.Random(seed)
    num_blocks = rng.randint(20, 40)
    max_model_len = min(1024, (num_blocks - 1) * BLOCK_SIZE)
    prefix = _prompt(rng, rng.choice((32, 64, 96)))
    priority = rng.random() < 0.3
    reqs = []
    for _ in range(rng.randint(20, 32)):
        prompt = (prefix if rng.random() < 0.3 else []) + _prompt(rng, rng.randint(16, 400))
        arrive = 1 if rng.random() < 0.5 else rng.randint(2, 120)
        abort = arrive + rng.randint(1, 60) if rng.random() < 0.1 else None
        reqs.append(RequestSpec(prompt[:max_model_len - 1], rng.randint(8, 160), arrive_before_step=arrive,
                                abort_before_step=abort, priority=rng.randint(0, 3) if priority else 0))
    options = _options(max_num_batched_tokens=rng.choice((64, 128, 256)), max_num_seqs=rng.choice((4, 8, 16)),
                       num_gpu_blocks_override=num_blocks, max_model_len=max_model_len,
                       enable_prefix_caching=rng.random() < 0.8, scheduling_policy="priority" if priority else "fcfs",
                       watermark=0.05 if rng.random() < 0.3 else 0.0,
                       long_prefill_token_threshold=64 if rng.random() < 0.3 else 0)
    return Scenario(f"random_{seed}", f"a random workload (seed {seed}): {len(reqs)} requests, {num_blocks} blocks",
                    options, reqs)
