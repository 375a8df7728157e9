"""``tracevllm bench throughput``: offline throughput on a random dataset, as ``vllm bench throughput``.

Every prompt is random token ids of a length drawn from ``--input-len`` (``N`` or ``LO:HI``) with an
output length from ``--output-len``; ``ignore_eos`` makes each request produce exactly that many
tokens. ``--backend hf`` runs the same prompts through transformers' ``generate`` in padded batches of
``--hf-max-batch-size`` (each batch generates its longest output); ``both`` runs the two in one
process, one after the other, and prints the ratio. ``--compare-tracing`` runs tracevllm at each
tracing level instead (off, ``--trace-level request``, ``--trace-level step``, traces written to a
temporary directory), twice, in alternating order, and prints each level's median against the
untraced median. With ``-tp``/``-pp`` above 1, the same prompts then run on one rank too
(``-tp 1 -pp 1``), and the ratio is printed.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import random
import statistics
import tempfile
import time
from dataclasses import dataclass

import torch


@dataclass
class BenchRequest:
    prompt_token_ids: list[int]
    output_len: int


def _length_range(text: str) -> tuple[int, int]:
    lo, _, hi = text.partition(":")
    lo_i, hi_i = int(lo), int(hi or lo)
    if not 1 <= lo_i <= hi_i:
        raise argparse.ArgumentTypeError(f"expected N or LO:HI with 1 <= LO <= HI, got {text!r}")
    return lo_i, hi_i


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backend", choices=["tracevllm", "hf", "both"], default="tracevllm")
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--input-len", type=_length_range, default=(32, 512), help="N or LO:HI tokens")
    parser.add_argument("--output-len", type=_length_range, default=(32, 256), help="N or LO:HI tokens")
    parser.add_argument("--hf-max-batch-size", type=int, default=16)
    parser.add_argument("--dataset-seed", type=int, default=0)
    parser.add_argument("--compare-tracing", action="store_true",
                        help="tracevllm with tracing off, --trace-level request and step, twice each in alternating "
                             "order (one process); medians")


def make_requests(num_prompts: int, input_len: tuple[int, int], output_len: tuple[int, int],
                  vocab_size: int, seed: int) -> list[BenchRequest]:
    rng = random.Random(seed)
    # Stay clear of the special tokens at both ends of the vocabulary.
    lo, hi = min(1000, vocab_size // 4), vocab_size - 1
    return [
        BenchRequest([rng.randrange(lo, hi) for _ in range(rng.randint(*input_len))], rng.randint(*output_len))
        for _ in range(num_prompts)
    ]


def run_tracevllm(llm, requests: list[BenchRequest]) -> float:
    from tracevllm import SamplingParams

    params = [SamplingParams(temperature=1.0, ignore_eos=True, max_tokens=r.output_len) for r in requests]
    start = time.perf_counter()
    outputs = llm.generate([r.prompt_token_ids for r in requests], params, use_tqdm=True)
    elapsed = time.perf_counter() - start
    assert all(len(o.outputs[0].token_ids) == r.output_len for o, r in zip(outputs, requests))
    return elapsed


def run_hf(model_dir: str, dtype, requests: list[BenchRequest], max_batch_size: int) -> float:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, local_files_only=True).eval()
    pad_id = 0
    start = time.perf_counter()
    for i in range(0, len(requests), max_batch_size):
        batch = requests[i : i + max_batch_size]
        width = max(len(r.prompt_token_ids) for r in batch)
        input_ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
        attention_mask = torch.zeros_like(input_ids)
        for j, r in enumerate(batch):  # left padding, as generation needs
            input_ids[j, width - len(r.prompt_token_ids) :] = torch.tensor(r.prompt_token_ids)
            attention_mask[j, width - len(r.prompt_token_ids) :] = 1
        max_new = max(r.output_len for r in batch)
        with torch.inference_mode():
            model.generate(
                input_ids=input_ids, attention_mask=attention_mask, do_sample=True, temperature=1.0,
                top_p=1.0, top_k=0, max_new_tokens=max_new, min_new_tokens=max_new, pad_token_id=pad_id,
            )
    return time.perf_counter() - start


def _report(name: str, elapsed: float, requests: list[BenchRequest]) -> float:
    num_out = sum(r.output_len for r in requests)
    num_total = num_out + sum(len(r.prompt_token_ids) for r in requests)
    print(
        f"[{name}] Throughput: {len(requests) / elapsed:.2f} requests/s, {num_total / elapsed:.2f} total tokens/s, "
        f"{num_out / elapsed:.2f} output tokens/s ({elapsed:.1f} s)"
    )
    return num_out / elapsed


def run_throughput(args: argparse.Namespace) -> int:
    from tracevllm import LLM
    from tracevllm.config import EngineArgs

    engine_args = EngineArgs.from_cli_args(args)
    config = engine_args.create_engine_config()
    model_config = config.model_config
    requests = make_requests(
        args.num_prompts, args.input_len, args.output_len, model_config.vocab_size, args.dataset_seed
    )
    print(
        f"{len(requests)} prompts, input {args.input_len[0]}-{args.input_len[1]}, output "
        f"{args.output_len[0]}-{args.output_len[1]} tokens, dtype {model_config.dtype}, device {config.device}, "
        f"torch threads {torch.get_num_threads()}"
    )
    if args.compare_tracing:
        return _compare_tracing(engine_args, requests)
    results = {}
    if args.backend in ("tracevllm", "both"):
        parallel = config.parallel_config
        runs = {f"tracevllm -tp {parallel.tensor_parallel_size} -pp {parallel.pipeline_parallel_size}": engine_args}
        if parallel.world_size > 1:
            runs["tracevllm -tp 1 -pp 1"] = dataclasses.replace(
                engine_args, tensor_parallel_size=1, pipeline_parallel_size=1, distributed_executor_backend=None)
        for name, run_args in runs.items():
            llm = LLM.from_engine_args(run_args)
            results[name] = _report(name, run_tracevllm(llm, requests), requests)
            llm.llm_engine.shutdown()
        if parallel.world_size > 1:
            first, single = results.values()
            print(f"-tp {parallel.tensor_parallel_size} -pp {parallel.pipeline_parallel_size} / one rank, output tokens/s: "
                  f"{first / single:.2f}x")
        results = {"tracevllm": next(iter(results.values()))}
    if args.backend in ("hf", "both"):
        elapsed = run_hf(model_config.model, model_config.dtype, requests, args.hf_max_batch_size)
        results["hf"] = _report(f"hf generate, batch {args.hf_max_batch_size}", elapsed, requests)
    if len(results) == 2:
        print(f"tracevllm / hf output tokens/s: {results['tracevllm'] / results['hf']:.2f}x")
    return 0


def _compare_tracing(engine_args, requests: list[BenchRequest], rounds: int = 2) -> int:
    """Each tracing level ``rounds`` times, the order reversed every other round (off, request,
    step, step, request, off, ...) so that drift over the run falls on every level alike; the
    median of each against the median untraced run."""
    from tracevllm import LLM

    levels = ("off", "request", "step")
    results: dict[str, list[float]] = {level: [] for level in levels}
    with tempfile.TemporaryDirectory() as trace_dir:
        for round_index in range(rounds):
            for level in levels if round_index % 2 == 0 else levels[::-1]:
                tracing = {} if level == "off" else {
                    "trace_out": os.path.join(trace_dir, f"{level}-{round_index}"), "trace_level": level,
                }
                llm = LLM.from_engine_args(dataclasses.replace(engine_args, **tracing))
                results[level].append(_report(f"tracevllm, tracing {level}", run_tracevllm(llm, requests), requests))
                del llm
    off = statistics.median(results["off"])
    for level in levels:
        runs = ", ".join(f"{r:.2f}" for r in results[level])
        print(f"tracing {level}: median {statistics.median(results[level]):.2f} output tokens/s ({runs}), "
              f"{statistics.median(results[level]) / off * 100:.1f} % of off")
    return 0
