"""A request's timing record, and what one front-end iteration learned from the engine core.

``RequestStateStats`` is the one per-request record (as in vLLM): the OutputProcessor keeps one per
engine-core request and feeds it every output; ``RequestOutput.metrics`` is that record, the
Prometheus histograms read it when the request finishes, and the request tracer draws the
``llm_request`` span and its phases from it. Times are wall-clock (``time.time()``): the queued and
scheduled times come from the engine core's events, the token times from the front end::

    arrival ── queued ── scheduled ── first token ── … ── last token ── finished
              └ queue time ┘└─ prefill ─┘└──── decode (inter-token latencies) ────┘
    └──────── time to first token ───────┘
    └───────────────────────────── e2e latency ─────────────────────────┘

The mean time per output token (TPOT) is the decode time over the tokens after the first.

``IterationStats`` gathers one ``EngineCoreOutputs``' worth of token counts and latencies for the
stat loggers (``loggers.py``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from tracevllm.core.events import RequestPreempted, RequestQueued, RequestResumed, RequestScheduled
from tracevllm.engine import EngineCoreOutput


@dataclass(slots=True)
class RequestStateStats:
    arrival_time: float  # the front end received the request
    queued_ts: float = 0.0  # the engine core queued it
    scheduled_ts: float = 0.0  # first scheduled
    first_token_ts: float = 0.0
    last_token_ts: float = 0.0
    finished_ts: float = 0.0
    first_token_latency: float = 0.0  # TTFT: arrival to first token
    num_generation_tokens: int = 0
    num_preemptions: int = 0
    detokenize_time: float = 0.0  # seconds spent turning its tokens into text (stop strings included)

    def update_from_output(self, output: EngineCoreOutput, now: float) -> float | None:
        """Take in one output received at ``now``. Returns the latency its tokens add (TTFT for
        the first, else the inter-token latency), or None for an output without tokens."""
        for event in output.events or ():
            if isinstance(event, RequestQueued):
                self.queued_ts = event.timestamp
            elif isinstance(event, RequestScheduled) and not isinstance(event, RequestResumed):
                self.scheduled_ts = self.scheduled_ts or event.timestamp
            elif isinstance(event, RequestPreempted):
                self.num_preemptions += 1
        if not output.new_token_ids:
            return None
        if self.num_generation_tokens == 0:
            self.first_token_ts = now
            latency = self.first_token_latency = now - self.arrival_time
        else:
            latency = now - self.last_token_ts
        self.num_generation_tokens += len(output.new_token_ids)
        self.last_token_ts = now
        return latency

    @property
    def queued_time(self) -> float:
        return self.scheduled_ts - self.queued_ts if self.scheduled_ts and self.queued_ts else 0.0

    @property
    def prefill_time(self) -> float:
        return self.first_token_ts - self.scheduled_ts if self.first_token_ts and self.scheduled_ts else 0.0

    @property
    def decode_time(self) -> float:
        return self.last_token_ts - self.first_token_ts if self.first_token_ts else 0.0

    @property
    def inference_time(self) -> float:
        return self.last_token_ts - self.scheduled_ts if self.last_token_ts and self.scheduled_ts else 0.0

    @property
    def e2e_latency(self) -> float:
        return (self.finished_ts or time.time()) - self.arrival_time

    @property
    def mean_time_per_output_token(self) -> float:
        """The decode time over the tokens after the first; 0 (as in vLLM) when there is none."""
        return self.decode_time / (self.num_generation_tokens - 1) if self.num_generation_tokens > 1 else 0.0


@dataclass(slots=True)
class FinishedRequestStats:
    """What the stat loggers learn of a request when it finishes: every per-request histogram, the
    ``vllm:*`` ones and the ``gen_ai.server.*`` ones alike, reads its value here."""

    finish_reason: str
    operation_name: str  # gen_ai.operation.name: "chat" or "text_completion"
    e2e_latency: float
    first_token_latency: float  # TTFT; 0 if the request finished without a token
    num_prompt_tokens: int
    num_generation_tokens: int
    queued_time: float
    prefill_time: float
    decode_time: float
    mean_time_per_output_token: float


@dataclass
class IterationStats:
    """Counts and latencies observed while processing one batch of engine-core outputs."""

    iteration_timestamp: float = field(default_factory=time.time)
    num_prompt_tokens: int = 0
    num_generation_tokens: int = 0
    time_to_first_tokens_iter: list[float] = field(default_factory=list)
    inter_token_latencies_iter: list[float] = field(default_factory=list)
    finished_requests: list[FinishedRequestStats] = field(default_factory=list)

    def update_from_output(self, output: EngineCoreOutput, num_prompt_tokens: int,
                           req_stats: RequestStateStats) -> None:
        """Feed ``output`` to the request's record and count what it brought."""
        first = req_stats.num_generation_tokens == 0
        latency = req_stats.update_from_output(output, self.iteration_timestamp)
        if latency is None:
            return
        self.num_generation_tokens += len(output.new_token_ids)
        if first:  # the prompt's prefill just finished
            self.num_prompt_tokens += num_prompt_tokens
            self.time_to_first_tokens_iter.append(latency)
        else:
            self.inter_token_latencies_iter.append(latency)

    def update_from_finished_request(self, finish_reason: str, num_prompt_tokens: int,
                                     req_stats: RequestStateStats, operation_name: str) -> None:
        s = req_stats
        self.finished_requests.append(FinishedRequestStats(
            finish_reason=finish_reason, operation_name=operation_name, e2e_latency=s.e2e_latency,
            first_token_latency=s.first_token_latency, num_prompt_tokens=num_prompt_tokens,
            num_generation_tokens=s.num_generation_tokens, queued_time=s.queued_time, prefill_time=s.prefill_time,
            decode_time=s.decode_time, mean_time_per_output_token=s.mean_time_per_output_token,
        ))
