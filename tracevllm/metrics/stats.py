"""What one front-end iteration learned about request timing, and the per-request state behind it.

The front end (OutputProcessor) fills an ``IterationStats`` for each ``EngineCoreOutputs`` it
processes; the stat loggers turn those, with the engine core's ``SchedulerStats``, into log lines
and Prometheus metrics. Times are wall-clock (``time.time()``): the QUEUED/SCHEDULED events come
from the engine core's process, the token times from the front end's.

    arrival ── queued ── scheduled ── first token ── … ── last token ── finished
              └ queue time ┘└─ prefill ─┘└──── decode (inter-token latencies) ────┘
    └──────── time to first token ───────┘
    └───────────────────────────── e2e latency ─────────────────────────┘
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from tracevllm.engine import EngineCoreEventType, EngineCoreOutput


@dataclass(slots=True)
class RequestStateStats:
    """Timing of one engine-core request, kept by the front end while it runs."""

    arrival_time: float
    queued_ts: float = 0.0
    scheduled_ts: float = 0.0
    first_token_ts: float = 0.0
    last_token_ts: float = 0.0
    num_generation_tokens: int = 0


@dataclass(slots=True)
class FinishedRequestStats:
    finish_reason: str
    e2e_latency: float
    num_prompt_tokens: int
    num_generation_tokens: int
    queued_time: float
    prefill_time: float
    decode_time: float


@dataclass
class IterationStats:
    """Counts and latencies observed while processing one batch of engine-core outputs."""

    iteration_timestamp: float = field(default_factory=time.time)
    num_prompt_tokens: int = 0
    num_generation_tokens: int = 0
    time_to_first_tokens_iter: list[float] = field(default_factory=list)
    inter_token_latencies_iter: list[float] = field(default_factory=list)
    finished_requests: list[FinishedRequestStats] = field(default_factory=list)

    def update_from_output(self, output: EngineCoreOutput, num_prompt_tokens: int, req_stats: RequestStateStats) -> None:
        now = self.iteration_timestamp
        for event in output.events or []:
            if event.type == EngineCoreEventType.QUEUED and not req_stats.queued_ts:
                req_stats.queued_ts = event.timestamp
            elif event.type == EngineCoreEventType.SCHEDULED and not req_stats.scheduled_ts:
                req_stats.scheduled_ts = event.timestamp
        num_new = len(output.new_token_ids)
        if not num_new:
            return
        self.num_generation_tokens += num_new
        if req_stats.num_generation_tokens == 0:  # the prompt's prefill just finished
            self.num_prompt_tokens += num_prompt_tokens
            self.time_to_first_tokens_iter.append(now - req_stats.arrival_time)
            req_stats.first_token_ts = now
        else:
            self.inter_token_latencies_iter.append(now - req_stats.last_token_ts)
        req_stats.num_generation_tokens += num_new
        req_stats.last_token_ts = now

    def update_from_finished_request(self, finish_reason: str, num_prompt_tokens: int, req_stats: RequestStateStats) -> None:
        s = req_stats
        first_token = s.first_token_ts or self.iteration_timestamp
        self.finished_requests.append(FinishedRequestStats(
            finish_reason=finish_reason,
            e2e_latency=self.iteration_timestamp - s.arrival_time,
            num_prompt_tokens=num_prompt_tokens,
            num_generation_tokens=s.num_generation_tokens,
            queued_time=(s.scheduled_ts - s.queued_ts) if s.scheduled_ts and s.queued_ts else 0.0,
            prefill_time=(first_token - s.scheduled_ts) if s.scheduled_ts else 0.0,
            decode_time=(s.last_token_ts - first_token) if s.last_token_ts else 0.0,
        ))
