"""How well ``tracevllm traces whatif`` predicts real re-runs: record one run of the bundled model, predict
four changes from its trace, run each change for real, and compare the schedules and the latencies.

    python benchmarks/whatif_fidelity.py --mode offline --num-requests 200
    python benchmarks/whatif_fidelity.py --mode served --num-requests 64 --rates 2,4

Offline, one ``LLM.generate`` of ``--num-requests`` token-id prompts (half of them behind a shared
32-token system prompt, so prefix caching matters), greedy, ``ignore_eos`` with output lengths drawn
per request, so that every run produces the same tokens' count. Served, ``tracevllm serve`` fed by
``tracevllm bench serve`` (random prompts, Poisson arrivals at each rate, the same seed every run).
The changes: a smaller token budget, fewer sequences, a KV cache small enough to preempt, prefix
caching off. Each run starts a fresh engine (served: a fresh server), traced at step level.

Per change it prints: the steps of the real and the predicted run; the share of steps whose predicted
batch (which requests, how many tokens each, by arrival rank: a server's request ids differ from run
to run) equals the real one, step for step; the median and p90 of the per-request e2e error
|predicted - real| / real, and the median TTFT error; the real run's duration and the what-if's time
(in this process: loading the trace, fitting, replaying, writing the predicted trace). A second row
per change times the same prediction by the real re-run's own steps: what is left of its error is the
replay's, not the step-cost model's or the machine's drift between the two runs. ``--json FILE`` keeps
the rows; ``--analyse`` runs nothing and prints the rows of the runs already in ``--out``.
"""

from __future__ import annotations

import argparse
import difflib
import gc
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass

from tracevllm.whatif.command import whatif
from viz.trace_loader import load_trace
from viz.model import Trace

# The CPU threads pinned: left to the engine, the count depends on what else ran at its start (it
# times a GEMM on 2 cores and on 1), and a prediction is only as good as the runs compared are alike.
OFFLINE_ENGINE = dict(max_num_batched_tokens=256, max_num_seqs=64, max_model_len=1024, block_size=16, cpu_threads=2)
# Served prompts are 32-96 tokens and answers 16-48: a max_model_len of 256 lets a KV cache of 24
# blocks (384 tokens) run, small enough that a few requests at once preempt.
SERVED_ENGINE = dict(max_num_batched_tokens=256, max_num_seqs=32, max_model_len=256, block_size=16, cpu_threads=2)
CHANGES = {
    "offline": {"token budget 256 -> 64": {"max_num_batched_tokens": 64},
                "max_num_seqs 64 -> 16": {"max_num_seqs": 16},
                "KV cache 96 blocks (preempts)": {"num_gpu_blocks_override": 96},
                "prefix caching off": {"enable_prefix_caching": False}},
    "served": {"token budget 256 -> 64": {"max_num_batched_tokens": 64},
               "max_num_seqs 32 -> 8": {"max_num_seqs": 8},
               "KV cache 24 blocks (preempts)": {"num_gpu_blocks_override": 24},
               "prefix caching off": {"enable_prefix_caching": False}},
}


@dataclass
class Row:
    mode: str
    change: str
    real_steps: int
    predicted_steps: int
    schedule_equal: float  # share of steps, step for step
    schedule_aligned: float  # share of steps, the two schedules aligned (a step more or less shifts no other)
    e2e_error_median: float
    e2e_error_p90: float
    ttft_error_median: float
    real_preemptions: int
    predicted_preemptions: int
    real_duration_s: float
    whatif_s: float


# ---- the runs --------------------------------------------------------------------------------------

def offline_workload(n: int, seed: int = 0) -> list[tuple[list[int], int]]:
    """(prompt token ids, output tokens) per request."""
    rng = random.Random(seed)
    system = [rng.randrange(1000, 40000) for _ in range(32)]
    workload = []
    for i in range(n):
        question = [rng.randrange(1000, 40000) for _ in range(rng.randrange(16, 96))]
        workload.append(((system if i % 2 else []) + question, rng.randrange(8, 40)))
    return workload


def run_offline(engine: dict, workload: list[tuple[list[int], int]], trace_dir: str) -> None:
    from tracevllm import LLM, SamplingParams

    llm = LLM(trace_out=trace_dir, **engine)
    llm.generate([{"prompt_token_ids": p} for p, _ in workload],
                 [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True) for _, m in workload], use_tqdm=False)
    llm.llm_engine.shutdown()
    del llm
    gc.collect()


def _flags(engine: dict) -> list[str]:
    flags = []
    for key, value in engine.items():
        flag = "--" + key.replace("_", "-")
        flags += [flag if value else "--no-" + flag[2:]] if isinstance(value, bool) else [flag, str(value)]
    return flags


def pin_engine_core(server_pid: int) -> None:
    """The engine core alone on the first CPU, the API server (and its other children) on the others:
    its steps then take as long whatever the front end and the client do (``--pin``)."""
    import psutil

    server = psutil.Process(server_pid)
    cores = sorted(os.sched_getaffinity(0))
    for process in [server, *server.children(recursive=True)]:
        is_core = process.name() == "EngineCore"
        for thread in process.threads():
            os.sched_setaffinity(thread.id, cores[:1] if is_core else cores[1:])


