"""AsyncScheduler in isolation: step N + 1 scheduled before step N's tokens are back, as the engine core's
two-deep batch queue calls it (schedule, schedule, update, schedule, update, ...). vLLM's own behaviour
is checked against its recorded schedules (tests/parity, the ``*_async`` goldens); these pin the rules."""

from __future__ import annotations

import torch

from tracevllm.config import CacheConfig, SchedulerConfig
from tracevllm.core.sched.async_scheduler import AsyncScheduler
from tracevllm.core.sched.output import SchedulerOutput
from tracevllm.model_runner_output import ModelRunnerOutput, SamplerOutput
from tracevllm.request import RequestStatus

from tests.core.test_scheduler import EOS, make_request


def make_async_scheduler(num_blocks=100, block_size=16, budget=8192, max_model_len=1024) -> AsyncScheduler:
    cache = CacheConfig(block_size=block_size, enable_prefix_caching=True, num_gpu_blocks=num_blocks)
    sched = SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=budget, max_model_len=max_model_len,
                            async_scheduling=True)
    return AsyncScheduler(sched, cache)


class Batch:
    """One scheduled batch and the requests that sample in it (those given a placeholder)."""

    def __init__(self, scheduler: AsyncScheduler) -> None:
        before = {r: q.num_output_placeholders for r, q in scheduler.requests.items()}
        self.scheduler = scheduler
        self.out: SchedulerOutput = scheduler.schedule()
        self.sampling = [r for r in self.out.num_scheduled_tokens
                         if scheduler.requests[r].num_output_placeholders > before.get(r, 0)]

    def update(self, token_for=lambda req_id: 7):
        mro = ModelRunnerOutput(req_ids=list(self.out.num_scheduled_tokens), sampling_req_ids=self.sampling,
                                logits=None)
        sampled = SamplerOutput(torch.tensor([token_for(r) for r in self.sampling], dtype=torch.int64), None)
        return self.scheduler.update_from_output(self.out, mro, sampled)


def test_a_decode_is_scheduled_on_a_placeholder_before_its_token_is_back():
    s = make_async_scheduler()
    r = make_request(10)
    s.add_request(r)
    first = Batch(s)
    assert first.out.num_scheduled_tokens == {r.request_id: 10} and r.num_output_placeholders == 1
    second = Batch(s)  # the prompt's token is still in flight
    assert second.out.num_scheduled_tokens == {r.request_id: 1}
    assert second.out.scheduled_cached_reqs.num_computed_tokens == [10]
    assert r.num_computed_tokens == 11 and r.num_output_placeholders == 2 and r.num_tokens == 10
    first.update()
    assert r.num_tokens == 11 and r.num_output_placeholders == 1
    second.update()
    assert r.num_tokens == 12 and r.num_output_placeholders == 0


def test_a_prompt_chunk_takes_no_placeholder():
    s = make_async_scheduler(budget=16)
    r = make_request(40)
    s.add_request(r)
    first, second = Batch(s), Batch(s)
    assert [first.sampling, second.sampling] == [[], []] and r.num_output_placeholders == 0
    first.update()
    third = Batch(s)  # the last chunk samples
    assert third.out.num_scheduled_tokens == {r.request_id: 8} and third.sampling == [r.request_id]


def test_no_step_is_scheduled_for_a_token_sure_to_be_past_max_tokens():
    """max_tokens=2: the second token in flight is sure to be the last, so the third schedule leaves the
    request out, and it finishes with two tokens, by its length."""
    s = make_async_scheduler()
    r = make_request(10, max_tokens=2)
    s.add_request(r)
    first, second = Batch(s), Batch(s)
    first.update()
    third = Batch(s)
    assert r.request_id not in third.out.num_scheduled_tokens
    outputs = second.update()
    assert r.status == RequestStatus.FINISHED_LENGTH_CAPPED and r.num_output_tokens == 2
    assert [o.request_id for o in outputs.outputs] == [r.request_id]
    third.update()


def test_a_stop_on_a_token_not_yet_known_costs_one_step_whose_token_is_dropped():
    s = make_async_scheduler()
    r = make_request(10, max_tokens=16)
    s.add_request(r)
    first, second = Batch(s), Batch(s)
    assert second.out.num_scheduled_tokens == {r.request_id: 1}  # before EOS is known
    outputs = first.update(lambda _: EOS)
    assert r.status == RequestStatus.FINISHED_STOPPED and outputs.outputs[0].new_token_ids == [EOS]
    assert s.kv_cache_manager.num_free_blocks == 99  # freed at once: only the null block is not free
    assert second.update().outputs == []  # the step scheduled on its placeholder: thrown away
    assert r.num_output_tokens == 1 and not s.has_unfinished_requests() and s.num_in_flight == {}


def test_a_request_preempted_in_flight_keeps_its_token_and_recomputes_it():
    """Two requests fill a cache of 3 usable blocks of 16 tokens; the second's next token needs a
    fourth block while the first batch is in flight, and it is preempted (the newest). Its token from
    that batch still arrives, stale: appended, no placeholder taken back; later it resumes with it."""
    s = make_async_scheduler(num_blocks=4, budget=64, max_model_len=48)
    a, b = make_request(16, max_tokens=20), make_request(16, max_tokens=20)
    s.add_request(a)
    s.add_request(b)
    first = Batch(s)
    assert set(first.out.num_scheduled_tokens) == {a.request_id, b.request_id}
    second = Batch(s)  # a needs a second block (token 17) and takes the last free one; b's preempted
    assert second.out.preempted_req_ids == {b.request_id} and b.status == RequestStatus.PREEMPTED
    assert b.num_output_placeholders == 0 and s.num_in_flight[b.request_id] == 1
    first.update()
    assert b.num_output_tokens == 1 and b.num_output_placeholders == 0 and b.request_id not in s.num_in_flight
    assert a.num_output_tokens == 1 and a.num_output_placeholders == 1
