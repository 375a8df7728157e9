"""``tracevllm parity GOLDEN...``: hold tracevllm's scheduler to schedules recorded from vLLM.

Each golden file's workload is run again through tracevllm (``rerun.py``) and compared step by step
(``compare.py``)::

    $ tracevllm parity tests/data/vllm_schedules/*.json
    tests/data/vllm_schedules/aborts.json: vLLM 0.32.0 took 106 steps, tracevllm 106; 106 of 106 the same: ...

``--set KEY=VALUE`` changes an option of the golden's (e.g. ``scheduler_reserve_full_isl=false``: the
admission rule vLLM had before 0.32) to see where the schedules part; ``--trace-out DIR`` writes
tracevllm's run as a trace, which ``tracevllm traces diff DIR GOLDEN`` holds against vLLM's, step by
step. The exit status is 0 when every schedule is the same, 1 when one parts, 2 for a bad file.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tracevllm.parity.golden import OPTIONS


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("goldens", nargs="+", metavar="GOLDEN",
                        help="golden schedule files recorded from vLLM (tests/data/vllm_schedules/*.json)")
    parser.add_argument("--set", dest="settings", action="append", default=[], metavar="KEY=VALUE",
                        help=f"change one of the golden's options for tracevllm's run: {', '.join(OPTIONS)}")
    parser.add_argument("--trace-out", default=None, metavar="DIR",
                        help="write tracevllm's run as a trace here (one subdirectory per golden when several), "
                             "for tracevllm traces diff DIR GOLDEN")
    parser.add_argument("--json", action="store_true", help="print a JSON list, one report per golden")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tracevllm.parity.compare import compare
    from tracevllm.parity.golden import load_golden
    from tracevllm.parity.rerun import replay
    from tracevllm.whatif.config import parse_settings

    settings = parse_settings(args.settings)
    if unknown := [key for key in settings if key not in OPTIONS]:
        raise ValueError(f"--set {unknown[0]}: not an option of a golden schedule; they are {', '.join(OPTIONS)}")
    goldens = [load_golden(path) for path in args.goldens]  # every file checked before any runs
    reports = []
    for golden in goldens:
        trace_out = None
        if args.trace_out:
            trace_out = Path(args.trace_out) / golden.scenario if len(goldens) > 1 else Path(args.trace_out)
        reports.append(compare(golden, replay(golden, settings, trace_out=trace_out)))
        if not args.json:
            print(reports[-1].describe() + (f"\ntracevllm's trace: {trace_out}" if trace_out else ""), flush=True)
    if args.json:
        print(json.dumps([r.as_dict() for r in reports], indent=1))
    return 0 if all(r.identical for r in reports) else 1
