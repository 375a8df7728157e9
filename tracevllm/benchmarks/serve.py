"""``tracevllm bench serve``: online-serving latency and throughput of a running server, as ``vllm bench serve``.

It sends ``--num-prompts`` streaming requests to an OpenAI-compatible ``/v1/completions`` endpoint
(``tracevllm serve``, vLLM, ...). Each prompt is a list of random token ids drawn from the tokenizer's
vocabulary without its special tokens; input and output lengths are drawn uniformly from
``[len * (1 - r), len * (1 + r)]`` (``--random-range-ratio r``), and ``ignore_eos`` makes the server
generate exactly the output length. Requests start all at once (``--request-rate inf``) or after
gamma-distributed gaps of mean ``1 / rate`` (``--burstiness 1``: a Poisson process); at most
``--max-concurrency`` are in flight. ``--duration S`` makes it a soak: ``--max-concurrency`` clients each
send the prompts one after another, cycling through them, until S seconds have passed, so that the load
stays at that concurrency for the whole run.

Per request, timed with ``time.perf_counter`` from just before the POST: TTFT is the time to the first
chunk that carries a token (non-empty text, or no finish reason yet: a token whose text the server
holds back); ITL are the gaps between successive such chunks; latency (E2EL) is the time to
``data: [DONE]``; output tokens are the usage chunk's ``completion_tokens`` (else the number of token
chunks); TPOT is ``(latency - TTFT) / (output tokens - 1)`` for requests with more than one output
token. A request succeeds on HTTP 200 with no error event and a ``[DONE]``. Token totals and latency
statistics cover successful requests only; throughputs divide them by the wall time of the whole run.

aiohttp is imported by the functions that send: this module's arguments are part of every ``tracevllm``
command line, and importing aiohttp took 0.2 s of each command's start.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING

import numpy as np
from tqdm import tqdm

if TYPE_CHECKING:
    import aiohttp

METRICS = {"ttft": "Time to First Token", "tpot": "Time per Output Token (excl. 1st token)",
           "itl": "Inter-token Latency", "e2el": "End-to-end Latency"}
_TIMEOUT_S = 6 * 60 * 60  # vLLM's: long runs queue requests for a while


@dataclass
class RequestFuncInput:
    prompt: list[int]
    prompt_len: int
    output_len: int
    model: str
    api_url: str
    api_key: str | None = None


@dataclass
class RequestFuncOutput:
    success: bool = False
    prompt_len: int = 0
    output_tokens: int = 0
    ttft: float = 0.0  # seconds, as are itl and latency
    itl: list[float] = field(default_factory=list)
    latency: float = 0.0
    error: str = ""


@dataclass
class LatencyStats:
    """One latency metric over the successful requests, in ms (all 0 when it has no values)."""
    mean_ms: float
    median_ms: float
    std_ms: float
    percentiles_ms: list[tuple[float, float]]  # (percentile, value)


@dataclass
class BenchmarkMetrics:
    completed: int
    failed: int
    total_input: int
    total_output: int
    duration_s: float
    request_throughput: float
    output_throughput: float
    total_token_throughput: float
    ttft: LatencyStats
    tpot: LatencyStats
    itl: LatencyStats
    e2el: LatencyStats
    max_itl_ms: float  # the longest gap between two chunks of any stream


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",")]


def _metric_names(text: str) -> list[str]:
    names = text.split(",")
    if not set(names) <= set(METRICS):
        raise argparse.ArgumentTypeError(f"expected names among {','.join(METRICS)}, got {text!r}")
    return names


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--base-url", default="http://127.0.0.1:8000")
    parser.add_argument("--endpoint", default="/v1/completions", help="an OpenAI completions endpoint")
    parser.add_argument("--model", default=None,
                        help="the model name sent in requests (default: the first id of GET /v1/models)")
    parser.add_argument("--tokenizer", default=None,
                        help="for the random prompts: HF directory or .gguf file (default: the bundled model)")
    parser.add_argument("--dataset-name", choices=["random"], default="random")
    parser.add_argument("--num-prompts", type=int, default=100)
    parser.add_argument("--random-input-len", type=int, default=128)
    parser.add_argument("--random-output-len", type=int, default=64)
    parser.add_argument("--random-range-ratio", type=float, default=0.0,
                        help="lengths are uniform in [len * (1 - r), len * (1 + r)], 0 <= r < 1")
    parser.add_argument("--request-rate", type=float, default=float("inf"), help="requests/s; inf: all at once")
    parser.add_argument("--burstiness", type=float, default=1.0, help="gamma shape of arrival gaps; 1: Poisson")
    parser.add_argument("--max-concurrency", type=int, default=None, help="most requests in flight (default: all)")
    parser.add_argument("--duration", type=float, default=None,
                        help="soak: keep --max-concurrency requests in flight for this many seconds, cycling "
                             "through the --num-prompts prompts (default: send each prompt once)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--api-key", default=None, help="sent as 'Authorization: Bearer <key>'")
    parser.add_argument("--percentile-metrics", type=_metric_names, default="ttft,tpot,itl",
                        help=f"which of {','.join(METRICS)} to report")
    parser.add_argument("--metric-percentiles", type=_floats, default="99", help="e.g. 50,90,99")
    parser.add_argument("--save-result", action="store_true", help="write the results to a JSON file")
    parser.add_argument("--result-filename", default=None)
    parser.add_argument("--disable-tqdm", action="store_true")


def sample_random_requests(tokenizer, num_prompts: int, input_len: int, output_len: int, range_ratio: float,
                           seed: int) -> list[tuple[list[int], int]]:
    """``num_prompts`` (prompt token ids, output length) pairs of random non-special tokens."""
    if not 0.0 <= range_ratio < 1.0:
        raise ValueError(f"--random-range-ratio must be in [0, 1), got {range_ratio}")
    rng = np.random.default_rng(seed)
    vocab = np.setdiff1d(np.arange(tokenizer.vocab_size), tokenizer.all_special_ids)

    def lengths(length: int) -> np.ndarray:
        low = max(1, math.floor(length * (1 - range_ratio)))
        return rng.integers(low, max(low, math.ceil(length * (1 + range_ratio))) + 1, size=num_prompts)

    input_lens, output_lens = lengths(input_len), lengths(output_len)
    return [(rng.choice(vocab, size=n).tolist(), int(m)) for n, m in zip(input_lens, output_lens)]


def _latency_stats(seconds: list[float], percentiles: list[float]) -> LatencyStats:
    ms = np.array(seconds or [0.0]) * 1000
    return LatencyStats(float(np.mean(ms)), float(np.median(ms)), float(np.std(ms)),
                        [(p, float(np.percentile(ms, p))) for p in percentiles])


def calculate_metrics(outputs: list[RequestFuncOutput], duration_s: float,
                      percentiles: list[float]) -> BenchmarkMetrics:
    """The report's figures from per-request results; failed requests only count as failures."""
    ok = [o for o in outputs if o.success]
    total_input, total_output = sum(o.prompt_len for o in ok), sum(o.output_tokens for o in ok)
    total = total_input + total_output
    tpots = [(o.latency - o.ttft) / (o.output_tokens - 1) for o in ok if o.output_tokens > 1]
    gaps = [gap for o in ok for gap in o.itl]
    return BenchmarkMetrics(
        completed=len(ok), failed=len(outputs) - len(ok), total_input=total_input, total_output=total_output,
        duration_s=duration_s, request_throughput=len(ok) / duration_s,
        output_throughput=total_output / duration_s, total_token_throughput=total / duration_s,
        ttft=_latency_stats([o.ttft for o in ok], percentiles), tpot=_latency_stats(tpots, percentiles),
        itl=_latency_stats(gaps, percentiles), e2el=_latency_stats([o.latency for o in ok], percentiles),
        max_itl_ms=max(gaps, default=0.0) * 1000,
    )


