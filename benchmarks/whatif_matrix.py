"""Does ``tracevllm traces whatif`` hold on settings it never saw? A held-out matrix: per workload, one
recorded run, a prediction of each configuration from that run's trace, and a real run of each.

    python benchmarks/whatif_matrix.py --out /tmp/wm                    # offline: 3 workloads x 14 configurations
    python benchmarks/whatif_matrix.py --served --out /tmp/wm           # served: 7 configurations, each run twice
    python benchmarks/whatif_matrix.py --out /tmp/wm --analyse [--served]   # run nothing: score the runs in --out

**Offline.** Three workloads of token-id prompts, greedy with ``ignore_eos`` (so every run produces the
same tokens): ``chat`` (64 prompts of 24-200 tokens, 8-64 out), ``shared-prefix`` (40 prompts of 24-400
tokens, a third behind one 96-token prefix, 8-96 out: the issue's workload) and ``long-prompts`` (16
prompts of 600-1000 tokens, 8-32 out). Every request has a priority (0-2), which only the ``priority``
policy reads. Each run is a fresh process, as a user's script is: its first steps pay whatever a
process pays once, and the recorded run's one-time costs are in its trace for the fit to leave out.

**Served.** ``tracevllm serve`` fed by ``tracevllm bench serve`` (Poisson arrivals, the same seed every
run), the engine core pinned alone on one core with one thread (``--pin`` of whatif_fidelity.py). A
served step's batch depends on when each request's bytes reach the engine core, which moves between
two runs of one configuration: every configuration runs twice for real, and each row puts the
prediction's error against the first run beside the second run's (the machine's own noise). The second
runs come in a second pass, after every configuration's first: a prediction is timed on the recorded
run, made minutes before the real run it is held against, and a machine that drifts in between (one
measured 2-5 % slower after its first run, docs/whatif.md) moves the prediction's error; real runs made
back to back share the machine's state and would hide that drift from the noise they measure. Each
row's verdict says how long its real runs' start-up steps took against the recording's
(``start_up_speed``): the drift the real-vs-real difference cannot show.

Each row: the schedule (the share of steps whose batch, by arrival rank, is the same step for step,
and once aligned), the per-request e2e error |predicted - real| / real (median, p90) and the TTFT
error's median, the preemptions, the real run's duration and the what-if's (in this process, imports
loaded). The last lines pool the errors of every request of every held-out row.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from whatif_fidelity import HEADER, Row, _errors, _line, _p90, _ranks, _settings, compare, run_served  # noqa: E402

from tracevllm.step_cost import StepProfile  # noqa: E402
from tracevllm.whatif.command import whatif  # noqa: E402
from viz.fit import recorded_profile  # noqa: E402
from viz.trace_loader import load_trace  # noqa: E402
from viz.model import Trace  # noqa: E402

BLOCK_SIZE = 16


@dataclass(frozen=True)
class Workload:
    num_requests: int
    prompt_tokens: tuple[int, int]
    output_tokens: tuple[int, int]
    shared_prefix: int  # tokens, before every third prompt (0: none)
    seed: int

    def requests(self) -> list[tuple[list[int], int, int]]:
        """(prompt token ids, output tokens, priority) per request."""
        rng = random.Random(self.seed)
        prefix = [rng.randrange(1000, 40000) for _ in range(self.shared_prefix)]
        out = []
        for i in range(self.num_requests):
            length = rng.randrange(*self.prompt_tokens)
            head = prefix if self.shared_prefix and i % 3 == 0 else []
            body = [rng.randrange(1000, 40000) for _ in range(max(1, length - len(head)))]
            out.append((head + body, rng.randrange(*self.output_tokens), rng.randrange(3)))
        return out

    def max_model_len(self) -> int:
        """The longest request's tokens, prompt and output, rounded up to a block and one more: the
        KV cache must hold a request of max_model_len tokens, so a small cache needs a small one."""
        return BLOCK_SIZE * (max(math.ceil((len(p) + m) / BLOCK_SIZE) for p, m, _ in self.requests()) + 1)

    def engine(self, **settings) -> dict:
        return {**BASE, "max_model_len": self.max_model_len(), **settings}


WORKLOADS = {
    "chat": Workload(64, (24, 200), (8, 64), 0, seed=1),
    "shared-prefix": Workload(40, (24, 400), (8, 96), 96, seed=2),
    "long-prompts": Workload(16, (600, 1000), (8, 32), 0, seed=3),
}
# The recorded configuration (max_model_len: the workload's); every other one is predicted from its
# trace. 2 CPU threads, pinned: left to itself, the engine picks its count by what else runs at its start.
BASE = dict(max_num_batched_tokens=256, max_num_seqs=32, block_size=BLOCK_SIZE, cpu_threads=2)


def configurations(workload: Workload) -> dict[str, dict]:
    """The held-out settings. The KV caches are sized on the workload's max_model_len, so that they
    preempt whatever the workload: room for two of its longest requests, and for one and a half."""
    blocks = workload.max_model_len() // BLOCK_SIZE
    whole_prompts = max(workload.max_model_len(), 256)
    return {
        "token budget 256 -> 64": {"max_num_batched_tokens": 64},
        "token budget 256 -> 128": {"max_num_batched_tokens": 128},
        "token budget 256 -> 512": {"max_num_batched_tokens": 512},
        "max_num_seqs 32 -> 4": {"max_num_seqs": 4},
        "max_num_seqs 32 -> 12": {"max_num_seqs": 12},
        f"KV cache {2 * blocks} blocks": {"num_gpu_blocks_override": 2 * blocks},
        f"KV cache {3 * blocks // 2} blocks": {"num_gpu_blocks_override": 3 * blocks // 2},
        "prefix caching off": {"enable_prefix_caching": False},
        f"chunked prefill off (budget {whole_prompts})": {"enable_chunked_prefill": False,
                                                          "max_num_batched_tokens": whole_prompts},
        "long prefills capped at 64 tokens": {"long_prefill_token_threshold": 64},
        "priority scheduling": {"scheduling_policy": "priority"},
        "priority, 8 sequences": {"scheduling_policy": "priority", "max_num_seqs": 8},
        "budget 128, 12 sequences, KV 1.5 requests": {"max_num_batched_tokens": 128, "max_num_seqs": 12,
                                                      "num_gpu_blocks_override": 3 * blocks // 2},
        "block size 32": {"block_size": 32},
    }


SERVED_BASE = dict(max_num_batched_tokens=256, max_num_seqs=32, max_model_len=256, block_size=BLOCK_SIZE, cpu_threads=1)
SERVED_CHANGES = {
    "token budget 256 -> 64": ({"max_num_batched_tokens": 64}, 1.0),
    "max_num_seqs 32 -> 8": ({"max_num_seqs": 8}, 1.0),
    "KV cache 24 blocks (preempts)": ({"num_gpu_blocks_override": 24}, 1.0),
    "prefix caching off": ({"enable_prefix_caching": False}, 1.0),
    "arrivals x2 (--arrival-scale 2)": ({}, 2.0),
    "arrivals x2, budget 64": ({"max_num_batched_tokens": 64}, 2.0),
}
SERVED_RATE = 1.0
SERVED_REQUESTS = 32


# ---- the runs --------------------------------------------------------------------------------------

def record_offline(workload: str, engine: dict, trace_dir: str) -> None:
    """One run in a fresh process (this script, ``--record-one``), as a user's script runs."""
    spec = json.dumps({"workload": workload, "engine": engine, "trace_dir": trace_dir})
    subprocess.run([sys.executable, os.path.abspath(__file__), "--record-one", spec], check=True,
                   stdout=subprocess.DEVNULL)


