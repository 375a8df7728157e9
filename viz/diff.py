"""Two runs of one workload side by side: where their schedules part and why, and what each request's
TTFT and e2e became.

``tracevllm traces diff A B`` reads two ``--trace-out`` directories of the same requests (two real
runs under two configurations, or a real run and a ``traces whatif`` prediction), matches the
requests by engine-core request id (two served runs, whose ids differ, by arrival: ``viz/matching.py``),
and tells:

- **where the schedules part.** The engine steps of both runs are compared by number (each run counts
  its steps from 1; a prediction's clock is a model, so times are never compared). A step's schedule
  is what the scheduler decided: each request it ran with its token count (decode or prefill), and
  the requests it preempted; the order of the batch is not part of it. The first step whose two
  schedules differ is the divergence. For each request the two runs treat differently there, it says
  what the request was doing in each run and why, from the reasons the engine recorded (``WAITING``,
  ``PREEMPTED``, the prefix-cache lookup of ``SCHEDULED``: ``viz/explain.py`` words them)::

      in A request 3 was scheduled (1 decode token); in B it was preempted: 0 needed 1 block
      with 0 free, and fcfs picked it; the KV of 25 tokens was lost

  Before the divergence the runs did the same; after it, every later difference may follow from it,
  so only the count of steps whose schedules still agree is given.
- **what it cost.** Each request's TTFT and e2e in A and in B and the change (B - A); over the
  requests, the medians and 90th percentiles of each run, of the change, and of the relative change
  |B - A| / A (the error of a prediction B of a real run A).

Two runs of different workloads (some request ids in one run only, or another prompt length for one
of them) are refused, and so is a trace of format 1 (``viz/workload.py``'s ``WORKLOAD_FORMAT``): ValueError,
one line.
"""

from __future__ import annotations

import argparse
import gc
import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass

import numpy as np

from viz.workload import WORKLOAD_FORMAT
from viz.explain import QueueHead, lookup_words, preemption_words, wait_words
from viz.matching import match_requests, renamed
from viz.model import Admission, Preemption, Request, Step, Trace, Wait

MAX_ROWS = 30  # the text table's rows; --json has every request

# A step's schedule: each request it ran -> (tokens, is_decode), and the requests it preempted.
Schedule = tuple[dict[str, tuple[int, bool]], frozenset[str]]


@dataclass(frozen=True, slots=True)
class Whereabouts:
    """What a request was doing in one run's step. ``state``:

    - ``scheduled``: in the step's batch, ``num_tokens`` of them (``is_decode``);
    - ``preempted``: preempted in this step;
    - ``waiting``: in the waiting queue; ``reason`` is its last ``WAITING`` reason
      (``schema.WAITING_REASONS``), ``preempted`` after a preemption with none recorded since, or None;
    - ``running``: admitted, but not in this step's batch (``reason``: ``token_budget`` or ``in_flight``);
    - ``finished``, ``not_arrived`` (not in the scheduler yet), or ``no_step`` (the run has no such step).
    """

    state: str
    num_tokens: int = 0
    is_decode: bool = False
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class Difference:
    """A request the two runs' divergence step treats differently, and why, in words."""

    request_id: str
    a: Whereabouts
    b: Whereabouts
    why: str


@dataclass(frozen=True, slots=True)
class Divergence:
    """The first step whose schedules differ; ``start_a`` and ``start_b``: when it began in each run
    (seconds since the run's first span; None where the run has no such step)."""

    step: int
    start_a: float | None
    start_b: float | None
    differences: tuple[Difference, ...]


@dataclass(frozen=True, slots=True)
class RequestDelta:
    """One request's latencies in both runs (None where a run has none, e.g. its front end's span is missing)."""

    request_id: str
    ttft_a: float | None
    ttft_b: float | None
    e2e_a: float | None
    e2e_b: float | None

    @property
    def ttft_delta(self) -> float | None:
        return None if self.ttft_a is None or self.ttft_b is None else self.ttft_b - self.ttft_a

    @property
    def e2e_delta(self) -> float | None:
        return None if self.e2e_a is None or self.e2e_b is None else self.e2e_b - self.e2e_a

    def as_dict(self) -> dict:
        return {**asdict(self), "ttft_delta": self.ttft_delta, "e2e_delta": self.e2e_delta}


