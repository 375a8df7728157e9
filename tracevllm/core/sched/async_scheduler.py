"""AsyncScheduler: schedules step N+1 before step N's sampled tokens are back (vLLM's default).

With asynchronous scheduling (``async_scheduling``) the engine core keeps two batches in flight
(``EngineCore.step_with_batch_queue``): it schedules the next batch, and sends it to the model, before
it applies the previous batch's output. A decoding request is then one token behind a token nobody
knows yet. The scheduler counts that token as an *output placeholder*::

    after step N is scheduled    num_computed_tokens = p + 1, num_output_placeholders = 1
                                 (p prompt and output tokens known, the (p + 1)-th being sampled)
    step N + 1 is scheduled      the request is one token behind (p + 1 + 1 - (p + 1)): it decodes
                                 the placeholder's position; the model runner, which sampled the
                                 token itself, knows its id
    step N's output arrives      the token is appended; one placeholder fewer

Two consequences a learner can see in the trace:
- a request that reaches ``max_tokens`` with its token still in flight is not scheduled again (it is
  sure to stop), but one that stops on EOS or a stop token has one more step scheduled, whose token
  is thrown away;
- the outputs of a step leave the engine core one call later, with the next step's forward before
  them.

A request preempted while a batch of its is in flight gets that batch's token all the same (it was
sampled from the right KV); the token no longer fills a placeholder: the output is *stale*
(``Scheduler._preempt`` drops the placeholders; the request waits to be admitted again until none of
its batches is in flight). Everything else is the synchronous ``Scheduler``'s.
"""

from __future__ import annotations

from tracevllm.core.sched.output import SchedulerOutput
from tracevllm.core.sched.scheduler import Scheduler
from tracevllm.request import Request


class AsyncScheduler(Scheduler):
    """``Scheduler`` with output placeholders: the tokens scheduled to be sampled and not yet back."""

    def _num_new_tokens(self, request: Request) -> int:
        """The placeholders count as tokens the request has. None is scheduled when the token in
        flight is sure to be the request's last (its ``max_tokens``), and no position past
        ``max_model_len`` is."""
        if (request.num_output_placeholders > 0
                and request.num_computed_tokens + 2 - request.num_output_placeholders
                >= request.num_prompt_tokens + request.max_tokens):
            return 0
        num_tokens = min(request.num_tokens + request.num_output_placeholders, self.max_model_len - 1)
        return num_tokens - request.num_computed_tokens

    def schedule(self) -> SchedulerOutput:
        """The synchronous schedule, then a placeholder for each request whose scheduled tokens
        reach the end of what it has (it samples): not for a prompt's earlier chunks."""
        scheduler_output = super().schedule()
        for req_id in scheduler_output.num_scheduled_tokens:
            request = self.requests[req_id]
            if request.num_computed_tokens >= request.num_tokens + request.num_output_placeholders:
                request.num_output_placeholders += 1
        return scheduler_output

    def _update_request_with_output(self, request: Request, new_token_ids: list[int], is_stale: bool) -> bool:
        """The token fills its placeholder, and the blocks it completes join the prefix cache now that
        their tokens are known. A stale token (its request preempted since) had neither left."""
        stopped = super()._update_request_with_output(request, new_token_ids, is_stale)
        if not is_stale:
            request.num_output_placeholders -= len(new_token_ids)
            assert request.num_output_placeholders >= 0
            if self.enable_caching:
                self.kv_cache_manager.cache_blocks(request,
                                                   request.num_computed_tokens - request.num_output_placeholders)
        return stopped
