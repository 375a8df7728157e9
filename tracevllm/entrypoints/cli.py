"""The ``tracevllm`` command: ``serve``, ``generate``, ``bench throughput|serve|viz|kernels``,
``traces push|jaeger|explain|fit|whatif|check|diff|view``, ``viz``, ``parity``.

Building the parser imports no torch (nor transformers, triton or the engine): each command imports what
it runs when it runs, so ``--help`` and a mistyped flag answer at once. Only the command given gets its
flags (``make_parser(argv)``), so a command pays for no other's imports.
"""

from __future__ import annotations

import argparse
import difflib
import sys

DEFAULT_READ_TIMEOUT_S = 30.0
DEFAULT_SHUTDOWN_TIMEOUT_S = 10.0
DESCRIPTION = ("vLLM V1's inference engine, rebuilt to be read, run and watched: serve a model, generate "
               "text, benchmark, and replay or draw the traces. 'tracevllm COMMAND --help' lists a command's "
               "options.")


def generate_prompts(args: argparse.Namespace) -> list[str]:
    """``generate``'s prompts: the PROMPT arguments, then ``--prompts-file``'s lines (one prompt a
    line, blank lines skipped; ``-``: standard input). ValueError when there is none."""
    prompts = list(args.prompt)
    if args.prompts_file is not None:
        if args.prompts_file == "-":
            lines = sys.stdin.read().splitlines()
        else:
            try:
                with open(args.prompts_file, encoding="utf-8") as f:
                    lines = f.read().splitlines()
            except OSError as e:
                raise ValueError(f"--prompts-file: {e}") from None
        prompts += [line for line in lines if line.strip()]
    if not prompts:
        raise ValueError("generate needs a prompt: give PROMPT (one or more) or --prompts-file FILE.")
    return prompts


def _generate(args: argparse.Namespace) -> int:
    """All the prompts go to one ``LLM.generate`` (or ``LLM.chat``) call: the engine batches them, as
    a trace of the run shows."""
    prompts = generate_prompts(args)  # before the engine starts: a missing file fails at once
    from tracevllm import LLM, SamplingParams
    from tracevllm.engine.arg_utils import EngineArgs
    from tracevllm.utils import configure_logging

    configure_logging()  # start-up shows its stages, as serve's does
    llm = LLM.from_engine_args(EngineArgs.from_cli_args(args))
    params = SamplingParams(
        max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
        seed=args.sampling_seed,
    )
    if args.chat:
        outputs = llm.chat([[{"role": "user", "content": p}] for p in prompts], params, use_tqdm=False)
    else:
        outputs = llm.generate(prompts, params, use_tqdm=False)
    if len(prompts) == 1:
        print(outputs[0].outputs[0].text)
    else:  # as vLLM's examples/offline_inference/basic.py prints them
        for prompt, output in zip(prompts, outputs):
            print(f"Prompt: {prompt!r}, Generated text: {output.outputs[0].text!r}")
    return 0


def _serve(args: argparse.Namespace) -> int:
    from tracevllm.entrypoints.openai.api_server import main as serve_main

    if args.model_tag is not None:
        if args.model is not None and args.model != args.model_tag:
            raise ValueError(f"Two models given: {args.model_tag!r} and --model {args.model!r}.")
        args.model = args.model_tag
    return serve_main(args)


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """Each option's help ends with its default, unless the help already says it or there is none to
    say (no value, a flag that is off)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        help = action.help or ""
        if "(default" in help or any(action.default is v for v in (None, False, argparse.SUPPRESS)) or not action.option_strings:
            return help
        return f"{help} (default: %(default)s)".lstrip()


def _did_you_mean(word: str, possibilities: list[str]) -> str:
    """The close matches, compared without leading dashes (which all flags share)."""
    by_name = {p.lstrip("-"): p for p in possibilities}
    close = difflib.get_close_matches(word.lstrip("-"), by_name, n=3)
    return f"did you mean {' or '.join(by_name[c] for c in close)}?" if close else ""


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser, which answers a mistyped option or choice with the close matches, as
    ``EngineArgs.from_options`` does for ``LLM()``'s keywords, and a mistyped option with the usage of
    the command it was given to.

    argparse hands the arguments a command does not know back to the top-level parser, which would
    print its own usage; ``parse_args`` finds the command they were given to (the subcommands
    chosen, one level after another) and lets that command's parser refuse them."""

    _commands: argparse._SubParsersAction | None = None

    def add_subparsers(self, **kwargs):
        self._commands = super().add_subparsers(**kwargs)
        return self._commands

    def parse_args(self, args=None, namespace=None):
        namespace, extras = self.parse_known_args(args, namespace)
        if not extras:
            return namespace
        command = self
        while command._commands is not None and getattr(namespace, command._commands.dest, None) is not None:
            command = command._commands.choices[getattr(namespace, command._commands.dest)]
        flags = [flag for action in command._actions for flag in action.option_strings]
        hints = {arg: _did_you_mean(arg.split("=", 1)[0], flags) for arg in extras if arg.startswith("-")}
        hints = {arg: hint for arg, hint in hints.items() if hint}
        message = f"unrecognized arguments: {' '.join(extras)}"
        if len(hints) == 1:
            message += f"; {next(iter(hints.values()))}"
        else:
            message += "".join(f"; {arg}: {hint}" for arg, hint in hints.items())
        command.error(message)

    def _check_value(self, action: argparse.Action, value) -> None:
        """argparse's check of ``choices`` (a command's name among them), plus the close matches."""
        try:
            super()._check_value(action, value)
        except argparse.ArgumentError as e:
            hint = _did_you_mean(str(value), [str(choice) for choice in action.choices])
            if not hint:
                raise
            raise argparse.ArgumentError(action, f"{e.message}; {hint}") from None


