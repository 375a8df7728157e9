"""The workload a trace carries: each engine-core request as it was submitted, and what it produced.

``load_workload(trace)`` reads it back from the ``scheduler.request`` spans (at either trace level)
and their ``llm_request`` roots, so that a replay can submit the same requests again to a
``Scheduler`` under another configuration (``tracevllm traces whatif``, ``tracevllm/whatif/``)::

    RecordedRequest("0_7", parent_request_id="7", n=2, arrival=1.25, queued=1.26,
                    num_prompt_tokens=38, block_size=16, prompt_block_hashes=("9f2c…", "41d0…"),
                    max_tokens=64, min_tokens=0, ignore_eos=False, prompt_logprobs=False, priority=0,
                    num_output_tokens=64, finish_reason="length")

No tokens are recorded (the text only with ``--trace-include-text``, on ``llm_request``), yet the
prefix cache can be replayed: the hashes chain as the engine chains them (``hash(block i) =
sha256(hash(block i-1), tokens of block i)``), so two requests share their first k hashes exactly when
they share their first k blocks of tokens. So ``stand_in_prompts`` gives each distinct hash a block of
tokens of its own, and a replay at the recorded block size that submits them sees the same hits; at
a multiple of it, block j is identified by recorded hash ``(j + 1) * multiple - 1``, which covers the
whole prefix.

Only traces of format 2 or later carry the workload (``schema.TRACE_FORMAT``, ``WORKLOAD_FORMAT``); older
ones are refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tracevllm.tracing.schema import Attr, SpanName
from viz.model import Trace

WORKLOAD_KEYS = (Attr.REQUEST_BLOCK_SIZE, Attr.PROMPT_BLOCK_HASHES, Attr.MAX_TOKENS, Attr.MIN_TOKENS,
                 Attr.IGNORE_EOS, Attr.PROMPT_LOGPROBS)
WORKLOAD_FORMAT = 2  # the first trace format (``schema.TRACE_FORMAT``) whose requests carry their workload


@dataclass(frozen=True, slots=True)
class RecordedRequest:
    """One engine-core request (a sample, when its user request asked for ``n`` > 1): what was
    submitted (times in seconds since the trace's t0, as on ``viz.model.Request``) and what it
    produced. ``finish_reason`` is None for a request the trace ended before it finished."""

    request_id: str
    parent_request_id: str  # the user's request: its n samples share it, and their prompt
    n: int
    arrival: float  # at the front end (its llm_request's start)
    queued: float  # in the engine core's scheduler
    num_prompt_tokens: int
    block_size: int  # of the hashes
    prompt_block_hashes: tuple[str, ...]  # hex, one per full block of the prompt
    max_tokens: int
    min_tokens: int
    ignore_eos: bool
    prompt_logprobs: bool  # it asked for prompt logprobs, so it skipped the prefix cache
    priority: int
    num_output_tokens: int
    finish_reason: str | None


def load_workload(trace: Trace) -> list[RecordedRequest]:
    """Every engine-core request of ``trace``, in arrival order. ValueError, saying so, for a trace
    recorded before traces carried their workload, or one without the engine core's spans."""
    if trace.trace_format < WORKLOAD_FORMAT:
        raise ValueError(
            f"{trace.directory}: this trace was recorded before traces carried their workload (trace format "
            f"{trace.trace_format}, a replay needs {WORKLOAD_FORMAT} or later: the prompts' block hashes and the "
            f"sampling parameters); record the run again with this version of tracevllm")
    spans = {s.attributes[Attr.REQUEST_ID]: s for s in trace.spans if s.name == SpanName.SCHEDULER_REQUEST}
    if not spans:
        raise ValueError(f"{trace.directory}: no {SpanName.SCHEDULER_REQUEST} spans: the engine core's trace "
                         "file is missing")
    workload = []
    for request in trace.requests.values():
        a = spans[request.request_id].attributes
        if missing := [key for key in WORKLOAD_KEYS if key not in a]:
            raise ValueError(f"{trace.directory}: request {request.request_id!r} lacks {', '.join(missing)}")
        workload.append(RecordedRequest(
            request.request_id, request.parent_request_id or request.request_id, request.n, request.arrival,
            request.queued, request.num_prompt_tokens, a[Attr.REQUEST_BLOCK_SIZE],
            tuple(a[Attr.PROMPT_BLOCK_HASHES]), a[Attr.MAX_TOKENS], a[Attr.MIN_TOKENS], a[Attr.IGNORE_EOS],
            a[Attr.PROMPT_LOGPROBS], a.get(Attr.PRIORITY, 0), request.num_output_tokens, request.finish_reason,
        ))
    return workload


def stand_in_prompts(workload: Sequence[RecordedRequest]) -> dict[str, list[int]]:
    """Token ids for each request's prompt that hash as the recorded prompts did: block i is
    ``block_size`` copies of a number (from 1) given to its recorded hash, so that, the hashes being
    chained, two stand-ins share their first k block hashes exactly when the recorded prompts did.
    The tokens after the last full block were not recorded (nothing hashed them): they are a negative
    number of the user request's own, so that at a smaller block size, where they fill blocks, they hit
    the cache only for the request's own samples (``n`` > 1)."""
    numbers: dict[str, int] = {}
    tails: dict[str, int] = {}
    prompts = {}
    for r in workload:
        tokens: list[int] = []
        for block_hash in r.prompt_block_hashes:
            tokens += [numbers.setdefault(block_hash, len(numbers) + 1)] * r.block_size
        tail = tails.setdefault(r.parent_request_id, -len(tails) - 1)
        prompts[r.request_id] = tokens + [tail] * (r.num_prompt_tokens - len(tokens))
    return prompts
