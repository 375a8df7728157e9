"""The Scheduler in isolation (no model), in the spirit of vLLM's tests/v1/core/sched/test_scheduler.py."""

from __future__ import annotations

import itertools

import pytest
import torch

from tracevllm.config import CacheConfig, SchedulerConfig
from tracevllm.core.sched.scheduler import Scheduler
from tracevllm.core.events import RequestFinished, RequestPreempted
from tracevllm.engine import FinishReason
from tracevllm.request import Request, RequestStatus
from tracevllm.sampling_params import SamplingParams
from tracevllm.model_runner_output import ModelRunnerOutput, SamplerOutput

EOS = 2
_ids = itertools.count()


def make_scheduler(num_blocks=100, block_size=16, max_num_seqs=16, budget=8192, max_model_len=1024,
                   policy="fcfs", chunked=True, caching=True, long_prefill=0) -> Scheduler:
    cache = CacheConfig(block_size=block_size, enable_prefix_caching=caching, num_gpu_blocks=num_blocks)
    sched = SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=budget, max_model_len=max_model_len,
                            policy=policy, enable_chunked_prefill=chunked, long_prefill_token_threshold=long_prefill)
    return Scheduler(sched, cache)


def make_request(prompt_len=None, prompt=None, priority=0, arrival=None, **params) -> Request:
    i = next(_ids)
    prompt = prompt if prompt is not None else [100 + (i * 7 + j) % 5000 for j in range(prompt_len)]
    params.setdefault("max_tokens", 16)
    return Request(f"req-{i}", list(prompt), SamplingParams(**params), EOS,
                   arrival_time=float(i) if arrival is None else arrival, priority=priority)


def run_step(scheduler: Scheduler, token_for=lambda req_id: 7):
    """schedule() and a fake model step: every request that caught up samples ``token_for(id)``."""
    out = scheduler.schedule()
    sampling = [r for r in out.num_scheduled_tokens
                if scheduler.requests[r].num_computed_tokens == scheduler.requests[r].num_tokens]
    mro = ModelRunnerOutput(req_ids=list(out.num_scheduled_tokens), sampling_req_ids=sampling, logits=None)
    sampled = SamplerOutput(torch.tensor([token_for(r) for r in sampling], dtype=torch.int64), None)
    return out, scheduler.update_from_output(out, mro, sampled)


def test_token_budget_chunks_prefill_and_mixes_with_decode():
    s = make_scheduler(budget=128)
    reqs = [make_request(100) for _ in range(3)]
    for r in reqs:
        s.add_request(r)
    out, outputs = run_step(s)
    assert out.num_scheduled_tokens == {reqs[0].request_id: 100, reqs[1].request_id: 28}
    assert [o.request_id for o in outputs.outputs] == [reqs[0].request_id]  # req1 is mid-prompt
    assert len(out.scheduled_new_reqs) == 2 and len(s.waiting) == 1

    out, _ = run_step(s)
    # Running requests first (req0 decodes one token, req1 finishes its prompt), then the waiting one.
    assert out.num_scheduled_tokens == {reqs[0].request_id: 1, reqs[1].request_id: 72, reqs[2].request_id: 55}
    assert out.total_num_scheduled_tokens == 128
    cached = out.scheduled_cached_reqs
    assert cached.req_ids == [reqs[0].request_id, reqs[1].request_id]
    assert cached.num_computed_tokens == [100, 28]
    assert [n.req_id for n in out.scheduled_new_reqs] == [reqs[2].request_id]


def test_long_prefill_token_threshold_cuts_long_prompts_into_chunks():
    """vLLM's long_prefill_token_threshold: a request with more tokens to compute than the threshold
    computes that many a step, leaving the rest of the budget to the others; a short one is not cut."""
    s = make_scheduler(budget=128, long_prefill=32)
    long_a, long_b, short = make_request(100), make_request(100), make_request(10)
    for r in (long_a, long_b, short):
        s.add_request(r)
    out, _ = run_step(s)
    assert out.num_scheduled_tokens == {long_a.request_id: 32, long_b.request_id: 32, short.request_id: 10}
    out, _ = run_step(s)  # the short one decodes; the long ones go on, 32 at a time
    assert out.num_scheduled_tokens == {long_a.request_id: 32, long_b.request_id: 32, short.request_id: 1}
    with pytest.raises(ValueError, match="long_prefill_token_threshold must be >= 0"):
        make_scheduler(long_prefill=-1)
    with pytest.raises(ValueError, match="it needs enable_chunked_prefill"):
        make_scheduler(long_prefill=32, chunked=False)


def test_max_num_seqs_caps_running():
    s = make_scheduler(max_num_seqs=2)
    for _ in range(3):
        s.add_request(make_request(10))
    out, _ = run_step(s)
    assert len(out.num_scheduled_tokens) == 2 and len(s.waiting) == 1


