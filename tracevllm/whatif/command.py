"""``tracevllm traces whatif DIR --set KEY=VALUE ... [--arrival-scale X] [--num-requests N] -o OUT``.

It loads the recorded run, replays it under its configuration changed by ``--set`` (``engine.py``),
writes the predicted trace into OUT and prints the two runs side by side::

    $ tracevllm traces whatif traces/run --set max_num_batched_tokens=64 -o traces/budget64
    what-if of traces/run: max_num_batched_tokens 512 -> 64
                            recorded  predicted
      requests                    40         40
      engine steps               310        455
      preemptions                  0          0
      duration (s)             21.84      23.10
      TTFT median (s)           9.71      10.32
      ...
    predicted trace: traces/budget64 (replayed in 0.41 s; step-cost model fitted on 310 steps)

The prediction is as good as the step-cost model and the replay's assumptions (docs/whatif.md
measures it against real re-runs): each request produces the output it produced in the run, at
every setting; the time between steps and the front end's delay are the run's medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from dataclasses import dataclass, replace

from tracevllm.config import ObservabilityConfig
from tracevllm.tracing.schema import GenAI, SpanName
from tracevllm.whatif.arrivals import plan_arrivals
from tracevllm.whatif.config import SimulationConfig, parse_settings
from tracevllm.whatif.engine import PredictedRequest, WhatIfRun
from tracevllm.whatif.pace import Pace
from viz.trace_loader import load_trace
from viz.model import Trace
from viz.workload import load_workload


@dataclass(frozen=True)
class RunSummary:
    """One run's figures, recorded or predicted (seconds)."""

    num_requests: int
    num_steps: int
    num_preemptions: int
    duration: float
    ttft: tuple[float, float] | None  # median, p90
    e2e: tuple[float, float] | None

    def as_dict(self) -> dict:
        return {"num_requests": self.num_requests, "num_steps": self.num_steps, "num_preemptions": self.num_preemptions,
                "duration_s": self.duration, "ttft_median_s": self.ttft and self.ttft[0],
                "ttft_p90_s": self.ttft and self.ttft[1], "e2e_median_s": self.e2e and self.e2e[0],
                "e2e_p90_s": self.e2e and self.e2e[1]}


@dataclass(frozen=True)
class WhatIf:
    """A what-if's result: the changes, both runs' figures, each predicted request, the replay's time."""

    directory: str
    output: str
    changes: dict[str, tuple]  # option -> (recorded, predicted)
    recorded: RunSummary
    predicted: RunSummary
    requests: tuple[PredictedRequest, ...]
    wall_s: float


def whatif(directory: str, settings: list[str], output: str, arrival_scale: float = 1.0,
           num_requests: int | None = None, seed: int = 0, trace_level: str = "step",
           step_costs_from: str | None = None) -> WhatIf:
    """Replay the run recorded in ``directory`` under ``settings`` (``["KEY=VALUE", ...]``) into the
    trace directory ``output``, at ``trace_level`` (``request``: no engine_step traces, much less to
    write for a large workload). ``step_costs_from``: another run's trace, on the same machine and model,
    whose steps time the replay instead (benchmarks/whatif_fidelity.py times a prediction by the real
    re-run's own steps, to tell the replay's error from the step-cost model's). ValueError for a trace it
    cannot replay or a bad setting."""
    started = time.perf_counter()
    if os.path.isdir(output) and any(name.endswith(".jsonl") for name in os.listdir(output)):
        raise ValueError(f"{output} already holds trace files: give the prediction a directory of its own")
    changes = parse_settings(settings)
    trace = load_trace(directory)
    recorded = SimulationConfig.recorded(trace)
    config = recorded.with_settings(changes)
    pace = Pace.recorded(load_trace(step_costs_from) if step_costs_from else trace)
    handed_over = _handed_over(trace)
    workload = [replace(r, queued=handed_over.get(r.request_id, r.queued)) for r in load_workload(trace)]
    if (longest := max(r.num_prompt_tokens for r in workload)) >= config.scheduler.max_model_len:
        raise ValueError(f"max_model_len {config.scheduler.max_model_len}: a recorded prompt has {longest} tokens, and "
                         "the engine refuses a prompt of max_model_len tokens or more")
    plan = plan_arrivals(workload, trace.steps[0].start, arrival_scale, num_requests, seed)
    run = WhatIfRun(plan, config, pace, ObservabilityConfig(trace_out=output, trace_level=trace_level),
                    trace.t0_ns / 1e9, _model_name(trace))
    predicted = run.run()
    summary = RunSummary(len(predicted), run.recorder.num_steps, sum(r.num_preemptions for r in predicted),
                         max(r.finished for r in predicted) - min(r.arrival for r in predicted),
                         _median_p90([r.ttft for r in predicted if r.ttft is not None]),
                         _median_p90([r.e2e for r in predicted]))
    return WhatIf(directory, output, _changes(recorded, config), _recorded_summary(trace), summary, tuple(predicted),
                  time.perf_counter() - started)