def _record_one(spec: str) -> None:
    from tracevllm import LLM, SamplingParams

    spec = json.loads(spec)
    requests = WORKLOADS[spec["workload"]].requests()
    llm = LLM(trace_out=spec["trace_dir"], **spec["engine"])
    llm.generate([{"prompt_token_ids": p} for p, _, _ in requests],
                 [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True) for _, m, _ in requests],
                 use_tqdm=False, priority=[priority for _, _, priority in requests])
    llm.llm_engine.shutdown()


def _slug(change: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in change).strip("-")


def _predict(baseline: str, settings: list[str], output: str, arrival_scale: float = 1.0) -> None:
    """Predicted again at each call (a fraction of a second): ``--analyse`` scores today's what-if."""
    shutil.rmtree(output, ignore_errors=True)
    started = time.perf_counter()
    whatif(baseline, settings, output, arrival_scale=arrival_scale)
    with open(output + ".whatif_s", "w") as f:
        f.write(str(time.perf_counter() - started))


def _whatif_s(output: str) -> float:
    return float(open(output + ".whatif_s").read()) if os.path.exists(output + ".whatif_s") else float("nan")


def _by_rank(trace: Trace, field: str) -> dict[int, float]:
    """Each request's ``field`` ("e2e" or "ttft") by its arrival rank (ids differ between runs)."""
    rank = _ranks(trace)
    return {rank[r.request_id]: getattr(r, field) for r in trace.requests.values() if getattr(r, field) is not None}