def test_without_chunked_prefill_a_prompt_over_budget_waits():
    s = make_scheduler(budget=64, max_model_len=64, chunked=False)  # chunked prefill off: budget >= max_model_len
    big, small = make_request(60), make_request(10)  # big: more than the 54 tokens that small leaves
    s.add_request(small)
    s.add_request(big)
    out, _ = run_step(s)
    assert out.num_scheduled_tokens == {small.request_id: 10}


def test_stop_conditions():
    s = make_scheduler()
    eos = make_request(5, max_tokens=10)
    ignore = make_request(5, max_tokens=3, ignore_eos=True)
    stop_tok = make_request(5, max_tokens=10, stop_token_ids=[9])
    for r in (eos, ignore, stop_tok):
        s.add_request(r)
    tokens = {eos.request_id: EOS, ignore.request_id: EOS, stop_tok.request_id: 9}
    _, outputs = run_step(s, lambda r: tokens[r])
    finished = {o.request_id: (o.finish_reason, o.stop_reason) for o in outputs.outputs if o.finished}
    assert finished == {eos.request_id: (FinishReason.STOP, None), stop_tok.request_id: (FinishReason.STOP, 9)}
    run_step(s, lambda r: tokens[r])
    _, outputs = run_step(s, lambda r: tokens[r])
    finished = {o.request_id: o.finish_reason for o in outputs.outputs if o.finished}
    assert finished == {ignore.request_id: FinishReason.LENGTH}
    assert eos.output_token_ids == [EOS]  # the EOS stays in the output, as in vLLM


def test_a_stop_token_at_max_model_len_is_a_stop():
    """vLLM's order: EOS and stop tokens before the length (max_tokens, max_model_len)."""
    s = make_scheduler(max_model_len=12)
    r = make_request(11, max_tokens=100, stop_token_ids=[9])
    s.add_request(r)
    _, outputs = run_step(s, lambda _: 9)
    assert r.num_tokens == 12 and (outputs.outputs[0].finish_reason, r.stop_reason) == (FinishReason.STOP, 9)


def test_max_model_len_caps_generation():
    s = make_scheduler(max_model_len=12)
    r = make_request(10, max_tokens=100)
    s.add_request(r)
    for _ in range(3):
        run_step(s)
    assert r.status == RequestStatus.FINISHED_LENGTH_CAPPED and r.num_tokens == 12