@dataclass(frozen=True)
class Comparison:
    """Two runs compared. ``divergence`` is None when every step number has the same schedule in
    both, or when the schedules were not compared (``schedules_compared``: both runs have steps)."""

    a: Trace
    b: Trace
    schedules_compared: bool
    num_steps_same: int  # step numbers whose schedules are equal in both runs
    divergence: Divergence | None
    requests: tuple[RequestDelta, ...]  # in A's arrival order
    matched_by: str = "id"  # or "arrival": the runs' request ids differ, B's are renamed to A's

    def summary(self) -> dict[str, dict[str, dict[str, float] | None]]:
        """For TTFT and e2e: the median and p90 of A, of B, of B - A and of |B - A| / A."""
        out = {}
        for metric in ("ttft", "e2e"):
            pairs = [(getattr(r, f"{metric}_a"), getattr(r, f"{metric}_b")) for r in self.requests]
            pairs = [(a, b) for a, b in pairs if a is not None and b is not None]
            out[metric] = {"a": _percentiles(a for a, _ in pairs), "b": _percentiles(b for _, b in pairs),
                           "delta": _percentiles(b - a for a, b in pairs),
                           "abs_relative_delta": _percentiles(abs(b - a) / a for a, b in pairs if a > 0)}
        return out

    def as_dict(self) -> dict:
        return {
            "a": _run_dict(self.a), "b": _run_dict(self.b), "matched_by": self.matched_by,
            "schedules_compared": self.schedules_compared,
            "num_steps_same": self.num_steps_same,
            "divergence": None if self.divergence is None else {
                "step": self.divergence.step, "start_a": self.divergence.start_a, "start_b": self.divergence.start_b,
                "differences": [asdict(d) for d in self.divergence.differences]},
            "requests": [r.as_dict() for r in self.requests],
            "summary": self.summary(),
        }


def _run_dict(trace: Trace) -> dict:
    return {"directory": trace.directory, "num_steps": len(trace.steps), "num_requests": len(trace.requests)}


def _percentiles(values: Iterable[float]) -> dict[str, float] | None:
    values = list(values)
    if not values:
        return None
    median, p90 = np.percentile(values, [50, 90])
    return {"median": float(median), "p90": float(p90)}


# ---- the same workload? ------------------------------------------------------------------------

def _some(ids: list[str]) -> str:
    shown = ", ".join(repr(i) for i in ids[:3])
    return "none" if not ids else shown + (f" and {len(ids) - 3} more" if len(ids) > 3 else "")


def check_same_workload(a: Trace, b: Trace) -> None:
    """ValueError (one line) unless both traces are of format 2 or later and hold the same request
    ids with the same prompt lengths."""
    for name, trace in (("A", a), ("B", b)):
        if trace.trace_format < WORKLOAD_FORMAT:
            raise ValueError(f"{name} ({trace.directory}) is a trace of format {trace.trace_format}, recorded before "
                             f"traces carried their workload; traces diff needs format {WORKLOAD_FORMAT} or later: "
                             "record the run again with this version of tracevllm")
    only_a, only_b = sorted(a.requests.keys() - b.requests.keys()), sorted(b.requests.keys() - a.requests.keys())
    if only_a or only_b:
        raise ValueError(f"{a.directory} and {b.directory} are not runs of the same workload (requests are matched "
                         f"by id): ids only in A: {_some(only_a)}; only in B: {_some(only_b)}")
    for request_id, r in a.requests.items():
        if r.num_prompt_tokens != b.requests[request_id].num_prompt_tokens:
            raise ValueError(f"{a.directory} and {b.directory} are not runs of the same workload: request "
                             f"{request_id!r} has {r.num_prompt_tokens} prompt tokens in A and "
                             f"{b.requests[request_id].num_prompt_tokens} in B")


# ---- where the schedules part ------------------------------------------------------------------

