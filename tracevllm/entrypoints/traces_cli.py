"""``tracevllm traces``: the commands on ``--trace-out`` directories. They sit above ``viz/`` (which
reads, analyses and draws) and the what-if (which runs the scheduler on a trace), each importing what
it runs when it runs (``traces whatif`` loads no protobuf, ``traces view`` no model):

    push / jaeger   the files to an OTLP receiver, or as one file for the Jaeger UI (``viz/export.py``,
                    ``viz/jaeger.py``), each request's "why" added (``viz/why_attributes.py``)
    explain         why each request took as long as it did (``viz/explain.py``)
    fit             the step-cost model fitted to the engine's steps (``viz/fit.py``)
    whatif          the workload replayed through the real scheduler under other options
                    (``tracevllm/whatif/``)
    check           the engine's invariants (``viz/check.py``)
    diff            two runs of one workload compared (``viz/diff.py``; a golden schedule of vLLM's
                    read as a run: ``tracevllm/parity/golden_trace.py``)
    view            the live page on a recorded run (``tracevllm/entrypoints/ui/view.py``)
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from tracevllm.tracing.schema import OTLP_PROTOCOLS
from tracevllm.whatif import SETTINGS as WHATIF_SETTINGS


def _parse_headers(pairs: list[str]) -> dict[str, str]:
    headers: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--header must be KEY=VALUE, got {pair!r}")
        headers[key] = value
    return headers


def _push_command(args: argparse.Namespace) -> int:
    from viz.export import load_export_requests, push, trace_files
    from viz.why_attributes import add_why_attributes

    headers = _parse_headers(args.header)
    files = trace_files(args.paths)
    requests = load_export_requests(files)
    add_why_attributes(requests, args.paths)
    try:
        n = push(requests, args.endpoint, args.protocol, headers, args.timeout)
    except RuntimeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"pushed {n} spans from {len(files)} files to {args.endpoint}")
    return 0


def _jaeger_command(args: argparse.Namespace) -> int:
    from viz.jaeger import to_jaeger_traces
    from viz.export import count_spans, load_export_requests, to_otlp_document, trace_files
    from viz.why_attributes import add_why_attributes

    files = trace_files(args.paths)
    requests = load_export_requests(files)
    add_why_attributes(requests, args.paths)
    document = to_otlp_document(requests) if args.format == "otlp" else to_jaeger_traces(requests)
    with open(args.output, "w", encoding="utf-8") as f:
        json.dump(document, f, separators=(",", ":"), ensure_ascii=False)
    n = sum(count_spans(r) for r in requests)
    print(f"wrote {n} spans from {len(files)} files to {args.output}")
    return 0


def _explain_command(args: argparse.Namespace) -> int:
    from viz.explain import run  # viz reads traces without the engine: loaded only for this command

    return run(args)


def _one_blas_thread() -> None:
    """``fit`` and ``whatif`` solve one least-squares problem of five columns: numpy's OpenBLAS need not
    start a thread per core for it (starting them, and their spinning, took a tenth of a second of a
    200-request what-if). Read when numpy loads, so set before."""
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def _fit_command(args: argparse.Namespace) -> int:
    _one_blas_thread()
    from viz.fit import run  # numpy and the trace files only, loaded when the command runs

    return run(args)


def _whatif_command(args: argparse.Namespace) -> int:
    _one_blas_thread()
    from tracevllm.whatif.command import run  # the scheduler and the trace files, no model: loaded when it runs

    return run(args)


def _check_command(args: argparse.Namespace) -> int:
    from viz.check import main as check  # viz loads when its command runs, as ``tracevllm viz`` does

    return check(args.path, args.verbose)


def _diff_command(args: argparse.Namespace) -> int:
    from tracevllm.parity.golden_trace import load_golden_trace
    from viz.diff import run  # the trace files only (matplotlib for -o), loaded when the command runs
    from viz.trace_loader import REQUEST_AND_STEP_SPANS, load_trace

    a, b = (load_golden_trace(path) if os.path.isfile(path) else load_trace(path, REQUEST_AND_STEP_SPANS)
            for path in (args.a, args.b))
    return run(args, a, b)


def _view_command(args: argparse.Namespace) -> int:
    from tracevllm.entrypoints.ui.view import run  # the web server and viz load when the command runs

    return run(args)


def add_cli_args(traces: argparse.ArgumentParser) -> None:
    """``tracevllm traces push|jaeger|explain|fit|whatif|check|diff|view``, added to the ``traces`` command."""
    sub = traces.add_subparsers(dest="traces_command", required=True)

    push_parser = sub.add_parser("push", help="send trace files to an OTLP receiver (Jaeger, a collector)")
    push_parser.add_argument("paths", nargs="+", metavar="DIR", help="a --trace-out directory or .jsonl file")
    push_parser.add_argument("--endpoint", required=True,
                             help="e.g. http://localhost:4318 (http/protobuf) or localhost:4317 (grpc)")
    push_parser.add_argument("--protocol", choices=OTLP_PROTOCOLS, default="http/protobuf",
                             help="OTLP transport (default: %(default)s)")
    push_parser.add_argument("--header", action="append", default=[], metavar="KEY=VALUE",
                             help="an HTTP header or gRPC metadata entry (repeatable)")
    push_parser.add_argument("--timeout", type=float, default=10.0, help="seconds per export request (default: %(default)s)")
    push_parser.set_defaults(func=_push_command)

    jaeger = sub.add_parser("jaeger", help="write trace files as one JSON file for the Jaeger UI (or OTLP tools)")
    jaeger.add_argument("paths", nargs="+", metavar="DIR", help="a --trace-out directory or .jsonl file")
    jaeger.add_argument("-o", "--output", required=True, metavar="FILE")
    jaeger.add_argument("--format", choices=("jaeger", "otlp"), default="jaeger",
                        help="jaeger (default): Jaeger's own JSON model, which the Jaeger UI opens with "
                             "'Upload' tab with no backend running; otlp: one OTLP/JSON document, for "
                             "Jaeger's /api/transform or other OTLP tools")
    jaeger.set_defaults(func=_jaeger_command)

    explain = sub.add_parser("explain", help="why each request took as long as it did: every second charged "
                                             "to a cause (a step-level trace)")
    explain.add_argument("directory", metavar="DIR", help="a --trace-out directory")
    explain.add_argument("--request", metavar="ID",
                         help="only this request: its engine-core id, or its short id as the live page shows it (#3)")
    explain.add_argument("--json", action="store_true",
                         help='print {"requests": [{"request_id", "label", "e2e_s", "ttft_s", "parts", "blamed", '
                              '"gaps"}]}')
    explain.set_defaults(func=_explain_command)

    fit = sub.add_parser("fit", help="fit a step-cost model to the engine steps (a step-level trace): its "
                                     "coefficients, R² and median error on held-out steps, and the spikes")
    fit.add_argument("directory", metavar="DIR", help="a --trace-out directory recorded at --trace-level step")
    fit.add_argument("--json", action="store_true",
                     help='print {"features": [{"name", "unit", "coefficient"}], "r2", "median_relative_error", '
                          '"spikes", ...}')
    fit.set_defaults(func=_fit_command)

    whatif = sub.add_parser("whatif", help="replay a run through the real scheduler under another configuration, timed "
                                           "by a step-cost model fitted on its steps: the predicted trace, and both "
                                           "runs' figures")
    whatif.add_argument("directory", metavar="DIR", help="a --trace-out directory recorded at --trace-level step")
    whatif.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="settings",
                        help=f"change an engine option (repeatable): {', '.join(WHATIF_SETTINGS)}")
    whatif.add_argument("--arrival-scale", type=float, default=1.0, metavar="X",
                        help="X times the recorded arrival rate (default: %(default)s)")
    whatif.add_argument("--num-requests", type=int, metavar="N",
                        help="N requests drawn from the recorded ones, arriving at the recorded rate (default: as "
                             "recorded)")
    whatif.add_argument("--seed", type=int, default=0, help="for --num-requests (default: %(default)s)")
    whatif.add_argument("-o", "--output", required=True, metavar="OUT", help="a new directory for the predicted trace")
    whatif.add_argument("--trace-level", choices=("step", "request"), default="step",
                        help="of the predicted trace; request: no engine_step traces, for large workloads (default: "
                             "%(default)s)")
    whatif.add_argument("--json", action="store_true", help="print the changes and both runs' figures as JSON")
    whatif.set_defaults(func=_whatif_command)

    check = sub.add_parser("check", help="check the engine's invariants over a --trace-out directory (exit 1 "
                                         "on the first violation)")
    check.add_argument("path", metavar="DIR", help="a --trace-out directory recorded at --trace-level step")
    check.add_argument("-v", "--verbose", action="store_true",
                       help="when all hold, list each invariant with its rule (its checker's docstring)")
    check.set_defaults(func=_check_command)

    diff_help = ("compare two runs of one workload (real or predicted): the first step where their schedules part "
                 "and why, each request's TTFT and e2e in both")
    diff = sub.add_parser("diff", help=diff_help, description=diff_help[0].upper() + diff_help[1:] + ".")
    diff.add_argument("a", metavar="A", help="a --trace-out directory recorded at --trace-level step")
    diff.add_argument("b", metavar="B", help="another run of the same requests (the same ids and prompt lengths)")
    diff.add_argument("--json", action="store_true",
                      help='print {"a", "b", "schedules_compared", "num_steps_same", "divergence": {"step", '
                           '"start_a", "start_b", "differences"}, "requests", "summary", "picture"}')
    diff.add_argument("-o", "--output", metavar="PICTURE",
                      help="draw the two request timelines aligned (PNG, SVG or PDF, by the extension)")
    diff.set_defaults(func=_diff_command)

    view = sub.add_parser("view", help="serve the live page (/ui) on a recorded run, replayed at --speed")
    view.add_argument("directory", metavar="DIR", help="a --trace-out directory recorded at --trace-level step")
    view.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    view.add_argument("--port", type=int, default=8000, help="port to listen on (default: %(default)s)")
    view.add_argument("--speed", default="1",
                      help="times the recorded pace, or 'max': as fast as the page reads (default: %(default)s)")
    view.add_argument("--jaeger-url", default=None, metavar="URL",
                      help="the Jaeger UI holding these traces (e.g. http://localhost:16686): the page links "
                           "each request to its trace there")
    view.set_defaults(func=_view_command)