def _headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def _error_message(body: str) -> str:
    try:
        return json.loads(body)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return body[:500]


def _carries_token(chunk: dict) -> bool:
    choices = chunk.get("choices") or [{}]
    return bool(choices[0].get("text")) or ("text" in choices[0] and choices[0].get("finish_reason") is None)


async def async_request_openai_completions(inp: RequestFuncInput,
                                           session: aiohttp.ClientSession) -> RequestFuncOutput:
    """One streaming completion request, timed chunk by chunk."""
    import aiohttp

    payload = {"model": inp.model, "prompt": inp.prompt, "max_tokens": inp.output_len, "ignore_eos": True,
               "temperature": 0.0, "stream": True, "stream_options": {"include_usage": True}}
    out = RequestFuncOutput(prompt_len=inp.prompt_len)
    token_chunks, usage_tokens = 0, None
    start = last = time.perf_counter()
    try:
        async with session.post(inp.api_url, json=payload, headers=_headers(inp.api_key)) as response:
            if response.status != 200:
                out.error = f"HTTP {response.status}: {_error_message(await response.text())}"
                return out
            async for line in response.content:
                if not line.startswith(b"data:"):  # blank separators, SSE comments
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    out.latency = time.perf_counter() - start
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    out.error = f"error event: {_error_message(data.decode())}"
                    return out
                if _carries_token(chunk):
                    now = time.perf_counter()
                    if token_chunks == 0:
                        out.ttft = now - start
                    else:
                        out.itl.append(now - last)
                    last, token_chunks = now, token_chunks + 1
                usage_tokens = (chunk.get("usage") or {}).get("completion_tokens", usage_tokens)
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as e:
        out.error = f"{type(e).__name__}: {e}"
        return out
    if out.latency == 0:
        out.error = "the stream ended without [DONE]"
    elif token_chunks == 0:
        out.error = "no token before [DONE]"
    else:
        out.success = True
        out.output_tokens = usage_tokens if usage_tokens is not None else token_chunks
    return out


