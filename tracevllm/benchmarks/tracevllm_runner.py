"""tracevllm's side of ``tracevllm bench throughput --backend vllm``, as ``vllm_runner.py`` is vLLM's.

    python -m tracevllm.benchmarks.tracevllm_runner JOB.json RESULT.json

in a fresh process per run, so that neither engine inherits the other's warm caches, threads or
memory: ``LLM(**job.engine_options)`` (timed: start-up), a warm-up generate, then the timed generate
of the job's prompts; the ``BenchResult`` goes to RESULT.json.
"""

from __future__ import annotations

import sys
import time

from tracevllm.benchmarks.vllm_runner import BenchJob, BenchResult


def main(argv: list[str]) -> int:
    from tracevllm import LLM
    from tracevllm.benchmarks.throughput import BenchRequest, run_tracevllm

    job_path, result_path = argv
    job = BenchJob.load(job_path)
    start = time.perf_counter()
    llm = LLM(**job.engine_options)
    startup = time.perf_counter() - start
    run_tracevllm(llm, [BenchRequest(p, n) for p, n in zip(job.warmup_prompts, job.warmup_output_lens)], use_tqdm=False)
    elapsed = run_tracevllm(llm, [BenchRequest(p, n) for p, n in zip(job.prompts, job.output_lens)], use_tqdm=False)
    llm.llm_engine.shutdown()
    BenchResult("tracevllm", startup, elapsed, len(job.prompts), sum(map(len, job.prompts)),
                sum(job.output_lens)).dump(result_path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
