"""The maintainers' scripts in the repository's benchmarks/, run as files as the docs run them: each answers
--help, and operator_profile.py, cpu_prefill.py and cpu_decode.py run on tracevllm at tiny sizes (vLLM is too slow
to start in a test)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tracevllm.optimizations import OptimizationConfig

LAB = Path(__file__).parents[2] / "benchmarks"
SCRIPT = LAB / "operator_profile.py"


@pytest.mark.parametrize("script", sorted(p.name for p in LAB.glob("*.py")))
def test_every_lab_script_imports_and_answers_help(script):
    """Each script outside the package still imports what it names there (a rename in tracevllm/ would
    break it), run from the repository root as the docs run it."""
    result = subprocess.run([sys.executable, str(Path("benchmarks") / script), "--help"], cwd=LAB.parent,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: ")


def test_step_profile_lists_a_decode_steps_operators(tiny_checkpoint):
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--model", tiny_checkpoint("llama"), "--dtype", "float32",
         "--num-seqs", "3", "--prompt-len", "20", "--steps", "4", "--top", "40"],
        capture_output=True, text=True, timeout=300, check=True,
    ).stdout
    assert "tracevllm: 3 sequences of 20 prompt tokens, float32, 4 decode steps" in out
    step_ms = float(re.search(r"decode step: ([\d.]+) ms \(unprofiled\)", out).group(1))
    assert step_ms > 0
    rows = dict(re.findall(r"^\| `([^`]+)` \| [-\d.]+ \| (-?\d+) \|$", out, re.M))
    # The tiny Llama has 2 layers: a decode step attends once per layer (all rows in one call of the
    # cpu_paged_decode op, or in one SDPA call without it: the 3 rows' spans are alike).
    in_place = OptimizationConfig.from_names().enabled("cpu_paged_decode")  # the script inherits the environment
    attention = "tracevllm::paged_decode_attention" if in_place else "aten::_scaled_dot_product_flash_attention_for_cpu"
    assert rows[attention] == "2"


def test_step_profile_of_the_prefill_is_per_thousand_prompt_tokens(tiny_checkpoint):
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--model", tiny_checkpoint("llama"), "--dtype", "float32", "--phase", "prefill",
         "--num-seqs", "4", "--prompt-len", "250", "--top", "40"],
        capture_output=True, text=True, timeout=300, check=True,
    ).stdout
    assert "tracevllm: 4 sequences of 250 prompt tokens, float32, prefill" in out
    assert float(re.search(r"1,000 prompt tokens: ([\d.]+) ms \(unprofiled\)", out).group(1)) > 0
    rows = dict(re.findall(r"^\| `([^`]+)` \| [-\d.]+ \| (-?\d+) \|$", out, re.M))
    # 1,000 prompt tokens are 4 sequences here: one SDPA each in each of the 2 layers.
    assert rows["aten::_scaled_dot_product_flash_attention_for_cpu"] == "8"


def test_step_profile_needs_a_model_directory_for_vllm():
    result = subprocess.run([sys.executable, str(SCRIPT), "--engine", "vllm"], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 2 and "--engine vllm needs --model DIR" in result.stderr


def test_cpu_prefill_benchmark_runs():
    """benchmarks/cpu_prefill.py (the figures of docs/perf-log.md's prefill op sections), on tiny sizes: the
    op with its products on AVX512-BF16 dot products, and on AMX tiles where the CPU has them."""
    from tracevllm.attention.ops import cpu_amx_prefill

    if not cpu_amx_prefill.supports(64, torch.bfloat16, amx=False):
        pytest.skip("this CPU has no AVX512-BF16")
    script = SCRIPT.with_name("cpu_prefill.py")
    out = subprocess.run([sys.executable, str(script), "--num-seqs", "2", "--prompt-len", "130", "--layers", "2",
                          "--iters", "1"], capture_output=True, text=True, timeout=300, check=True).stdout
    assert "2 prompts of 130 tokens, 2 layers, heads 9:3:64, bf16" in out
    assert re.search(r"SDPA / op, products on vec: [\d.]+x", out)
    assert bool(re.search(r"SDPA / op, products on amx: [\d.]+x", out)) == cpu_amx_prefill.supports(64, torch.bfloat16)


def test_cpu_decode_benchmark_runs():
    """benchmarks/cpu_decode.py (the figures of docs/perf-log.md's AMX and AVX512-BF16 decode sections), on
    tiny sizes, with the bf16 op this CPU has."""
    from tracevllm.attention.ops import cpu_amx_decode, cpu_vec_decode

    op = next((name for name, module in (("cpu_amx_decode", cpu_amx_decode), ("cpu_vec_decode", cpu_vec_decode))
               if module.supports(9, 3, 64, torch.bfloat16)), None)
    if op is None:
        pytest.skip("this CPU has neither AMX tiles nor AVX512-BF16")
    script = SCRIPT.with_name("cpu_decode.py")
    out = subprocess.run([sys.executable, str(script), "--num-seqs", "3", "--context", "20:150", "--layers", "2",
                          "--rounds", "1"], capture_output=True, text=True, timeout=300, check=True).stdout
    assert re.search(r"3 decode rows, 20:150 keys each \([\d,]+ in all\), 2 layers, heads 9:3:64, block size 16", out)
    assert re.search(rf"cpu_paged_decode / {op}: [\d.]+x", out)


def test_cpu_gemm_benchmark_runs():
    """benchmarks/cpu_gemm.py (docs/perf-log.md's float32 oneDNN table), one row, one repeat."""
    result = subprocess.run([sys.executable, "benchmarks/cpu_gemm.py", "--rows", "2", "--weights", "1", "--repeats", "1"],
                            cwd=LAB.parent, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert re.search(r"rows +2 +qkv [\d.]+ [\d.]+ \([\d.]+\).*lm_head", result.stdout)
