"""The ``tracevllm`` command line: ``--help`` shows each option's default (the one used), in plain text,
without loading torch; a mistyped flag or command gets the close matches and its command's usage."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tracevllm.entrypoints.cli import main, make_parser


def help_text(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit):
        make_parser().parse_args([*argv, "--help"])
    return re.sub(r"\s+", " ", capsys.readouterr().out)


@pytest.mark.parametrize("argv, option, default", [
    (("serve",), "--host", "127.0.0.1"),
    (("serve",), "--port", "8000"),
    (("serve",), "--max-request-body-bytes", "4194304"),
    (("serve",), "--read-timeout", "30.0"),
    (("serve",), "--shutdown-timeout", "10.0"),
    (("serve",), "--max-n", "128"),
    (("serve",), "--max-prompts", "128"),
    (("serve",), "--max-stop-strings", "64"),
    (("serve",), "--max-stop-chars", "16384"),
    (("serve",), "--max-stop-token-ids", "1024"),
    (("serve",), "--block-size", "16"),
    (("generate",), "--max-tokens", "64"),
    (("generate",), "--temperature", "0.0"),
    (("traces", "push"), "--protocol", "http/protobuf"),
    (("traces", "push"), "--timeout", "10.0"),
])
def test_help_shows_the_default_that_is_used(capsys, argv, option, default):
    text = help_text(capsys, *argv)
    assert re.search(re.escape(option) + r" (?:(?! --).)*?\(default: " + re.escape(default) + r"\)", text), text
    required = {"generate": ["prompt"], "traces": ["x", "--endpoint", "http://h:1"]}.get(argv[0], [])
    args = make_parser().parse_args([*argv, *required])
    assert str(getattr(args, option.lstrip("-").replace("-", "_"))) == default


def test_no_empty_or_repeated_default(capsys):
    """The commands' own options (EngineArgs' group, from tracevllm/engine/arg_utils.py, words its defaults
    itself)."""
    for argv in (("serve",), ("generate",), ("traces", "push")):
        own = help_text(capsys, *argv).split(" engine: ")[0].split(" options: ", 1)[1]
        assert "(default: None)" not in own and "(default: False)" not in own
        for option_help in re.split(r" (?=--?[a-z])", own):
            assert option_help.count("(default") <= 1, option_help


def commands(parser: argparse.ArgumentParser = None, prefix: tuple[str, ...] = ()):
    """Every command's argv prefix, the top level and each subcommand at every depth."""
    parser = parser or make_parser()
    yield prefix
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from commands(sub, (*prefix, name))


def test_every_help_is_plain_text(capsys):
    """No reStructuredText from docstrings (``literal``, :func:`role`) in any command's help."""
    argvs = list(commands())
    assert ("bench", "kernels") in argvs and ("traces", "push") in argvs
    for argv in argvs:
        text = help_text(capsys, *argv)
        assert "usage: tracevllm" in text
        assert "``" not in text and not re.search(r":[a-z]+:`", text), (argv, text)


def test_help_and_a_mistyped_flag_import_no_torch():
    """Building the parser loads neither torch, transformers nor triton (nor the engine: of
    tracevllm.engine only the package's message types and arg_utils, EngineArgs' module), whatever the
    command: --help answers at once."""
    argvs = [[*argv, "--help"] for argv in commands()] + [["serve", "--max-model-lenn", "10"], ["serv"]]
    code = (
        "import contextlib, io, json, sys\n"
        "from tracevllm.entrypoints.cli import main\n"
        "codes = []\n"
        f"for argv in {argvs!r}:\n"
        "    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):\n"
        "        try:\n"
        "            main(argv)\n"
        "        except SystemExit as e:\n"
        "            codes.append(e.code)\n"
        "heavy = ('torch', 'transformers', 'triton')\n"
        "engine = ('tracevllm.engine.', 'tracevllm.models')\n"
        "print(json.dumps([codes, sorted(m for m in sys.modules if m.split('.')[0] in heavy\n"
        "                                or m.startswith(engine) and m != 'tracevllm.engine.arg_utils')]))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                            cwd=Path(__file__).parents[2])
    codes, loaded = json.loads(result.stdout)
    assert codes == [0] * (len(argvs) - 2) + [2, 2]
    assert loaded == []


def run_main(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as e:
        main(list(argv))
    assert e.value.code == 2  # as argparse exits on a usage error
    return capsys.readouterr().err


@pytest.mark.parametrize("argv, usage, error", [
    (("serve", "--max-model-lenn", "10"), "tracevllm serve", "--max-model-lenn; did you mean --max-model-len?"),
    (("serve", "--hots", "--port", "1"), "tracevllm serve", "--hots; did you mean --host?"),
    (("generate", "hi", "--max-tokenz=3"), "tracevllm generate", "--max-tokenz=3; did you mean --max-tokens"),
    (("bench", "throughput", "--num-promps", "3"), "tracevllm bench throughput",
     "--num-promps 3; did you mean --num-prompts?"),
    (("traces", "push", "d", "--endpoint", "h", "--protocl", "grpc"), "tracevllm traces push",
     "--protocl grpc; did you mean --protocol?"),
])
def test_a_mistyped_flag_gets_the_close_matches_and_its_commands_usage(capsys, argv, usage, error):
    err = run_main(capsys, *argv)
    assert err.startswith(f"usage: {usage} [-h]"), err
    assert f"{usage}: error: unrecognized arguments: {error}" in err, err


def test_several_mistyped_flags_each_get_theirs(capsys):
    err = run_main(capsys, "serve", "--hots", "--prot", "--zzzzzzzz")
    assert err.rstrip().endswith("unrecognized arguments: --hots --prot --zzzzzzzz; "
                                 "--hots: did you mean --host?; --prot: did you mean --port?"), err


def test_nothing_close_no_suggestion(capsys):
    err = run_main(capsys, "serve", "--zzzzzzzz")
    assert err.rstrip().endswith("tracevllm serve: error: unrecognized arguments: --zzzzzzzz"), err


@pytest.mark.parametrize("argv, usage, hint", [
    (("serv",), "tracevllm", "did you mean serve?"),
    (("bench", "throughputt"), "tracevllm bench", "did you mean throughput?"),
    (("traces", "jager"), "tracevllm traces", "did you mean jaeger?"),
    (("generate", "hi", "--dtype", "bfloat61"), "tracevllm generate", "did you mean bfloat16"),
])
def test_a_mistyped_command_or_choice_gets_the_close_matches(capsys, argv, usage, hint):
    err = run_main(capsys, *argv)
    assert err.startswith(f"usage: {usage} [-h]"), err
    assert f"invalid choice: {argv[-1]!r}" in err and hint in err, err