def schedule(step: Step | None) -> Schedule:
    """What the scheduler decided in ``step`` (nothing, for a step the run does not have)."""
    if step is None:
        return {}, frozenset()
    return dict(zip(step.req_ids, zip(step.req_num_tokens, step.req_is_decode))), frozenset(step.preempted_req_ids)


def _tokens(n: int, is_decode: bool) -> str:
    return ("1 decode token" if n == 1 else f"{n} decode tokens") if is_decode else \
        ("1 prefill token" if n == 1 else f"{n} prefill tokens")


def _marks(request: Request, number: int) -> list[tuple[int, int, Admission | Preemption | Wait]]:
    """The request's admissions, preemptions and waits up to step ``number``, in the order they
    happened (in one step: admitted, then preempted, then the reason it waits)."""
    marks: list[tuple[int, int, Admission | Preemption | Wait]] = []
    marks += [(x.step, 0, x) for x in request.admissions if x.step <= number]
    marks += [(x.step, 1, x) for x in request.preempted if x.step <= number]
    marks += [(x.step, 2, x) for x in request.waits if x.step <= number]
    return sorted(marks, key=lambda m: m[:2])


def whereabouts(trace: Trace, steps: dict[int, Step], queue: QueueHead, request_id: str,
                number: int) -> tuple[Whereabouts, str]:
    """What the request was doing in step ``number`` of ``trace``, and the same in words (a verb phrase:
    "waited: too few free KV blocks (needed 2, 0 free)"). Behind the queue's head, what the head waited
    for too."""
    step = steps.get(number)
    if step is None:
        last = max(steps, default=0)
        return Whereabouts("no_step"), f"had no step {number}: the run's last step was {last}"
    if request_id in step.req_ids:
        i = step.req_ids.index(request_id)
        n, is_decode = step.req_num_tokens[i], step.req_is_decode[i]
        return Whereabouts("scheduled", n, is_decode), f"was scheduled ({_tokens(n, is_decode)})"
    request = trace.requests.get(request_id)
    if request_id in step.preempted_req_ids:
        p = next((p for p in request.preempted if p.step == number), None) if request else None
        return Whereabouts("preempted"), "was preempted" + (f": {preemption_words(p, request_id)}" if p else "")
    if request is None:
        return Whereabouts("not_arrived"), "is not in this trace"
    if request.finish_reason is not None and request.chunks and request.chunks[-1].step < number:
        return Whereabouts("finished"), f"had finished (its last step was {request.chunks[-1].step})"
    marks = _marks(request, number)
    if not marks:
        if request.queued > step.start:
            return Whereabouts("not_arrived"), f"had not reached the scheduler yet (it did at {request.queued:.3f} s)"
        return Whereabouts("waiting"), "waited (no reason recorded)"
    last = marks[-1][2]
    if isinstance(last, Wait):
        since = f" (since step {last.step})" if last.step < number else ""
        head = queue.wait_at_step(number) if last.reason == "queued_behind" else None
        at_head = f"; at the queue's head: {wait_words(head)}" if head is not None else ""
        return Whereabouts("waiting", reason=last.reason), f"waited{since}: {wait_words(last)}{at_head}"
    if isinstance(last, Preemption):
        return Whereabouts("waiting", reason="preempted"), f"waited to resume after its preemption at step {last.step}"
    if step.num_scheduled_tokens >= step.token_budget:
        spenders = sorted(zip(step.req_num_tokens, step.req_ids), reverse=True)[:3]
        by = ", ".join(f"{r} {n}" for n, r in spenders)
        return (Whereabouts("running", reason="token_budget"),
                f"was running, but the token budget of {step.token_budget} went to others ({by})")
    return Whereabouts("running", reason="in_flight"), "was running, but its last tokens were still in flight"


def _admission(trace: Trace, request_id: str, number: int) -> Admission | None:
    request = trace.requests.get(request_id)
    return next((x for x in request.admissions if x.step == number), None) if request else None