def offline(out: str, run: bool) -> tuple[list[tuple[Row, list[float], list[float]]], list[Row]]:
    """Per workload and configuration: (row, e2e errors, TTFT errors); and per workload, the recorded
    configuration run a second time, compared with the first (no prediction beats the machine's own
    noise). The runs are made first if ``run``."""
    rows, noise = [], []
    for name, workload in WORKLOADS.items():
        baseline = os.path.join(out, f"{name}-recorded")
        if run and not os.path.isdir(baseline):
            record_offline(name, workload.engine(), baseline)
        for change, settings in configurations(workload).items():
            real = os.path.join(out, f"{name}-{_slug(change)}-real")
            predicted = os.path.join(out, f"{name}-{_slug(change)}-predicted")
            if run and not os.path.isdir(real):
                record_offline(name, workload.engine(**settings), real)
            if not os.path.isdir(real):
                continue
            _predict(baseline, _settings(settings), predicted)
            row = compare(name, change, real, predicted, _whatif_s(predicted))
            real_trace, predicted_trace = load_trace(real), load_trace(predicted)
            errors = {field: _errors(_by_rank(real_trace, field), _by_rank(predicted_trace, field))
                      for field in ("e2e", "ttft")}
            rows.append((row, errors["e2e"], errors["ttft"]))
            print(_line(row), flush=True)
        rerun = os.path.join(out, f"{name}-recorded-again")
        if run and not os.path.isdir(rerun):
            record_offline(name, workload.engine(), rerun)
        if os.path.isdir(rerun):
            noise.append(compare(name, "none, the recorded configuration run again (the machine's noise)", baseline,
                                 rerun, float("nan")))
            print(_line(noise[-1]), flush=True)
    return rows, noise


def served(out: str, run: bool) -> list[tuple[Row, Row]]:
    """Per configuration: (the prediction against the first real run, the second real run against the
    first), the runs made first if ``run``."""
    baseline = os.path.join(out, "served-recorded")
    if run and not os.path.isdir(baseline):
        run_served(SERVED_BASE, SERVED_RATE, SERVED_REQUESTS, baseline, pin=True)
    changes = {"none (the recorded configuration)": ({}, 1.0), **SERVED_CHANGES}
    # Two passes: every configuration's first real run, then every one's second, so that the two real runs
    # of a configuration are as far apart as the recorded run and its re-runs (the module docstring).
    for i in (1, 2):
        for change, (settings, scale) in changes.items():
            real = os.path.join(out, f"served-{_slug(change)}-real{i}")
            if run and not os.path.isdir(real):
                run_served({**SERVED_BASE, **settings}, SERVED_RATE * scale, SERVED_REQUESTS, real, pin=True)
    pairs = []
    for change, (settings, scale) in changes.items():
        reals = [os.path.join(out, f"served-{_slug(change)}-real{i}") for i in (1, 2)]
        if not all(os.path.isdir(r) for r in reals):
            continue
        predicted = os.path.join(out, f"served-{_slug(change)}-predicted")
        _predict(baseline, _settings(settings), predicted, arrival_scale=scale)
        pair = (compare("served", change, reals[0], predicted, _whatif_s(predicted)),
                compare("served", change + ": second real run", reals[0], reals[1], float("nan")))
        print(_line(pair[0]) + "\n" + _line(pair[1]), flush=True)
        pairs.append(pair)
    return pairs