def make_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The ``tracevllm`` command line; each command that starts an engine has EngineArgs' flags.

    With ``argv``, only the commands it names get their flags, the others their name and help only:
    a command's flags come from its own module, and ``tracevllm traces whatif`` need not import the
    HTTP benchmark's (asyncio, numpy) to start. Without, every command has its flags."""
    parser = ArgumentParser(prog="tracevllm", description=DESCRIPTION)
    sub = parser.add_subparsers(dest="command", required=True)
    named = None if argv is None else set(argv)

    def wanted(name: str) -> bool:
        return named is None or name in named

    defaults = DefaultsHelpFormatter
    serve = sub.add_parser(
        "serve", help="the OpenAI-compatible HTTP server, with a live page of the engine at /ui",
        description="The OpenAI-compatible HTTP server. It prints its address at start-up; open /ui there in a "
                    "browser for the live page: the waiting queue and why, the running batch, the KV blocks, "
                    "throughput and queues over the last minute, and each request's events.",
        formatter_class=defaults)
    if wanted("serve"):
        _add_serve_args(serve)
    gen = sub.add_parser("generate", help="complete prompts, as one batch, and print the texts",
                         formatter_class=defaults)
    if wanted("generate"):
        _add_generate_args(gen)

    bench = sub.add_parser("bench", help="benchmarks").add_subparsers(dest="bench", required=True)
    tp = bench.add_parser("throughput", formatter_class=defaults,
                          help="offline throughput on a random dataset (like vllm bench throughput); "
                               "--backend vllm: side by side with vLLM's LLM")
    bs = bench.add_parser("serve", help="online serving against a running server (like vllm bench serve)")
    bv = bench.add_parser("viz", help="time viz on a large trace directory (recorded first unless given)")
    kernels = bench.add_parser("kernels", help="the Triton paged-attention kernel vs SDPA on gathered K/V")
    if wanted("bench"):
        _add_bench_args(tp, bs, bv, kernels, wanted)

    traces = sub.add_parser("traces", help="replay --trace-out files")
    if wanted("traces"):
        from tracevllm.entrypoints.traces_cli import add_cli_args as add_traces_args

        add_traces_args(traces)

    viz_parser = sub.add_parser("viz", help="draw a --trace-out directory: pictures, report.html, Perfetto JSON")
    if wanted("viz"):
        from viz.report_cli import add_cli_args as add_viz_args, run as run_viz

        add_viz_args(viz_parser)
        viz_parser.set_defaults(func=run_viz)

    parity = sub.add_parser(
        "parity", help="replay schedules recorded from vLLM through tracevllm's scheduler, step by step",
        description="Replay each golden schedule (recorded from vLLM itself by tests/parity/record_vllm.py) through "
                    "tracevllm's scheduler and KV cache, and compare every step: the first divergent step, both "
                    "engines' decisions there, and the rule involved.")
    if wanted("parity"):
        from tracevllm.parity.command import add_cli_args as add_parity_args

        add_parity_args(parity)
    return parser