def test_preemption_recomputes_newest_and_resumes_first():
    # 6 blocks of 4 tokens (7 with the null block); three 8-token prompts fill 2 blocks each, so the first
    # decode (position 8 needs a third block) must preempt the newest running request.
    s = make_scheduler(num_blocks=7, block_size=4, caching=False)
    reqs = [make_request(8, max_tokens=5) for _ in range(3)]
    for r in reqs:
        s.add_request(r)
    run_step(s)
    out, _ = run_step(s)
    assert out.preempted_req_ids == {reqs[2].request_id}
    assert reqs[2].status == RequestStatus.PREEMPTED and reqs[2].num_computed_tokens == 0
    assert s.waiting.peek_request() is reqs[2]
    assert any(isinstance(e, RequestPreempted) for e in reqs[2].events)
    resumed = 0
    while s.has_unfinished_requests():
        out, _ = run_step(s)
        cached = out.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            if cached.resumed_from_preemption[i]:
                # Resumed: everything (prompt + generated) is recomputed into a fresh block list.
                resumed += 1
                n = out.num_scheduled_tokens[req_id]
                assert cached.num_computed_tokens[i] == 0 and n > 8
                assert len(cached.new_block_ids[i]) == -(-n // 4)
    assert resumed >= 1
    assert all(r.num_output_tokens == 5 for r in reqs)
    assert s.kv_cache_manager.num_free_blocks == 6


def test_prefix_cache_hit_never_covers_the_last_prompt_token():
    s = make_scheduler(block_size=16)
    prompt = list(range(1000, 1064))  # exactly 4 blocks
    first = make_request(prompt=prompt)
    s.add_request(first)
    run_step(s)
    second, third = make_request(prompt=prompt), make_request(prompt=prompt[:40] + [5, 6, 7])
    s.add_request(second)
    s.add_request(third)
    out, _ = run_step(s)
    assert out.num_scheduled_tokens[second.request_id] == 16  # 3 blocks hit, the last block recomputed
    assert second.num_cached_tokens == 48
    assert third.num_cached_tokens == 32
    new = {n.req_id: n for n in out.scheduled_new_reqs}
    assert new[second.request_id].block_ids[:3] == s.kv_cache_manager.get_block_ids(first.request_id)[:3]


def test_abort_frees_blocks_in_waiting_and_running():
    s = make_scheduler(num_blocks=20, max_num_seqs=1)
    running, waiting = make_request(40), make_request(40)
    s.add_request(running)
    s.add_request(waiting)
    run_step(s)
    s.finish_requests([running.request_id, waiting.request_id], RequestStatus.FINISHED_ABORTED)
    assert not s.has_unfinished_requests()
    assert s.kv_cache_manager.num_free_blocks == 20 - 1  # every block but the null block
    out = s.schedule()
    assert out.finished_req_ids == {running.request_id, waiting.request_id}


def test_priority_policy_orders_waiting_and_preempts_lowest_priority():
    s = make_scheduler(policy="priority", max_num_seqs=1)
    low, high = make_request(5, priority=5), make_request(5, priority=0)
    s.add_request(low)
    s.add_request(high)
    out, _ = run_step(s)
    assert list(out.num_scheduled_tokens) == [high.request_id]

    s = make_scheduler(policy="priority", num_blocks=5, block_size=4, caching=False)  # 4 blocks and the null block
    a, b = make_request(8, priority=0, max_tokens=3), make_request(8, priority=9, max_tokens=3)
    s.add_request(b)
    s.add_request(a)
    run_step(s)
    out, _ = run_step(s)  # a needs a third block: b (priority 9) is the victim, though it is not the newest
    assert out.preempted_req_ids == {b.request_id}


def test_stats_and_every_block_back_after_all_finish():
    s = make_scheduler(num_blocks=50)
    reqs = [make_request(30, max_tokens=4) for _ in range(5)]
    for r in reqs:
        s.add_request(r)
    _, outputs = run_step(s)
    assert outputs.scheduler_stats.num_running_reqs == 5
    assert 0 < outputs.scheduler_stats.kv_cache_usage <= 1
    while s.has_unfinished_requests():
        run_step(s)
    assert s.kv_cache_manager.num_free_blocks == 50 - 1  # every block but the null block
    assert s.kv_cache_manager.usage == 0


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_random_workload_conserves_blocks(policy):
    import random

    rng = random.Random(0)
    s = make_scheduler(num_blocks=31, block_size=4, budget=32, max_num_seqs=6, policy=policy)  # 30 and the null block
    reqs = [make_request(rng.randint(1, 30), max_tokens=rng.randint(1, 12), priority=rng.randint(0, 3))
            for _ in range(25)]
    for r in reqs:
        s.add_request(r)
    for step in range(2000):
        if not s.has_unfinished_requests():
            break
        if step == 5:
            s.finish_requests(reqs[3].request_id, RequestStatus.FINISHED_ABORTED)
        run_step(s, lambda r: 11)
        used = sum(len(s.kv_cache_manager.get_block_ids(r)) for r in s.requests if s.requests[r].status == RequestStatus.RUNNING)
        assert used <= 30
    assert not s.has_unfinished_requests()
    assert s.kv_cache_manager.num_free_blocks == 30
    assert all(r.num_output_tokens == r.max_tokens for r in reqs if r is not reqs[3])


def test_a_failed_row_finishes_only_its_request_with_error():
    """Issue 27: a row the sampler could not sample (NaN logits) ends that request with ERROR, frees
    its blocks and tells the runner to forget it; the other request in the batch goes on."""
    s = make_scheduler(num_blocks=20)
    bad, good = make_request(40, max_tokens=4), make_request(40, max_tokens=4)
    s.add_request(bad)
    s.add_request(good)
    out = s.schedule()
    mro = ModelRunnerOutput(req_ids=list(out.num_scheduled_tokens), sampling_req_ids=[bad.request_id, good.request_id],
                            logits=None)
    sampled = SamplerOutput(torch.tensor([0, 7]), None, failed=torch.tensor([True, False]))
    outputs = {o.request_id: o for o in s.update_from_output(out, mro, sampled).outputs}

    failed = outputs[bad.request_id]
    assert failed.finish_reason == FinishReason.ERROR and str(failed.finish_reason) == "error"
    assert failed.new_token_ids == [] and "sampler" in failed.stop_reason
    assert bad.status == RequestStatus.FINISHED_ERROR and bad.output_token_ids == []
    assert [e.finish_reason for e in failed.events if isinstance(e, RequestFinished)] == ["error"]
    assert outputs[good.request_id].finish_reason is None and outputs[good.request_id].new_token_ids == [7]
    assert s.running == [good] and bad.request_id not in s.requests
    assert s.kv_cache_manager.num_free_blocks == 20 - 1 - 3  # only good's 3 blocks are held (and the null block)

    out, _ = run_step(s)
    assert out.finished_req_ids == {bad.request_id} and list(out.num_scheduled_tokens) == [good.request_id]
    while s.has_unfinished_requests():
        run_step(s)
    assert good.get_finished_reason() == FinishReason.LENGTH and good.num_output_tokens == 4
    assert s.kv_cache_manager.num_free_blocks == 20 - 1
