"""OutputProcessor: EngineCoreOutputs (token ids) in, RequestOutputs (text, logprobs, metrics) out.

It keeps one ``RequestState`` per engine-core request: its incremental detokenizer, logprobs and
timings. A user request with ``n > 1`` is fanned out into n engine-core requests (``"{i}_{id}"``)
that share one ``ParentRequest``, which gathers their CompletionOutputs into one RequestOutput.
Stop strings are found here, on text; the engine core never sees text, so those requests are
returned in ``reqs_to_abort`` for the caller to stop in the core. Each engine-core request keeps its
``RequestStateStats`` here; finished and aborted requests are handed back whole, for the observers
(stat loggers, the request tracer) to read.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from tracevllm.engine import EngineCoreOutput, EngineCoreRequest, FinishReason, LogprobsLists
from tracevllm.engine.detokenizer import IncrementalDetokenizer
from tracevllm.metrics.stats import IterationStats, RequestStateStats
from tracevllm.outputs import CompletionOutput, Logprob, PromptLogprobs, RequestOutput, SampleLogprobs
from tracevllm.sampling_params import RequestOutputKind, SamplingParams
from tracevllm.tracing.schema import GenAIValue


@dataclass
class ParentRequest:
    """One user request; ``children`` are its ``n`` engine-core requests (a single one when n = 1).

    ``messages``: the conversation, for a chat request (None for a completion)."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_time: float
    messages: list[dict] | None = None
    children: list["RequestState"] = field(default_factory=list)
    # Filled in by the first sample to bring them (every sample has the same prompt).
    prompt_logprobs: PromptLogprobs | None = None
    prompt_logprobs_sent: bool = False  # DELTA outputs carry them once
    # Samples that finished: a count, so that ``finished`` is O(1) per output rather than a scan of
    # all n samples (O(n^2) over a request with a large n).
    num_finished: int = 0

    @property
    def finished(self) -> bool:
        """Every one of the n samples finished (samples not yet registered have not)."""
        return self.num_finished == self.params.n

    @property
    def operation_name(self) -> str:
        """``gen_ai.operation.name``: a chat request has messages, a completion has none."""
        return GenAIValue.CHAT if self.messages is not None else GenAIValue.TEXT_COMPLETION


class RequestState:
    def __init__(self, request: EngineCoreRequest, parent: ParentRequest, index: int, tokenizer) -> None:
        self.request_id = request.request_id
        self.parent = parent
        self.index = index
        self.tokenizer = tokenizer
        self.detokenizer = IncrementalDetokenizer(tokenizer, request)
        params = request.sampling_params
        self.logprobs: SampleLogprobs | None = [] if params.logprobs is not None else None
        self.cumulative_logprob: float | None = 0.0 if params.logprobs is not None else None
        self.finish_reason: FinishReason | None = None
        self.stop_reason: int | str | None = None
        self.num_cached_tokens = 0
        self.sent_text_len = 0  # for DELTA outputs
        self.sent_num_tokens = 0
        self.stats = RequestStateStats(arrival_time=parent.arrival_time)

    def completion_output(self, delta: bool) -> CompletionOutput:
        text = self.detokenizer.get_output_text(finished=self.finish_reason is not None)
        token_ids, logprobs = self.detokenizer.token_ids, self.logprobs
        if delta:
            visible_len = len(text)
            text, token_ids = text[self.sent_text_len:], token_ids[self.sent_num_tokens:]
            logprobs = logprobs[self.sent_num_tokens:] if logprobs is not None else None
            self.sent_text_len, self.sent_num_tokens = visible_len, len(self.detokenizer.token_ids)
        return CompletionOutput(
            index=self.index,
            text=text,
            token_ids=list(token_ids),
            cumulative_logprob=self.cumulative_logprob,
            logprobs=logprobs,
            finish_reason=str(self.finish_reason) if self.finish_reason is not None else None,
            stop_reason=self.stop_reason,
        )

    def update_logprobs(self, output: EngineCoreOutput) -> None:
        if output.new_prompt_logprobs is not None and self.parent.prompt_logprobs is None:
            self.parent.prompt_logprobs = [None, *self._positions(output.new_prompt_logprobs)]
        if self.logprobs is None or output.new_logprobs is None:
            return
        for position, value in zip(self._positions(output.new_logprobs), output.new_logprobs.logprobs):
            self.logprobs.append(position)
            self.cumulative_logprob += value[0]

    def _positions(self, lp: LogprobsLists) -> list[dict[int, Logprob]]:
        """One dict per row: the row's own token (sampled, or the prompt's) with its rank, then the
        top-k not already in it. Without detokenize, no decoded_token (as in vLLM)."""
        decode = self.tokenizer.decode if self.detokenizer.detokenize else lambda ids: None
        positions = []
        for ids, values, rank in zip(lp.logprob_token_ids, lp.logprobs, lp.sampled_token_ranks):
            position = {ids[0]: Logprob(values[0], rank, decode([ids[0]]))}
            for top_rank, (tid, value) in enumerate(zip(ids[1:], values[1:]), start=1):
                position.setdefault(tid, Logprob(value, top_rank, decode([tid])))
            positions.append(position)
        return positions


