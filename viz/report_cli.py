"""The command line: ``python -m viz DIR -o OUT/ [--perfetto trace.json] [--animation steps.gif]``.

``add_cli_args`` and ``run`` are split so that another command line (``tracevllm viz``) can mount the
same options on a subparser of its own.
"""

from __future__ import annotations

import argparse
import sys


def add_cli_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("trace_dir", help="a --trace-out directory (tracevllm-<pid>.jsonl files)")
    parser.add_argument("-o", "--out-dir", help="write the pictures (PNG and SVG) and report.html here")
    parser.add_argument("--perfetto", metavar="FILE", help="write Chrome trace-event JSON for ui.perfetto.dev")
    parser.add_argument("--animation", metavar="FILE",
                        help="write the step-by-step replay as an animated GIF (HTML without pillow)")
    return parser


def run(args: argparse.Namespace) -> int:
    """Do what ``args`` ask; 0 on success, 1 if the traces cannot be read, 2 if nothing was asked."""
    # Imported here: matplotlib takes a while, and ``tracevllm``'s other commands mount these options too.
    from viz.trace_loader import load_trace
    from viz.perfetto import write_perfetto
    from viz.animation import write_animation
    from viz.report import write_report

    if not (args.out_dir or args.perfetto or args.animation):
        print("error: nothing to write: give -o/--out-dir, --perfetto or --animation", file=sys.stderr)
        return 2
    try:
        trace = load_trace(args.trace_dir)
        if args.out_dir:
            print(f"wrote {write_report(trace, args.out_dir)}")
        if args.perfetto:
            print(f"wrote {write_perfetto(trace, args.perfetto)} (open it in https://ui.perfetto.dev)")
        if args.animation:
            print(f"wrote {write_animation(trace, args.animation)}")
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m viz", description="Draw and export tracevllm trace files.")
    return run(add_cli_args(parser).parse_args(argv))