def _why_tokens_differ(trace_a: Trace, trace_b: Trace, step_a: Step, step_b: Step, request_id: str) -> str:
    """Why one request computed different token counts in the same step of two runs: its tokens
    computed before, its prefix-cache lookups where they differ (admitted in this step), a token
    budget spent where it got fewer."""
    clauses = []
    computed = [dict(zip(s.req_ids, s.req_num_computed_tokens)).get(request_id) for s in (step_a, step_b)]
    if None not in computed and computed[0] != computed[1]:
        clauses.append(f"it had {computed[0]} tokens computed before the step in A, {computed[1]} in B")
    lookups = [_admission(trace, request_id, step_a.number) for trace in (trace_a, trace_b)]
    words = [lookup_words(x) if x is not None and x.miss_reason is not None else None for x in lookups]
    if words[0] != words[1]:
        clauses += [f"in {name} its prefix-cache lookup: {w}" for name, w in zip("AB", words) if w]
    tokens = [s.req_num_tokens[s.req_ids.index(request_id)] for s in (step_a, step_b)]
    for name, step, fewer in (("A", step_a, tokens[0] < tokens[1]), ("B", step_b, tokens[1] < tokens[0])):
        if fewer and step.num_scheduled_tokens >= step.token_budget:
            clauses.append(f"{name}'s token budget of {step.token_budget} was spent")
    return "; ".join(clauses)


def _difference(a: Trace, b: Trace, steps_a: dict[int, Step], steps_b: dict[int, Step],
                queues: tuple[QueueHead, QueueHead], request_id: str, number: int) -> Difference:
    where_a, words_a = whereabouts(a, steps_a, queues[0], request_id, number)
    where_b, words_b = whereabouts(b, steps_b, queues[1], request_id, number)
    why = f"in A request {request_id} {words_a}; in B it {words_b}"
    if where_a.state == where_b.state == "scheduled":
        reasons = _why_tokens_differ(a, b, steps_a[number], steps_b[number], request_id)
        why += f": {reasons}" if reasons else ""
    return Difference(request_id, where_a, where_b, why)


def find_divergence(a: Trace, b: Trace) -> tuple[int, Divergence | None]:
    """The number of step numbers whose schedules agree, and the first one where they do not."""
    steps_a, steps_b = {s.number: s for s in a.steps}, {s.number: s for s in b.steps}
    num_same, first = 0, None
    for number in sorted(steps_a.keys() | steps_b.keys()):
        if schedule(steps_a.get(number)) == schedule(steps_b.get(number)):
            num_same += 1
        elif first is None:
            first = number
    if first is None:
        return num_same, None
    (ran_a, preempted_a), (ran_b, preempted_b) = schedule(steps_a.get(first)), schedule(steps_b.get(first))
    request_ids = list(dict.fromkeys([*ran_a, *ran_b, *sorted(preempted_a), *sorted(preempted_b)]))
    queues = QueueHead(a.requests.values()), QueueHead(b.requests.values())
    differences = tuple(_difference(a, b, steps_a, steps_b, queues, r, first) for r in request_ids
                        if (ran_a.get(r), r in preempted_a) != (ran_b.get(r), r in preempted_b))
    start_a, start_b = (steps[first].start if first in steps else None for steps in (steps_a, steps_b))
    return num_same, Divergence(first, start_a, start_b, differences)


def compare_runs(a: Trace, b: Trace) -> Comparison:
    """Two traces of the same workload compared (ValueError, see ``check_same_workload``, if they are not).
    Where they share no request id, B's requests are matched to A's by arrival and renamed."""
    names = match_requests(a, b)
    if names is not None:
        b = renamed(b, names)
    check_same_workload(a, b)
    compared = a.has_steps and b.has_steps
    num_same, divergence = find_divergence(a, b) if compared else (0, None)
    deltas = tuple(RequestDelta(r.request_id, r.ttft, other.ttft, r.e2e, other.e2e)
                   for r in a.requests.values() for other in (b.requests[r.request_id],))
    return Comparison(a, b, compared, num_same, divergence, deltas, "id" if names is None else "arrival")


# ---- tracevllm traces diff ---------------------------------------------------------------------

def _seconds(x: float | None, sign: bool = False) -> str:
    return "-" if x is None else f"{x:+.3f}" if sign else f"{x:.3f}"