class RequestOutputCollector:
    """AsyncLLM's mailbox for one request: the output handler puts, ``generate()`` gets.

    It holds only the newest output. If the consumer falls behind (a slow client), later outputs are
    folded into the one waiting (DELTA outputs concatenated, others replaced), so the producer never
    blocks and nothing is lost. An exception put here is raised by the next ``get()``.
    """

    def __init__(self, output_kind: RequestOutputKind) -> None:
        self.aggregate = output_kind == RequestOutputKind.DELTA
        import asyncio  # here: only AsyncLLM's requests have one (LLM and a what-if replay never load asyncio)

        self.output: RequestOutput | Exception | None = None
        self.ready = asyncio.Event()

    def put(self, output: RequestOutput | Exception) -> None:
        if self.output is None or isinstance(output, Exception):
            self.output = output
            self.ready.set()
        elif isinstance(self.output, RequestOutput):
            self.output.add(output, aggregate=self.aggregate)

    async def get(self) -> RequestOutput:
        while self.output is None:
            await self.ready.wait()
        output, self.output = self.output, None
        self.ready.clear()
        if isinstance(output, Exception):
            raise output
        return output


@dataclass
class OutputProcessorOutput:
    request_outputs: list[RequestOutput]
    reqs_to_abort: list[str]  # finished by a stop string: the engine core must stop them
    finished_requests: list[ParentRequest]  # every sample finished with this batch


class OutputProcessor:
    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.request_states: dict[str, RequestState] = {}
        self.parent_requests: dict[str, ParentRequest] = {}

    def has_unfinished_requests(self) -> bool:
        return bool(self.request_states)

    def get_num_unfinished_requests(self) -> int:
        return len(self.parent_requests)

    def add_request(self, request: EngineCoreRequest, parent: ParentRequest, index: int) -> None:
        self.parent_requests[parent.request_id] = parent
        state = RequestState(request, parent, index, self.tokenizer)
        parent.children.append(state)
        self.request_states[request.request_id] = state

    def abort_requests(self, request_ids: list[str], now: float | None = None) -> tuple[list[str], list[ParentRequest]]:
        """Forget the given user requests, aborted ``now`` (default: the wall clock; a what-if replay's
        simulated clock). Returns their engine-core request ids still running (to abort in the core)
        and the aborted requests."""
        to_abort, aborted = [], []
        now = time.time() if now is None else now
        for req_id in request_ids:
            parent = self.parent_requests.pop(req_id, None)
            if parent is None:
                continue
            aborted.append(parent)
            for child in parent.children:
                if self.request_states.pop(child.request_id, None) is not None:
                    to_abort.append(child.request_id)
                    child.finish_reason = FinishReason.ABORT
                    parent.num_finished += 1
                    child.stats.finished_ts = now
        return to_abort, aborted

    def process_outputs(
        self, outputs: list[EngineCoreOutput], iteration_stats: IterationStats | None = None
    ) -> OutputProcessorOutput:
        """The only place that loops over EngineCoreOutputs in the front end.

        With ``iteration_stats``, also records the step's token counts and latencies there.
        """
        request_outputs: list[RequestOutput] = []
        reqs_to_abort: list[str] = []
        finished: list[ParentRequest] = []
        now = iteration_stats.iteration_timestamp if iteration_stats is not None else time.time()
        for output in outputs:
            state = self.request_states.get(output.request_id)
            if state is None:
                continue  # aborted meanwhile
            parent = state.parent
            if iteration_stats is not None:
                iteration_stats.update_from_output(output, len(parent.prompt_token_ids), state.stats)
            else:
                state.stats.update_from_output(output, now)
            state.num_cached_tokens = output.num_cached_tokens
            state.update_logprobs(output)
            stop_string = self._detokenize(state, output)
            state.finish_reason, state.stop_reason = output.finish_reason, output.stop_reason
            if stop_string is not None:
                state.finish_reason, state.stop_reason = FinishReason.STOP, stop_string
                reqs_to_abort.append(state.request_id)
            if state.finish_reason is not None:
                del self.request_states[state.request_id]
                parent.num_finished += 1
                state.stats.finished_ts = now
                if iteration_stats is not None:
                    iteration_stats.update_from_finished_request(
                        str(state.finish_reason), len(parent.prompt_token_ids), state.stats, parent.operation_name
                    )

            request_output = self._make_request_output(parent, state)
            if request_output is not None:
                request_outputs.append(request_output)
            if parent.finished:
                del self.parent_requests[parent.request_id]
                finished.append(parent)
        return OutputProcessorOutput(request_outputs, reqs_to_abort, finished)

    @staticmethod
    def _detokenize(state: RequestState, output: EngineCoreOutput) -> str | None:
        start = time.perf_counter()
        stop_string = state.detokenizer.update(output.new_token_ids, output.finish_reason == FinishReason.STOP)
        state.stats.detokenize_time += time.perf_counter() - start
        return stop_string

    @staticmethod
    def _make_request_output(parent: ParentRequest, state: RequestState) -> RequestOutput | None:
        kind = parent.params.output_kind
        finished = parent.finished
        if kind == RequestOutputKind.FINAL_ONLY and not finished:
            return None
        delta = kind == RequestOutputKind.DELTA
        prompt_logprobs = parent.prompt_logprobs
        if delta and parent.prompt_logprobs_sent:
            prompt_logprobs = None
        elif delta and prompt_logprobs is not None:
            parent.prompt_logprobs_sent = True
        return RequestOutput(
            request_id=parent.request_id,
            prompt=parent.prompt,
            prompt_token_ids=parent.prompt_token_ids,
            # A DELTA output carries only the sample this engine-core output moved (the others have
            # nothing new): O(1) per output, not O(n).
            outputs=[state.completion_output(True)] if delta else [c.completion_output(False) for c in parent.children],
            finished=finished,
            num_cached_tokens=parent.children[0].num_cached_tokens,
            prompt_logprobs=prompt_logprobs,
            metrics=state.stats,
        )
