"""tracevllm at an old commit and at this one, alternated back to back, with vLLM once between them:
"no slower than before", and each commit's ratio to vLLM, in ``bench throughput --backend vllm``'s
protocol (each run a fresh process: start-up, a warm-up generate, the timed generate).

    git worktree add --detach /tmp/old OLD_COMMIT
    TRACEVLLM_VLLM_PYTHON=/path/vllm-venv/bin/python \\
        python benchmarks/compare_commits.py --old /tmp/old --workload mixed --dtype float32 [engine flags]

The runs go old, new, vLLM, new, old (vLLM's code is the same for both commits, and its runs are
the slow ones), so that drift over the runs falls on both commits alike; the lines printed are each
run's, then each engine's median and the two ratios. Without a vLLM python (``--no-vllm``), only the
two commits.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import subprocess
import sys
import tempfile

from tracevllm.benchmarks.compare import TRACEVLLM_RUNNER, VLLM_RUNNER, check_vllm, default_vllm_python, run_line, summarize
from tracevllm.benchmarks.throughput import _bench_job, add_cli_args, make_requests, resolve_workload
from tracevllm.benchmarks.vllm_runner import BenchResult
from tracevllm.engine.arg_utils import EngineArgs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old", required=True, help="a checkout of the old commit (git worktree add --detach DIR COMMIT)")
    parser.add_argument("--no-vllm", action="store_true", help="only the two commits")
    add_cli_args(parser)
    EngineArgs.add_cli_args(parser)
    args = parser.parse_args(argv)
    workload = resolve_workload(args)
    engine_args = EngineArgs.from_cli_args(args)
    config = engine_args.create_engine_config()
    requests = make_requests(args.num_prompts, args.input_len, args.output_len, config.model_config.vocab_size,
                             args.dataset_seed)
    job = _bench_job(args, engine_args, config, requests)
    # Only the options given: the old commit's EngineArgs may not know the newer ones.
    defaults = dataclasses.asdict(EngineArgs())
    job.engine_options = {k: v for k, v in job.engine_options.items() if v != defaults[k]}
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    # Each commit's runs start in its own checkout: ``python -m`` puts the working directory before
    # PYTHONPATH, so a run started elsewhere (say in this checkout) would import that tracevllm.
    checkouts = {"tracevllm old": os.path.abspath(args.old), "tracevllm new": here}
    commands = {name: ["env", f"PYTHONPATH={path}", *TRACEVLLM_RUNNER] for name, path in checkouts.items()}
    for name, path in checkouts.items():
        imported = subprocess.run(["env", f"PYTHONPATH={path}", sys.executable, "-c",
                                   "import tracevllm; print(tracevllm.__file__)"],
                                  cwd=path, capture_output=True, text=True, check=False).stdout.strip()
        if not imported.startswith(path + os.sep):
            raise SystemExit(f"{name}: {path} imports tracevllm from {imported or '?'}, not from itself")
        print(f"{name}: {imported}")
    order = ["tracevllm old", "tracevllm new", "tracevllm new", "tracevllm old"]
    env = dict(os.environ)
    if not args.no_vllm:
        python = args.vllm_python or default_vllm_python()
        print(f"vLLM {check_vllm(python)} ({python})")
        commands["vllm"] = [python, VLLM_RUNNER]
        order.insert(2, "vllm")
        env.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
        env.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    results: dict[str, list[BenchResult]] = {name: [] for name in commands}
    with tempfile.TemporaryDirectory() as tmp:
        job_path = os.path.join(tmp, "job")
        job.dump(job_path)
        for i, name in enumerate(order):
            result_path = os.path.join(tmp, f"{i}.out")
            subprocess.run([*commands[name], job_path, result_path], check=True, env=env, cwd=checkouts.get(name, tmp))
            results[name].append(BenchResult.load(result_path))
            print(run_line(f"{name}, run {len(results[name])}", results[name][-1]), flush=True)
    latency = args.workload == "latency"
    print("\n".join(summarize(results, workload.headline, latency)[:len(results)]))
    pairs = [("tracevllm new", "tracevllm old")]
    if "vllm" in results:
        pairs += [("tracevllm old", "vllm"), ("tracevllm new", "vllm")]
    for a, b in pairs:
        print(summarize({a: results[a], b: results[b]}, workload.headline, latency)[-1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