def start_up_speed(recorded: StepProfile | None, real: str) -> float:
    """How long ``real``'s start-up steps took against the recording's (its ``recorded`` profile): the
    geometric mean, over the ladder sizes both timed (``Profile steps``), of real / recorded. A what-if
    keeps the recorded run's pace, so a machine that ran 20 % faster or slower by the time of the real
    run moves the prediction's error that much, while its two real runs, minutes apart, may agree (nan:
    a trace without a profile)."""
    profile = recorded_profile(load_trace(real))
    if recorded is None or profile is None:
        return float("nan")
    old, new = ({("prefill", n): t for n, t in p.prefill} | {("decode", n): t for n, t in p.decode}
                for p in (recorded, profile))
    shared = old.keys() & new.keys()
    return math.exp(statistics.mean(math.log(new[k] / old[k]) for k in shared)) if shared else float("nan")


def _pooled(rows: list[tuple[Row, list[float], list[float]]]) -> str:
    e2e = sorted(e for _, errors, _ in rows for e in errors)
    ttft = sorted(e for _, _, errors in rows for e in errors)
    steps = sum(r.real_steps for r, _, _ in rows)
    equal = sum(r.schedule_equal * max(r.real_steps, r.predicted_steps) for r, _, _ in rows)
    slowest = max(r.whatif_s / r.real_duration_s for r, _, _ in rows)
    return (f"pooled over {len(rows)} held-out rows, {len(e2e)} requests, {steps} steps: e2e error median "
            f"{100 * statistics.median(e2e):.1f} % / p90 {100 * _p90(e2e):.1f} %, TTFT error median "
            f"{100 * statistics.median(ttft):.1f} %, schedule equal step for step on "
            f"{100 * equal / steps:.1f} % of the steps; row medians: e2e worst "
            f"{100 * max(r.e2e_error_median for r, _, _ in rows):.1f} %, p90 worst "
            f"{100 * max(r.e2e_error_p90 for r, _, _ in rows):.1f} %, TTFT worst "
            f"{100 * max(r.ttft_error_median for r, _, _ in rows):.1f} %; the what-if took at most 1/"
            f"{1 / slowest:.0f} of the real run")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=None, help="where the traces go (default: a temporary directory)")
    parser.add_argument("--served", action="store_true", help="the served matrix instead of the offline one")
    parser.add_argument("--analyse", action="store_true", help="run nothing: score the runs already in --out")
    parser.add_argument("--json", default=None, metavar="FILE", help="also write the rows as JSON")
    parser.add_argument("--record-one", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.record_one:
        _record_one(args.record_one)
        return 0
    out = args.out or tempfile.mkdtemp(prefix="whatif-matrix-")
    os.makedirs(out, exist_ok=True)
    print(f"traces in {out}\n{HEADER}", flush=True)
    if args.served:
        pairs = served(out, run=not args.analyse)
        print(f"\n{HEADER}\n" + "\n".join(_line(r) for pair in pairs for r in pair))
        recorded = recorded_profile(load_trace(os.path.join(out, "served-recorded")))
        for prediction, noise in pairs:
            margin = 100 * (prediction.e2e_error_median - noise.e2e_error_median)
            speeds = " / ".join(f"{start_up_speed(recorded, os.path.join(out, f'served-{_slug(prediction.change)}-real{i}')):.2f}"
                                for i in (1, 2))
            print(f"{prediction.change}: e2e median {100 * prediction.e2e_error_median:.1f} % against "
                  f"{100 * noise.e2e_error_median:.1f} % real-vs-real: "
                  f"{'within' if margin <= 3 else 'NOT within'} the noise + 3 points ({margin:+.1f}); "
                  f"the real runs' start-up steps took {speeds} x the recording's")
        found = [asdict(r) for pair in pairs for r in pair]
    else:
        rows, noise = offline(out, run=not args.analyse)
        print(f"\n{HEADER}\n" + "\n".join(_line(r) for r in [r for r, _, _ in rows] + noise) + "\n\n" + _pooled(rows))
        found = [asdict(r) for r in [r for r, _, _ in rows] + noise]
    if args.json:
        with open(args.json, "w") as f:
            json.dump(found, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
