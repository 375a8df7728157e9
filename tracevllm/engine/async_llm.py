"""AsyncLLM: the online front end. Many concurrent ``generate()`` streams over one engine core.

The engine core runs its busy loop in a background process (``AsyncMPClient``). In this process::

    generate(prompt) ── Processor ──▶ EngineCoreRequest ──▶ engine core (ZMQ)
        ▲                                                        │
        │ RequestOutputCollector (one per request)               ▼
        └──── output handler task ◀── OutputProcessor ◀── EngineCoreOutputs

One output-handler task is the only reader of the engine core's outputs: it detokenizes them
(OutputProcessor), drops each request's newest ``RequestOutput`` into that request's collector,
aborts in the core what a stop string finished, and feeds the stat loggers. ``generate()`` only
waits on its own collector. A client that goes away cancels its ``generate()``, which aborts the
request in the engine core so that its KV blocks are freed at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator

from tracevllm.config import ModelConfig, UsageContext, VllmConfig
from tracevllm.engine import FinishReason
from tracevllm.engine.arg_utils import EngineArgs
from tracevllm.engine.core_client import AsyncMPClient, EngineCoreClient
from tracevllm.engine.exceptions import EngineDeadError, EngineGenerateError, EngineShutdownError
from tracevllm.engine.output_processor import OutputProcessor, RequestOutputCollector
from tracevllm.engine.processor import Processor, PromptType
from tracevllm.metrics.genai import GenAIStatLogger
from tracevllm.metrics.loggers import LoggingStatLogger, PrometheusStatLogger, StatLoggerBase
from tracevllm.metrics.stats import IterationStats
from tracevllm.models.loader import get_tokenizer
from tracevllm.outputs import RequestOutput
from tracevllm.sampling_params import SamplingParams
from tracevllm.tracing import flush_traces, make_request_tracer, trace_startup
from tracevllm.tracing.schema import SpanName

logger = logging.getLogger("tracevllm")

FAN_OUT_CHUNK = 64  # samples of an n > 1 request made and sent between two yields to the event loop


class AsyncLLM:
    """The online engine: ``generate()`` streams one request's ``RequestOutput``s, many at a time,
    over one engine core in a background process (the module docstring draws it).

    ``startup_phases``: as for ``LLMEngine``."""

    def __init__(self, vllm_config: VllmConfig, log_stats: bool = True,
                 startup_phases: list[tuple[str, float, float]] | None = None) -> None:
        self.vllm_config = vllm_config
        self.model_config = vllm_config.model_config
        started = time.time()
        self.tokenizer = get_tokenizer(self.model_config.model)
        done = [*(startup_phases or []), (SpanName.LOAD_TOKENIZER, started, time.time())]
        self.request_tracer = make_request_tracer(
            vllm_config.observability_config, self.model_config.served_model_name, self.tokenizer
        )
        self.processor = Processor(vllm_config, self.tokenizer)
        self.output_processor = OutputProcessor(self.tokenizer)
        with trace_startup(self.request_tracer, done) as startup:
            with startup.phase(SpanName.START_ENGINE_CORE) as trace_headers:
                self.engine_core: AsyncMPClient = EngineCoreClient.make_client(  # type: ignore[assignment]
                    True, True, vllm_config, trace_headers
                )
        self.prometheus: PrometheusStatLogger | None = None
        self.stat_loggers: list[StatLoggerBase] = []
        if log_stats:
            self.prometheus = PrometheusStatLogger(
                self.model_config.served_model_name, self.engine_core.num_gpu_blocks,
                vllm_config.cache_config.block_size,
            )
            genai = GenAIStatLogger(self.model_config.served_model_name, self.prometheus.registry,
                                    vllm_config.observability_config.otlp_metrics_endpoint)
            self.stat_loggers = [LoggingStatLogger(), self.prometheus, genai]
        self.collectors: dict[str, RequestOutputCollector] = {}
        self.dead_error: EngineDeadError | None = None
        self.shutdown_error: EngineShutdownError | None = None  # set by stop_for_shutdown
        self.engine_core_busy = False  # its last stats had requests running or waiting
        self.output_handler: asyncio.Task | None = None
        try:
            asyncio.get_running_loop()
            self._run_output_handler()  # started now, it notices a dead engine core even when idle
        except RuntimeError:
            pass  # no event loop yet: started by the first request

    @classmethod
    def from_engine_args(cls, engine_args: EngineArgs, log_stats: bool = True,
                         usage_context: UsageContext = UsageContext.OPENAI_API_SERVER) -> "AsyncLLM":
        """``usage_context``: the server's defaults (a shorter step budget on CPU), since AsyncLLM serves
        streams."""
        started = time.time()
        vllm_config = engine_args.create_engine_config(usage_context)
        return cls(vllm_config, log_stats, [(SpanName.CREATE_ENGINE_CONFIG, started, time.time())])

    # ---- requests ------------------------------------------------------------------------------

    async def add_request(
        self, request_id: str, prompt: PromptType, params: SamplingParams, priority: int = 0,
        add_special_tokens: bool = True, trace_headers: dict[str, str] | None = None,
        arrival_time: float | None = None, messages: list[dict] | None = None,
    ) -> RequestOutputCollector:
        """Validate (ValueError on bad input), queue in the engine core, return the request's mailbox.

        The collector and each sample are registered before the sample is sent. A request with
        n > 1 makes and sends its samples ``FAN_OUT_CHUNK`` at a time, yielding to the event loop
        between chunks, so that a huge n blocks neither the other requests nor ``/health``. Cancelled
        at any moment (the client left), it aborts every sample sent so far, in one message, and
        sends no more.
        """
        if self.dead_error is not None:
            raise self.dead_error
        if self.shutdown_error is not None:
            raise self.shutdown_error
        if request_id in self.output_processor.parent_requests:
            raise ValueError(f"request_id {request_id!r} is already in use.")
        parent, children = self.processor.process_request(
            request_id, prompt, params, priority, add_special_tokens, arrival_time, messages
        )
        self._run_output_handler()
        collector = RequestOutputCollector(params.output_kind)
        self.collectors[request_id] = collector
        try:
            for start in range(0, len(children), FAN_OUT_CHUNK):
                if start > 0:
                    await asyncio.sleep(0)
                requests = children[start:start + FAN_OUT_CHUNK]
                if self.request_tracer is not None:
                    self.request_tracer.request_added(parent, requests, trace_headers)
                for index, request in enumerate(requests, start):
                    self.output_processor.add_request(request, parent, index)
                for request in requests:
                    await self.engine_core.add_request_async(request)
        except BaseException:  # cancelled, or the engine core died: what was sent must not run on
            # Shielded, as in generate(): the abort must reach the engine core even if every later
            # await of this task is cancelled too.
            await asyncio.shield(self.abort(request_id))
            raise
        return collector

    async def generate(
        self, prompt: PromptType, sampling_params: SamplingParams, request_id: str, priority: int = 0,
        add_special_tokens: bool = True, trace_headers: dict[str, str] | None = None,
        arrival_time: float | None = None, messages: list[dict] | None = None,
    ) -> AsyncGenerator[RequestOutput, None]:
        """Yield the request's ``RequestOutput``s as they come (per ``sampling_params.output_kind``).

        Raises ValueError for a bad request, EngineGenerateError if the request (any of its samples)
        finishes with ``FinishReason.ERROR`` (its error output is not yielded; the engine goes on
        serving the others), EngineDeadError if the engine core dies, and EngineShutdownError if the
        server stops it (``stop_for_shutdown``). Closing or
        cancelling the generator aborts the request in the engine core. ``arrival_time``, when the
        caller began handling the request (it may have tokenized it); ``messages``, the conversation
        of a chat request: both for its trace.
        """
        collector = None
        try:
            collector = await self.add_request(
                request_id, prompt, sampling_params, priority, add_special_tokens, trace_headers, arrival_time,
                messages,
            )
            finished = False
            while not finished:
                output = await collector.get()
                failed = next((c for c in output.outputs if c.finish_reason == str(FinishReason.ERROR)), None)
                if failed is not None:
                    await self.abort(request_id)  # the other samples of an n > 1 request, if any
                    raise EngineGenerateError(f"Request {request_id} failed in the engine: {failed.stop_reason}")
                finished = output.finished
                yield output
        except (asyncio.CancelledError, GeneratorExit):
            if collector is not None:
                # Shielded: Starlette cancels a stream whose client left with an anyio cancel scope,
                # which cancels every later await of this task too; the abort must still reach the
                # engine core, or the request would run (and hold its KV blocks) to the end.
                await asyncio.shield(self.abort(request_id))
            raise
        except (ValueError, EngineDeadError, EngineGenerateError, EngineShutdownError):
            raise
        except Exception as e:
            await self.abort(request_id)
            raise EngineGenerateError(f"Request {request_id} failed: {e!r}") from e

    async def abort(self, request_id: str | list[str]) -> None:
        request_ids = [request_id] if isinstance(request_id, str) else list(request_id)
        for req_id in request_ids:
            self.collectors.pop(req_id, None)
        to_abort, aborted = self.output_processor.abort_requests(request_ids)
        if self.request_tracer is not None:
            self.request_tracer.requests_finished(aborted)
        await self.engine_core.abort_requests_async(to_abort)

    # ---- the output handler --------------------------------------------------------------------

    def _run_output_handler(self) -> None:
        if self.output_handler is None:
            self.output_handler = asyncio.get_running_loop().create_task(self._output_handler_loop())

    async def _output_handler_loop(self) -> None:
        try:
            while True:
                outputs = await self.engine_core.get_output_async()
                iteration_stats = IterationStats() if self.stat_loggers else None
                processed = self.output_processor.process_outputs(outputs.outputs, iteration_stats)
                for request_output in processed.request_outputs:
                    collector = self.collectors.get(request_output.request_id)
                    if collector is not None:
                        collector.put(request_output)
                    if request_output.finished:
                        self.collectors.pop(request_output.request_id, None)
                await self.engine_core.abort_requests_async(processed.reqs_to_abort, FinishReason.STOP)
                if self.request_tracer is not None:
                    self.request_tracer.requests_finished(processed.finished_requests)
                stats = outputs.scheduler_stats
                if stats is not None:
                    self.engine_core_busy = stats.num_running_reqs + stats.num_waiting_reqs > 0
                for stat_logger in self.stat_loggers:
                    stat_logger.record(stats, iteration_stats)
        except asyncio.CancelledError:
            raise
        except EngineDeadError as e:
            logger.error("%s", e)
            self._fail_all(e)
        except Exception as e:
            logger.exception("The output handler failed.")
            self._fail_all(EngineDeadError(repr(e)))

    async def stop_for_shutdown(self) -> None:
        """The server is shutting down: every waiting ``generate()`` raises EngineShutdownError (so
        that its client is told, not cut off), its request is aborted in the engine core and its
        spans are ended as aborted, as when a client leaves; new requests are refused."""
        self.shutdown_error = EngineShutdownError()
        for collector in self.collectors.values():
            collector.put(self.shutdown_error)
        await self.abort(list(self.collectors))

    async def wait_until_idle(self, timeout: float) -> None:
        """Until the engine core says it has no request left (its stats come once it has taken in the
        aborts), at most ``timeout`` seconds: shut down then, it is not stopped in the middle of a
        step, whose span would end without the step's gauges."""
        deadline = time.monotonic() + timeout
        while self.engine_core_busy and not self.errored and time.monotonic() < deadline:
            await asyncio.sleep(0.01)

    def _fail_all(self, error: EngineDeadError) -> None:
        """Every waiting ``generate()`` raises ``error``; new requests are refused."""
        self.dead_error = error
        for collector in self.collectors.values():
            collector.put(error)
        self.collectors.clear()

    # ---- the engine as a whole -----------------------------------------------------------------

    @property
    def errored(self) -> bool:
        return self.dead_error is not None or not self.engine_core.is_alive()

    async def check_health(self) -> None:
        if self.errored:
            raise self.dead_error or EngineDeadError()

    async def get_model_config(self) -> ModelConfig:
        return self.model_config

    async def get_tokenizer(self):
        return self.tokenizer

    async def do_log_stats(self) -> None:
        for stat_logger in self.stat_loggers:
            stat_logger.log()

    def shutdown(self) -> None:
        if self.output_handler is not None:
            self.output_handler.cancel()
        self.engine_core.shutdown()
        flush_traces()
