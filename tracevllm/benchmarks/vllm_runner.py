"""vLLM's side of ``tracevllm bench throughput --backend vllm``: one timed batch through vLLM's own ``LLM``.

Run as a file by a python that has vLLM (and need not have tracevllm), in a fresh process per run:

    /path/vllm-venv/bin/python tracevllm/benchmarks/vllm_runner.py JOB.json RESULT.json

so this file imports only the standard library at the top, and vllm inside ``main``. It also defines
the two messages that both engines' runners share (tracevllm's is ``tracevllm_runner.py``):

    BenchJob (JSON)  ->  runner: build LLM (timed: startup_s), warm up, generate (timed: elapsed_s)
                     ->  BenchResult (JSON)
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from dataclasses import dataclass, field


class _JsonFile:
    """A dataclass written to and read from a file as one JSON object."""

    def dump(self, path: str) -> None:
        with open(path, "w") as f:
            json.dump(dataclasses.asdict(self), f)

    @classmethod
    def load(cls, path: str):
        with open(path) as f:
            return cls(**json.load(f))


@dataclass
class BenchJob(_JsonFile):
    """What to run: the same prompts (token ids) and output lengths for either engine."""

    model: str  # a Hugging Face directory
    dtype: str  # resolved: "bfloat16", "float32" or "float16", never "auto"
    max_model_len: int
    seed: int
    prompts: list[list[int]]
    output_lens: list[int]
    warmup_prompts: list[list[int]]
    warmup_output_lens: list[int]
    engine_options: dict = field(default_factory=dict)  # tracevllm's EngineArgs fields, as LLM(**options)
    vllm_options: dict = field(default_factory=dict)  # more vllm.LLM keywords


@dataclass
class BenchResult(_JsonFile):
    """One engine's run: start-up (engine construction) and the timed generate, in seconds."""

    engine: str
    startup_s: float | None
    elapsed_s: float
    num_requests: int
    num_prompt_tokens: int
    num_output_tokens: int

    @property
    def output_throughput(self) -> float:
        return self.num_output_tokens / self.elapsed_s

    @property
    def total_throughput(self) -> float:
        return (self.num_prompt_tokens + self.num_output_tokens) / self.elapsed_s


def _generate(llm, prompts: list[list[int]], output_lens: list[int]) -> float:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = [SamplingParams(temperature=1.0, ignore_eos=True, max_tokens=n) for n in output_lens]
    start = time.perf_counter()
    outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    for i, (output, n) in enumerate(zip(outputs, output_lens)):
        got = len(output.outputs[0].token_ids)
        if got != n:
            raise RuntimeError(f"vLLM gave request {i} {got} output tokens, not {n}")
    return elapsed


def main(argv: list[str]) -> int:
    job_path, result_path = argv
    # Python put this file's folder first on sys.path; its serve.py or kernels.py must not shadow
    # a module of that name that vLLM or transformers may import.
    if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
        sys.path.pop(0)
    from vllm import LLM

    job = BenchJob.load(job_path)
    start = time.perf_counter()
    llm = LLM(model=job.model, dtype=job.dtype, seed=job.seed, max_model_len=job.max_model_len, **job.vllm_options)
    startup = time.perf_counter() - start
    _generate(llm, job.warmup_prompts, job.warmup_output_lens)
    elapsed = _generate(llm, job.prompts, job.output_lens)
    BenchResult("vllm", startup, elapsed, len(job.prompts), sum(map(len, job.prompts)),
                sum(job.output_lens)).dump(result_path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