async def first_model(base_url: str, api_key: str | None) -> str:
    """The first model id the server lists at ``GET /v1/models``."""
    import aiohttp

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        async with session.get(f"{base_url}/v1/models", headers=_headers(api_key)) as response:
            response.raise_for_status()
            return (await response.json())["data"][0]["id"]


def send_times(num_requests: int, request_rate: float, burstiness: float, seed: int) -> np.ndarray:
    """Seconds after the start at which each request is sent: all at 0 for an infinite rate, else after
    gamma-distributed gaps of mean ``1 / request_rate`` (shape ``burstiness``; 1 is a Poisson process)."""
    if math.isinf(request_rate):
        return np.zeros(num_requests)
    gaps = np.random.default_rng(seed).gamma(burstiness, 1.0 / (request_rate * burstiness), size=num_requests)
    return np.cumsum(gaps) - gaps[0]  # the first request goes at once


async def benchmark(args: argparse.Namespace, model: str,
                    requests: list[tuple[list[int], int]]) -> tuple[list[RequestFuncOutput], float]:
    """Sends every request on its arrival schedule (or, with ``--duration``, keeps ``--max-concurrency``
    clients busy until the time is up); returns the results and the wall time of the run."""
    import aiohttp

    base_url = args.base_url.rstrip("/")
    send_at = send_times(len(requests), args.request_rate, args.burstiness, args.seed)
    semaphore = asyncio.Semaphore(args.max_concurrency or len(requests))
    pbar = tqdm(total=None if args.duration else len(requests), disable=args.disable_tqdm)
    failures = 0
    connector = aiohttp.TCPConnector(limit=args.max_concurrency or 0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=_TIMEOUT_S)) as session:
        async def send(prompt: list[int], output_len: int) -> RequestFuncOutput:
            nonlocal failures
            inp = RequestFuncInput(prompt, len(prompt), output_len, model, base_url + args.endpoint, args.api_key)
            out = await async_request_openai_completions(inp, session)
            if not out.success:
                failures += 1
                if failures == 1:
                    tqdm.write(f"first failed request: {out.error}", file=sys.stderr)
            pbar.update(1)
            return out

        async def run_one(delay: float, prompt: list[int], output_len: int) -> RequestFuncOutput:
            await asyncio.sleep(delay)
            async with semaphore:
                return await send(prompt, output_len)

        async def soak_client(first: int, stop_at: float) -> list[RequestFuncOutput]:
            results, i = [], first
            while time.perf_counter() < stop_at:
                results.append(await send(*requests[i % len(requests)]))
                i += args.max_concurrency
            return results

        start = time.perf_counter()
        if args.duration:
            clients = [soak_client(c, start + args.duration) for c in range(args.max_concurrency)]
            outputs = [out for results in await asyncio.gather(*clients) for out in results]
        else:
            outputs = await asyncio.gather(*(run_one(t, p, n) for t, (p, n) in zip(send_at, requests)))
        duration = time.perf_counter() - start
    pbar.close()
    return list(outputs), duration


