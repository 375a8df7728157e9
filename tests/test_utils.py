"""How processes start (tracevllm/utils.py): a script written as vLLM's examples are, with the engine
created at its top level, works with worker processes (they are forked); when they must be
spawned, an unguarded script gets an error that names the fix, at once, and a guarded one works."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
import time

import pytest

from tracevllm import LLM, SamplingParams
from tracevllm.utils import MULTIPROC_METHOD_ENV, _is_main_guard

pytestmark = pytest.mark.slow

PROMPT = "The capital of France is"
GREEDY = SamplingParams(temperature=0, max_tokens=8)
TOP_LEVEL = """
    from tracevllm import LLM, SamplingParams

    llm = LLM({model}dtype="float32", device="cpu", max_model_len=256, tensor_parallel_size={tp},
              distributed_executor_backend="mp")
    output = llm.generate({prompt!r}, SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)[0]
    print("TOKENS", list(output.outputs[0].token_ids))
"""


def run_script(tmp_path, source: str, method: str | None = None) -> subprocess.CompletedProcess:
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(source))
    env = {k: v for k, v in os.environ.items() if k != MULTIPROC_METHOD_ENV}
    env["TMPDIR"] = str(tmp_path)  # the run's socket files, if any were left, would be here
    if method:
        env[MULTIPROC_METHOD_ENV] = method
    return subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=540)


def tokens_of(result: subprocess.CompletedProcess) -> list[int]:
    assert result.returncode == 0, result.stderr[-3000:]
    return ast.literal_eval(next(line for line in result.stdout.splitlines() if line.startswith("TOKENS"))[7:])


def test_a_top_level_tp3_script_gives_the_single_process_tokens(tmp_path, bundled_model_dir):
    expected = LLM(dtype="float32", device="cpu", max_model_len=256).generate(PROMPT, GREEDY, use_tqdm=False)
    result = run_script(tmp_path, TOP_LEVEL.format(model="", tp=3, prompt=PROMPT))
    assert tokens_of(result) == list(expected[0].outputs[0].token_ids)
    assert not list(tmp_path.glob("tracevllm-*"))


def test_spawning_for_an_unguarded_script_is_an_error_that_names_the_fix(tmp_path, bundled_model_dir):
    started = time.monotonic()
    result = run_script(tmp_path, TOP_LEVEL.format(model="", tp=3, prompt=PROMPT), method="spawn")
    assert result.returncode == 1
    assert time.monotonic() - started < 120  # no model is loaded: the check comes before any process
    last_line = result.stderr.strip().splitlines()[-1]
    assert last_line.startswith("RuntimeError: tracevllm must spawn its processes here")
    assert f"{tmp_path / 'script.py'} again, which would run line 4 again" in last_line
    assert 'under `if __name__ == "__main__":`' in last_line
    assert "died with exit code" not in result.stderr
    assert not list(tmp_path.glob("tracevllm-*"))


def test_a_guarded_script_works_with_spawned_workers(tmp_path, tiny_checkpoint):
    path = tiny_checkpoint("llama")
    expected = LLM(path, dtype="float32", device="cpu", max_model_len=256).generate(PROMPT, GREEDY, use_tqdm=False)
    body = textwrap.indent(textwrap.dedent(TOP_LEVEL.format(model=f"{path!r}, ", tp=2, prompt=PROMPT)), "    ")
    result = run_script(tmp_path, 'if __name__ == "__main__":\n' + body, method="spawn")
    assert tokens_of(result) == list(expected[0].outputs[0].token_ids)


@pytest.mark.parametrize("source, guarded", [
    ('if __name__ == "__main__":\n    main()', True),
    ("if '__main__' == __name__:\n    main()", True),
    ('if __name__ != "__main__":\n    main()', False),
    ("main()", False),
])
def test_what_counts_as_a_main_guard(source, guarded):
    assert _is_main_guard(ast.parse(source).body[0]) == guarded
