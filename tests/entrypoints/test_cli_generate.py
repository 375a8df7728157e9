"""``tracevllm generate``'s prompts: PROMPT arguments and ``--prompts-file`` lines, in that order
(tracevllm/entrypoints/cli.py). The batch they make is checked end to end in tests/e2e/test_cli_trace.py."""

from __future__ import annotations

import io

import pytest

from tracevllm.entrypoints.cli import generate_prompts, main, make_parser


def _args(*argv: str):
    return make_parser(["generate"]).parse_args(["generate", *argv])


def test_prompts_from_arguments_then_the_file(tmp_path):
    path = tmp_path / "prompts.txt"
    path.write_text("The capital of France is\n\n  \nOnce upon a time\n", encoding="utf-8")
    assert generate_prompts(_args("Hello", "Hi there", "--max-tokens", "4", "--prompts-file", str(path))) == [
        "Hello", "Hi there", "The capital of France is", "Once upon a time"]
    assert generate_prompts(_args("--prompts-file", str(path))) == ["The capital of France is", "Once upon a time"]


def test_prompts_file_dash_reads_standard_input(monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO("one\ntwo\n"))
    assert generate_prompts(_args("zero", "--prompts-file", "-")) == ["zero", "one", "two"]


@pytest.mark.parametrize("argv, error", [
    ((), "generate needs a prompt: give PROMPT (one or more) or --prompts-file FILE."),
    (("--prompts-file", "/nonexistent/prompts.txt"), "--prompts-file: [Errno 2] No such file or directory"),
])
def test_no_prompt_is_an_error_before_any_engine_starts(capsys, argv, error):
    with pytest.raises(ValueError) as e:
        generate_prompts(_args(*argv))
    assert str(e.value).startswith(error)
    assert main(["generate", *argv]) == 2 and f"error: {error}" in capsys.readouterr().err
