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