def _handed_over(trace: Trace) -> dict[str, float]:
    """When the front end handed each engine-core request over: its user request's ``tokenize`` span's end. A
    server's engine core queues it only at its next step boundary (``QUEUED``), which the replay finds itself."""
    ends = {s.trace_id: (s.end_ns - trace.t0_ns) / 1e9 for s in trace.spans if s.name == SpanName.TOKENIZE}
    return {r.request_id: min(r.queued, ends[r.trace_id]) for r in trace.requests.values() if r.trace_id in ends}


def _model_name(trace: Trace) -> str:
    return next((s.attributes[GenAI.REQUEST_MODEL] for s in trace.spans
                 if s.name == SpanName.LLM_REQUEST and GenAI.REQUEST_MODEL in s.attributes), "unknown")


def _changes(recorded: SimulationConfig, config: SimulationConfig) -> dict[str, tuple]:
    before, after = recorded.attributes(), config.attributes()
    return {key: (before[span].get(key), value) for span in after for key, value in after[span].items()
            if before[span].get(key) != value}


def _median_p90(values: list[float]) -> tuple[float, float] | None:
    if not values:
        return None
    values = sorted(values)
    return statistics.median(values), values[min(len(values) - 1, round(0.9 * (len(values) - 1)))]


def _recorded_summary(trace: Trace) -> RunSummary:
    requests = list(trace.requests.values())
    return RunSummary(len(requests), len(trace.steps), sum(r.num_preemptions for r in requests),
                      max(r.finished for r in requests) - min(r.arrival for r in requests),
                      _median_p90([r.ttft for r in requests if r.ttft is not None]),
                      _median_p90([r.e2e for r in requests if r.e2e is not None]))


def describe(w: WhatIf) -> str:
    changes = ", ".join(f"{key} {old} -> {new}" for key, (old, new) in w.changes.items()) or "no change"
    rows = [("requests", "num_requests", "{}"), ("engine steps", "num_steps", "{}"),
            ("preemptions", "num_preemptions", "{}"), ("duration (s)", "duration", "{:.2f}")]
    lines = [f"what-if of {w.directory}: {changes}", f"  {'':<22}{'recorded':>10}{'predicted':>11}"]
    for label, field, fmt in rows:
        lines.append(f"  {label:<22}{fmt.format(getattr(w.recorded, field)):>10}"
                     f"{fmt.format(getattr(w.predicted, field)):>11}")
    for label, field in (("TTFT", "ttft"), ("e2e", "e2e")):
        for i, stat in enumerate(("median", "p90")):
            old, new = getattr(w.recorded, field), getattr(w.predicted, field)
            lines.append(f"  {f'{label} {stat} (s)':<22}{'-' if old is None else f'{old[i]:.2f}':>10}"
                         f"{'-' if new is None else f'{new[i]:.2f}':>11}")
    lines.append(f"predicted trace: {w.output} (replayed in {w.wall_s:.2f} s)")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """``tracevllm traces whatif`` (ValueError, printed by the CLI, for what it cannot replay)."""
    w = whatif(args.directory, args.settings, args.output, args.arrival_scale, args.num_requests, args.seed,
               args.trace_level)
    if args.json:
        print(json.dumps({"directory": w.directory, "output": w.output,
                          "changes": {k: {"recorded": old, "predicted": new} for k, (old, new) in w.changes.items()},
                          "recorded": w.recorded.as_dict(), "predicted": w.predicted.as_dict(),
                          "wall_s": w.wall_s}, indent=1))
    else:
        print(describe(w))
    return 0