def run_served(engine: dict, rate: float, n: int, trace_dir: str, port: int = 8321, pin: bool = False) -> None:
    cli = [sys.executable, "-m", "tracevllm.entrypoints.cli"]
    server = subprocess.Popen([*cli, "serve", "--port", str(port), "--trace-out", trace_dir, *_flags(engine)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 300
        while True:
            try:
                if urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).status == 200:
                    break
            except OSError:
                if server.poll() is not None or time.time() > deadline:
                    raise RuntimeError("tracevllm serve did not start") from None
                time.sleep(0.5)
        client_cores = None
        if pin:
            pin_engine_core(server.pid)
            client_cores = sorted(os.sched_getaffinity(0))[1:]
        subprocess.run([*cli, "bench", "serve", "--base-url", f"http://127.0.0.1:{port}", "--num-prompts", str(n),
                        "--request-rate", str(rate), "--random-input-len", "64", "--random-output-len", "32",
                        "--random-range-ratio", "0.5", "--seed", "0", "--disable-tqdm"],
                       check=True, stdout=subprocess.DEVNULL,
                       preexec_fn=None if client_cores is None else lambda: os.sched_setaffinity(0, client_cores))
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(timeout=600)
        except subprocess.TimeoutExpired:  # its trace files may then lack the last spans
            server.kill()
            server.wait()


# ---- the comparison --------------------------------------------------------------------------------

def _ranks(trace: Trace) -> dict[str, int]:
    """Each engine-core request's rank in arrival order (``trace.requests`` is in arrival order)."""
    return {request_id: i for i, request_id in enumerate(trace.requests)}


def _batches(trace: Trace) -> list[tuple]:
    rank = _ranks(trace)
    return [(tuple(rank[r] for r in s.req_ids), tuple(s.req_num_tokens)) for s in trace.steps]


def _aligned(a: list[tuple], b: list[tuple]) -> float:
    """The share of steps equal once the two schedules are aligned (difflib's longest matching runs):
    an arrival that falls one step later in one run, or an extra step while the engine idles, makes
    a few steps differ here, where step for step it would shift every step after it."""
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    return sum(block.size for block in matcher.get_matching_blocks()) / max(len(a), len(b))


def _errors(real: dict[int, float], predicted: dict[int, float]) -> list[float]:
    return sorted(abs(predicted[k] - v) / v for k, v in real.items() if k in predicted and v > 0)


def _p90(values: list[float]) -> float:
    return values[min(len(values) - 1, round(0.9 * (len(values) - 1)))] if values else float("nan")


def compare(mode: str, change: str, real_dir: str, predicted_dir: str, whatif_s: float) -> Row:
    real, predicted = load_trace(real_dir), load_trace(predicted_dir)
    a, b = _batches(real), _batches(predicted)
    equal = sum(x == y for x, y in zip(a, b)) / max(len(a), len(b))
    aligned = _aligned(a, b)

    def by_rank(trace: Trace, field: str) -> dict[int, float]:
        rank = _ranks(trace)
        return {rank[r.request_id]: getattr(r, field) for r in trace.requests.values() if getattr(r, field) is not None}

    e2e = _errors(by_rank(real, "e2e"), by_rank(predicted, "e2e"))
    ttft = _errors(by_rank(real, "ttft"), by_rank(predicted, "ttft"))
    requests = list(real.requests.values())
    return Row(mode, change, len(a), len(b), equal, aligned, statistics.median(e2e), _p90(e2e), statistics.median(ttft),
               sum(r.num_preemptions for r in requests), sum(r.num_preemptions for r in predicted.requests.values()),
               max(r.finished for r in requests) - min(r.arrival for r in requests), whatif_s)


def _settings(change: dict) -> list[str]:
    return [f"{key}={str(value).lower() if isinstance(value, bool) else value}" for key, value in change.items()]


def _name(change: str, settings: dict) -> str:
    return change.split(" ")[0] + "-" + "-".join(settings)


def evaluate(mode: str, label: str, engine: dict, record, out: str) -> list[Row]:
    """Record the baseline, then per change: predict it from the baseline's trace, run it, compare."""
    baseline = os.path.join(out, f"{label}-baseline")
    record(engine, baseline)
    for change, settings in CHANGES[mode].items():
        name = _name(change, settings)
        started = time.perf_counter()
        whatif(baseline, _settings(settings), os.path.join(out, f"{label}-{name}-predicted"))
        with open(os.path.join(out, f"{label}-{name}-whatif_s"), "w") as f:
            f.write(str(time.perf_counter() - started))
        record({**engine, **settings}, os.path.join(out, f"{label}-{name}-real"))
        print("\n".join(_line(r) for r in analyse(mode, label, out, {change: settings})), flush=True)
    record(engine, os.path.join(out, f"{label}-rerun"))  # the noise floor: no prediction does better
    return analyse(mode, label, out, CHANGES[mode])


def analyse(mode: str, label: str, out: str, changes: dict) -> list[Row]:
    """The rows of the runs in ``out``: per change, the prediction timed by the baseline's steps, and
    one timed by the real re-run's own steps (what is left of its error is the replay's, not the
    step-cost model's or the machine's drift between the runs); then the baseline replayed as it ran."""
    baseline, rows = os.path.join(out, f"{label}-baseline"), []
    for change, settings in changes.items():
        name = _name(change, settings)
        real = os.path.join(out, f"{label}-{name}-real")
        if not os.path.isdir(real):
            continue
        timing = os.path.join(out, f"{label}-{name}-whatif_s")
        whatif_s = float(open(timing).read()) if os.path.exists(timing) else float("nan")
        rows.append(compare(label, change, real, os.path.join(out, f"{label}-{name}-predicted"), whatif_s))
        own = os.path.join(out, f"{label}-{name}-predicted-own-costs")
        if not os.path.isdir(own):
            whatif(baseline, _settings(settings), own, step_costs_from=real)
        rows.append(compare(label, change + " (timed by the re-run's steps)", real, own, float("nan")))
    if len(changes) == len(CHANGES[mode]):
        same = os.path.join(out, f"{label}-same-predicted")
        if not os.path.isdir(same):
            started = time.perf_counter()
            whatif(baseline, [], same)
            with open(same + "-whatif_s", "w") as f:
                f.write(str(time.perf_counter() - started))
        whatif_s = float(open(same + "-whatif_s").read()) if os.path.exists(same + "-whatif_s") else float("nan")
        rows.append(compare(label, "none (the baseline itself)", baseline, same, whatif_s))
        rerun = os.path.join(out, f"{label}-rerun")
        if os.path.isdir(rerun):
            rows.append(compare(label, "none, run again for real (the machine's noise)", baseline, rerun,
                                float("nan")))
    return rows


HEADER = ("| run | change | steps real / predicted | schedule equal: step for step / aligned | e2e error median / p90 "
          "| TTFT error median | preemptions real / predicted | real run (s) | what-if (s) |\n"
          "|---|---|---|---|---|---|---|---|---|")


def _line(r: Row) -> str:
    return (f"| {r.mode} | {r.change} | {r.real_steps} / {r.predicted_steps} "
            f"| {100 * r.schedule_equal:.1f} / {100 * r.schedule_aligned:.1f} % "
            f"| {100 * r.e2e_error_median:.1f} % / {100 * r.e2e_error_p90:.1f} % | {100 * r.ttft_error_median:.1f} % "
            f"| {r.real_preemptions} / {r.predicted_preemptions} | {r.real_duration_s:.1f} | {r.whatif_s:.2f} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=("offline", "served", "both"), default="both")
    parser.add_argument("--num-requests", type=int, default=200)
    parser.add_argument("--rates", default="2,4", help="served: request rates, comma-separated (requests/s)")
    parser.add_argument("--out", default=None, help="where the traces go (default: a temporary directory)")
    parser.add_argument("--json", default=None, metavar="FILE", help="also write the rows as JSON")
    parser.add_argument("--analyse", action="store_true", help="run nothing: the rows of the runs already in --out")
    parser.add_argument("--pin", action="store_true",
                        help="served: the engine core alone on the first CPU with one thread, the API server and "
                             "the client on the others")
    args = parser.parse_args(argv)
    out = args.out or tempfile.mkdtemp(prefix="whatif-fidelity-")
    print(f"traces in {out}\n{HEADER}", flush=True)
    rows: list[Row] = []
    if args.analyse:
        labels = {"offline": ["offline"], "served": [f"served-{float(r):g}rps" for r in args.rates.split(",")]}
        for mode in (("offline", "served") if args.mode == "both" else (args.mode,)):
            rows += [r for label in labels[mode] for r in analyse(mode, label, out, CHANGES[mode])]
    elif args.mode in ("offline", "both"):
        workload = offline_workload(args.num_requests)
        # The process's first engine compiles kernels in its first step (31.7 s once): not in the baseline.
        run_offline(OFFLINE_ENGINE, workload[:16], tempfile.mkdtemp(prefix="whatif-fidelity-warmup-"))
        rows += evaluate("offline", "offline", OFFLINE_ENGINE,
                         lambda engine, trace_dir: run_offline(engine, workload, trace_dir), out)
    if args.mode in ("served", "both") and not args.analyse:
        for rate in (float(r) for r in args.rates.split(",")):
            engine = {**SERVED_ENGINE, "cpu_threads": 1} if args.pin else SERVED_ENGINE
            rows += evaluate("served", f"served-{rate:g}rps", engine,
                             lambda engine, trace_dir: run_served(engine, rate, args.num_requests, trace_dir,
                                                                  pin=args.pin), out)
    print(f"\n{HEADER}\n" + "\n".join(_line(r) for r in rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump([asdict(r) for r in rows], f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
