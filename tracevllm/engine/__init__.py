"""Messages between the front end (LLMEngine / AsyncLLM) and the EngineCore.

They are ``msgspec.Struct``s so that the same objects can later cross a process boundary encoded as
msgpack, exactly as in vLLM V1 (``vllm/v1/engine/__init__.py``).
"""

from __future__ import annotations

import enum

import msgspec

from tracevllm.core.events import RequestEvent
from tracevllm.sampling_params import SamplingParams


class FinishReason(enum.IntEnum):
    """Why a request stopped. ``str()`` gives the OpenAI spelling."""

    STOP = 0  # EOS, a stop token id or a stop string
    LENGTH = 1  # max_tokens or max_model_len reached
    ABORT = 2  # aborted by the client
    ERROR = 3  # failed in the engine (refused, or no valid distribution to sample from); others go on

    def __str__(self) -> str:
        return self.name.lower()


class EngineCoreRequestType(enum.Enum):
    """The first frame of every message from a client to a background engine core."""

    ADD = b"\x00"  # payload: an EngineCoreRequest
    ABORT = b"\x01"  # payload: a FinishRequests
    PUBLISH_EVENTS = b"\x02"  # payload: a PublishEvents


class EngineCoreRequest(msgspec.Struct, array_like=True, omit_defaults=True):
    """One request as the front end hands it to the engine core: already tokenized and validated."""

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    eos_token_id: int | None
    arrival_time: float
    priority: int = 0
    # W3C trace context (``traceparent``) of the request's root span, so that the engine core's spans
    # join the request's trace, in this process or another.
    trace_headers: dict[str, str] | None = None


class FinishRequests(msgspec.Struct, array_like=True):
    """Requests the front end ends: aborted (``ABORT``: the client left or cancelled), or stopped by
    a stop string, which only the front end sees on the text (``STOP``)."""

    request_ids: list[str]
    finish_reason: FinishReason = FinishReason.ABORT


class PublishEvents(msgspec.Struct, array_like=True):
    """Start (``address``: the client's bound events socket) or stop (None) publishing the engine core's
    events to the client (``engine/event_publisher.py``); each start opens a new ``session``, whose
    number tags every message it sends, so that the client can tell them from a previous session's.
    The open session's number again asks for a snapshot of the engine (a stream client joined)."""

    address: str | None
    session: int = 0


class LogprobsLists(msgspec.Struct, array_like=True):
    """Logprobs of sampled positions, one row per position.

    Row ``i``: ``logprob_token_ids[i][0]`` is the sampled token and ``logprobs[i][0]`` its logprob;
    the rest of the row is the top-``k`` tokens by logprob. ``sampled_token_ranks[i]`` is the sampled
    token's rank among all tokens (1 = most likely). For prompt logprobs, "sampled" is the prompt's
    own token at position ``i + 1``.
    """

    logprob_token_ids: list[list[int]]
    logprobs: list[list[float]]
    sampled_token_ranks: list[int]

    def slice(self, start: int, end: int) -> "LogprobsLists":
        return LogprobsLists(
            self.logprob_token_ids[start:end], self.logprobs[start:end], self.sampled_token_ranks[start:end]
        )


class EngineCoreOutput(msgspec.Struct, array_like=True, omit_defaults=True):
    """What one step produced for one request: only the new tokens (a diff)."""

    request_id: str
    new_token_ids: list[int]
    new_logprobs: LogprobsLists | None = None
    finish_reason: FinishReason | None = None
    stop_reason: int | str | None = None
    events: list[RequestEvent] | None = None  # the request's state changes since its last output
    num_cached_tokens: int = 0
    # With the first token, for a request that asked for prompt_logprobs: the whole prompt's.
    new_prompt_logprobs: LogprobsLists | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class SchedulerStats(msgspec.Struct, array_like=True):
    """The scheduler's gauges after a step (for logging and metrics)."""

    num_running_reqs: int = 0
    num_waiting_reqs: int = 0
    kv_cache_usage: float = 0.0
    prefix_cache_queries: int = 0  # tokens looked up since the last stats
    prefix_cache_hits: int = 0  # of which found cached
    num_preemptions: int = 0  # since the last stats
    # Why the waiting requests wait after the last schedule() (core/events.py's WaitingReason: count).
    num_waiting_reqs_by_reason: dict[str, int] = {}


class EngineCoreOutputs(msgspec.Struct, array_like=True, omit_defaults=True):
    """Everything one ``EngineCore.step()`` sends back to the front end."""

    outputs: list[EngineCoreOutput] = []
    scheduler_stats: SchedulerStats | None = None
    timestamp: float = 0.0


class EngineCoreReadyResponse(msgspec.Struct, array_like=True):
    """What a background engine core reports once its model is loaded and its KV cache sized."""

    num_gpu_blocks: int
    max_model_len: int
    max_num_batched_tokens: int  # as the engine core runs it: fitted to the machine at start-up on a CPU
