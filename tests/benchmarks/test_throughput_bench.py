"""``tracevllm bench throughput --compare-tracing`` runs (a smoke test: its figures are not checked)."""

from __future__ import annotations

import re

from tracevllm.entrypoints.cli import main


def test_compare_tracing_prints_a_median_per_level(tiny_checkpoint, capsys):
    assert main(["bench", "throughput", "--compare-tracing", "--model", tiny_checkpoint("llama"), "--dtype",
                 "float32", "--num-prompts", "2", "--input-len", "8", "--output-len", "4"]) == 0
    out = capsys.readouterr().out
    assert len(re.findall(r"\[tracevllm, tracing (off|request|step)\] Throughput", out)) == 6
    for level in ("off", "request", "step"):
        assert re.search(rf"tracing {level}: median [0-9.]+ output tokens/s \(.*\), [0-9.]+ % of off", out)


def parse(*argv):
    from tracevllm.benchmarks.throughput import resolve_workload
    from tracevllm.entrypoints.cli import make_parser

    args = make_parser().parse_args(["bench", "throughput", *argv])
    workload = resolve_workload(args)
    return (args.num_prompts, args.input_len, args.output_len, workload.headline)


def test_workload_presets_fill_only_what_was_not_given():
    assert parse() == (64, (32, 512), (32, 256), "output")
    assert parse("--workload", "mixed") == (48, (32, 512), (32, 256), "output")
    assert parse("--workload", "decode") == (48, (32, 32), (256, 256), "output")
    assert parse("--workload", "prefill") == (48, (1024, 1024), (16, 16), "total")
    assert parse("--workload", "latency") == (1, (128, 128), (128, 128), "output")
    assert parse("--workload", "prefill", "--num-prompts", "3", "--output-len", "2:4") == (3, (1024, 1024), (2, 4),
                                                                                            "total")
    assert parse("--input-len", "7") == (64, (7, 7), (32, 256), "output")


def test_latency_workload_prints_ms_per_token_and_a_markdown_row(tiny_checkpoint, capsys):
    assert main(["bench", "throughput", "--workload", "latency", "--model", tiny_checkpoint("llama"), "--dtype",
                 "float32", "--input-len", "8", "--output-len", "4"]) == 0
    out = capsys.readouterr().out
    assert "latency workload: 1 prompts, input 8-8, output 4-4 tokens, dtype float32" in out
    assert re.search(r"^tracevllm: median of 1: .* ms per output token, start-up [0-9.]+ s", out, re.MULTILINE)
    assert re.search(r"^machine: .*avx512_bf16 (yes|no), amx_bf16 (yes|no)$", out, re.MULTILINE)
    assert "| workload | prompts | input | output | dtype | headline | tracevllm | other | ratio | start-up s |" in out
    assert re.search(r"^\| latency \| 1 \| 8 \| 4 \| float32 \| output tok/s \| [0-9.]+ \([0-9.]+ ms/tok\) \| - \| - "
                     r"\| [0-9.]+ / - \|$", out, re.MULTILINE)