def _add_serve_args(serve: argparse.ArgumentParser) -> None:
    from tracevllm.engine.arg_utils import EngineArgs
    from tracevllm.entrypoints.openai.request_limits import DEFAULT_MAX_REQUEST_BODY_BYTES, RequestLimits

    serve.add_argument("model_tag", nargs="?", default=None, metavar="MODEL", help="as --model")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on")
    serve.add_argument("--port", type=int, default=8000, help="port to listen on")
    serve.add_argument("--api-key", default=None,
                       help="require 'Authorization: Bearer <key>' on every route but /health and the page /ui "
                            "(whose event stream needs the key: the page asks for it)")
    serve.add_argument("--disable-fastapi-docs", action="store_true", help="no /docs, /redoc or /openapi.json")
    serve.add_argument("--jaeger-url", default=None, metavar="URL",
                       help="the Jaeger UI that receives this server's traces (e.g. http://localhost:16686), sent in "
                            "/v1/engine/events' first message: the live page /ui links each request to its trace there")
    serve.add_argument("--disable-log-stats", action="store_true",
                       help="no periodic stats log line and no Prometheus metrics")
    serve.add_argument("--uvicorn-log-level", default="info",
                       choices=["critical", "error", "warning", "info", "debug", "trace"], help="uvicorn's log level")
    serve.add_argument("--max-request-body-bytes", type=int, default=DEFAULT_MAX_REQUEST_BODY_BYTES,
                       help="a larger request body is refused with 413 before it is parsed")
    serve.add_argument("--read-timeout", type=float, default=DEFAULT_READ_TIMEOUT_S,
                       help="seconds a client has to send a request's headers, and then its body (else the "
                            "connection is closed, or a 408): stalled clients (slowloris) cannot pile up")
    serve.add_argument("--shutdown-timeout", type=float, default=DEFAULT_SHUTDOWN_TIMEOUT_S,
                       help="seconds that requests in flight get to finish on SIGTERM/SIGINT; those still running "
                            "a second before it ends are stopped (a stream gets an error event and [DONE], a "
                            "plain request a 503): one long stream cannot hold the exit up")
    limits = RequestLimits()
    serve.add_argument("--max-n", type=int, default=limits.max_n,
                       help="most samples per request (n): each is a sequence in the batch")
    serve.add_argument("--max-prompts", type=int, default=limits.max_prompts,
                       help="most prompts per /v1/completions request: each is a request in the engine")
    serve.add_argument("--max-stop-strings", type=int, default=limits.max_stop_strings,
                       help="most stop strings per request: each is searched for in every step's new text")
    serve.add_argument("--max-stop-chars", type=int, default=limits.max_stop_chars,
                       help="most characters of stop strings per request, all together")
    serve.add_argument("--max-stop-token-ids", type=int, default=limits.max_stop_token_ids,
                       help="most stop_token_ids per request: each is checked at every step")
    EngineArgs.add_cli_args(serve)
    serve.set_defaults(func=_serve)


def _add_generate_args(gen: argparse.ArgumentParser) -> None:
    from tracevllm.engine.arg_utils import EngineArgs

    gen.add_argument("prompt", nargs="*", metavar="PROMPT",
                     help="a text to complete (the user message with --chat); several: one batch")
    gen.add_argument("--prompts-file", default=None, metavar="FILE",
                     help="more prompts, one a line (blank lines skipped; '-': standard input)")
    gen.add_argument("--max-tokens", type=int, default=64, help="most tokens to generate")
    gen.add_argument("--temperature", type=float, default=0.0, help="0 is greedy")
    gen.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass")
    gen.add_argument("--top-k", type=int, default=-1, help="-1: all tokens")
    gen.add_argument("--sampling-seed", type=int, default=None, help="SamplingParams.seed (default: none)")
    gen.add_argument("--chat", action="store_true", help="wrap the prompt in the chat template")
    EngineArgs.add_cli_args(gen)
    gen.set_defaults(func=_generate)


def _add_bench_args(tp: argparse.ArgumentParser, bs: argparse.ArgumentParser, bv: argparse.ArgumentParser,
                    kernels: argparse.ArgumentParser, wanted) -> None:
    from tracevllm.engine.arg_utils import EngineArgs

    if wanted("throughput"):
        from tracevllm.benchmarks.throughput import add_cli_args, run_throughput

        add_cli_args(tp)
        EngineArgs.add_cli_args(tp)
        tp.set_defaults(func=run_throughput)
    if wanted("serve"):
        from tracevllm.benchmarks.serve import add_cli_args as add_serve_args, run_serve_benchmark

        add_serve_args(bs)
        bs.set_defaults(func=run_serve_benchmark)
    if wanted("viz"):
        from tracevllm.benchmarks.viz import add_cli_args as add_viz_bench_args, run_viz_benchmark

        add_viz_bench_args(bv)
        EngineArgs.add_cli_args(bv)
        bv.set_defaults(func=run_viz_benchmark)
    if wanted("kernels"):
        from tracevllm.benchmarks.kernels import add_cli_args as add_kernel_args, run_kernels

        add_kernel_args(kernels)
        kernels.set_defaults(func=run_kernels)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = make_parser(argv).parse_args(argv)
    try:
        return args.func(args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