def _row(label: str, value) -> None:
    print(f"{label:<40} {value:<10.2f}" if isinstance(value, float) else f"{label:<40} {value:<10}")


def print_report(metrics: BenchmarkMetrics, args: argparse.Namespace) -> None:
    print(f"{' Serving Benchmark Result ':=^50}")
    _row("Successful requests:", metrics.completed)
    _row("Failed requests:", metrics.failed)
    _row("Maximum request concurrency:", args.max_concurrency or "unlimited")
    _row("Request rate configured (RPS):", args.request_rate)
    _row("Benchmark duration (s):", metrics.duration_s)
    _row("Total input tokens:", metrics.total_input)
    _row("Total generated tokens:", metrics.total_output)
    _row("Request throughput (req/s):", metrics.request_throughput)
    _row("Output token throughput (tok/s):", metrics.output_throughput)
    _row("Total token throughput (tok/s):", metrics.total_token_throughput)
    _row("Longest gap in any stream (ms):", metrics.max_itl_ms)
    for name in args.percentile_metrics:
        stats: LatencyStats = getattr(metrics, name)
        print(f"{' ' + METRICS[name] + ' ':-^50}")
        _row(f"Mean {name.upper()} (ms):", stats.mean_ms)
        _row(f"Median {name.upper()} (ms):", stats.median_ms)
        for p, value in stats.percentiles_ms:
            _row(f"P{p:g} {name.upper()} (ms):", value)
    print("=" * 50)


def save_result(metrics: BenchmarkMetrics, outputs: list[RequestFuncOutput], args: argparse.Namespace,
                model: str) -> str:
    """Writes the settings, metrics and per-request results as JSON; returns the file name."""
    now = datetime.now().strftime("%Y%m%d-%H%M%S")
    filename = args.result_filename or (
        f"serve-{args.request_rate}qps-concurrency{args.max_concurrency}-{model.split('/')[-1]}-{now}.json")
    settings = {k: v for k, v in vars(args).items()
                if k != "api_key" and isinstance(v, (str, int, float, list, type(None)))}
    settings.update(model=model, request_rate=str(args.request_rate))  # JSON has no inf
    result = {"date": now, **settings, **asdict(metrics), "requests": [asdict(o) for o in outputs]}
    with open(filename, "w") as f:
        json.dump(result, f, indent=2)
    return filename


def run_serve_benchmark(args: argparse.Namespace) -> int:
    import aiohttp

    from tracevllm.models.loader import get_tokenizer, resolve_model

    if args.num_prompts < 1 or args.request_rate <= 0 or args.burstiness <= 0 or (args.max_concurrency or 1) < 1:
        raise ValueError("--num-prompts and --max-concurrency must be >= 1, --request-rate and --burstiness > 0")
    if args.duration is not None and (args.duration <= 0 or not args.max_concurrency):
        raise ValueError("--duration needs a positive number of seconds and --max-concurrency")
    try:
        model = args.model or asyncio.run(first_model(args.base_url.rstrip("/"), args.api_key))
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, KeyError, IndexError) as e:
        print(f"error: no model name from {args.base_url}/v1/models ({type(e).__name__}: {e}); is the server "
              "running there? (--model skips this query)", file=sys.stderr)
        return 1
    tokenizer = get_tokenizer(resolve_model(args.tokenizer))
    requests = sample_random_requests(tokenizer, args.num_prompts, args.random_input_len, args.random_output_len,
                                      args.random_range_ratio, args.seed)
    outputs, duration = asyncio.run(benchmark(args, model, requests))
    metrics = calculate_metrics(outputs, duration, args.metric_percentiles)
    print_report(metrics, args)
    if args.save_result or args.result_filename:
        print(f"results saved to {save_result(metrics, outputs, args, model)}")
    if metrics.completed == 0:
        print(f"error: all {len(outputs)} requests failed, e.g.: {outputs[0].error}", file=sys.stderr)
        return 1
    return 0
