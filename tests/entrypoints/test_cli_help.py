"""``--help`` of the commands shows each option's default, and the default shown is the one used."""

from __future__ import annotations

import re

import pytest

from tracevllm.entrypoints.cli import make_parser


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
    """The commands' own options (EngineArgs' group, from tracevllm/config.py, words its defaults itself)."""
    for argv in (("serve",), ("generate",), ("traces", "push")):
        own = help_text(capsys, *argv).split(" engine: ")[0].split(" options: ", 1)[1]
        assert "(default: None)" not in own and "(default: False)" not in own
        for option_help in re.split(r" (?=--?[a-z])", own):
            assert option_help.count("(default") <= 1, option_help