def _table(requests: tuple[RequestDelta, ...]) -> list[str]:
    """Every request in arrival order, or, when there are more than ``MAX_ROWS``, those whose e2e
    changed most."""
    rows = list(requests)
    if len(rows) > MAX_ROWS:
        rows = sorted(rows, key=lambda r: -abs(r.e2e_delta or 0.0))[:MAX_ROWS]
    width = max([len("request"), *(len(r.request_id) for r in rows)])
    lines = [f"{'request':<{width}}  {'TTFT A':>8} {'TTFT B':>8} {'Δ':>8}   {'e2e A':>8} {'e2e B':>8} {'Δ':>8}  (s)"]
    lines += [f"{r.request_id:<{width}}  {_seconds(r.ttft_a):>8} {_seconds(r.ttft_b):>8} "
              f"{_seconds(r.ttft_delta, True):>8}   {_seconds(r.e2e_a):>8} {_seconds(r.e2e_b):>8} "
              f"{_seconds(r.e2e_delta, True):>8}" for r in rows]
    if len(rows) < len(requests):
        lines.append(f"... the {MAX_ROWS} of {len(requests)} requests whose e2e changed most (--json lists them all)")
    return lines


def describe(c: Comparison) -> str:
    """The comparison in words and a table."""
    lines = [f"A: {c.a.directory} ({len(c.a.steps)} steps, {len(c.a.requests)} requests)",
             f"B: {c.b.directory} ({len(c.b.steps)} steps, {len(c.b.requests)} requests)"]
    if c.matched_by == "arrival":
        lines.append("the runs' request ids differ (a server's are random): B's requests are matched to A's by "
                     "arrival and prompt length, and named by A's ids")
    d = c.divergence
    if not c.schedules_compared:
        lines.append("schedules not compared: a run has no engine steps (recorded with --trace-level request)")
    elif d is None:
        lines.append(f"the schedules never part: all {c.num_steps_same} steps are the same in both")
    else:
        when = f"A at {_seconds(d.start_a)} s, B at {_seconds(d.start_b)} s"
        before = "the steps before it are the same" if d.step > 1 else "the first step: none came before it"
        lines.append(f"the schedules part at step {d.step} ({when}; {before}):")
        lines += [f"  {x.why}" for x in d.differences]
        total = len({s.number for s in c.a.steps} | {s.number for s in c.b.steps})
        lines.append(f"{c.num_steps_same} of {total} steps have the same schedule in both")
    lines += ["", *_table(c.requests), ""]
    summary = c.summary()
    for metric, name in (("ttft", "TTFT"), ("e2e", "e2e")):
        s = summary[metric]
        if s["delta"] is None:
            lines.append(f"{name}: no request has it in both runs")
            continue
        relative = s["abs_relative_delta"]
        rel = f"; |B - A| / A median {relative['median']:.1%}, p90 {relative['p90']:.1%}" if relative else ""
        lines.append(f"{name}: A median {s['a']['median']:.3f} s, p90 {s['a']['p90']:.3f} s; "
                     f"B median {s['b']['median']:.3f} s, p90 {s['b']['p90']:.3f} s; "
                     f"B - A median {s['delta']['median']:+.3f} s, p90 {s['delta']['p90']:+.3f} s{rel}")
    return "\n".join(lines)


def run(args: argparse.Namespace, a: Trace, b: Trace) -> int:
    """``tracevllm traces diff A B [--json] [-o PICTURE]`` on the two runs the command loaded
    (ValueError, one line, for two runs it cannot compare)."""
    gc.freeze()  # the command ends soon: the cyclic collector need not walk the two traces' objects again
    comparison = compare_runs(a, b)
    if args.output:
        from viz.plots.aligned_timelines import plot_aligned_timelines  # matplotlib only when a picture is asked for

        plot_aligned_timelines(comparison).savefig(args.output)
    if args.json:
        print(json.dumps({**comparison.as_dict(), "picture": args.output}, indent=1))
    else:
        print(describe(comparison) + (f"\nwrote {args.output}" if args.output else ""))
    return 0
