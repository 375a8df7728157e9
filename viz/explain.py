"""Why was my request slow? Every second of a request's end-to-end latency charged to a cause.

``tracevllm traces explain DIR`` reads a ``--trace-out`` directory recorded at step level. A
request's e2e (its ``llm_request``: arrival until the last output) is cut at the engine core's
``QUEUED`` and ``FINISHED`` marks, and the engine core's stretch is walked piece by piece, an
engine step or the gap between two steps at a time::

    arrival ─ frontend ─ queued ─── steps and gaps, each charged below ─── finished ─ frontend ─ end

Each piece goes to one part (``PARTS``), by what the request was doing:

- **waiting, never admitted yet**: ``queued.<reason>``, the reason of its last ``WAITING`` event
  (``queued.next_step`` before the first: it arrived during a step and waits for the next one). A
  request ``queued_behind`` the one ahead of it waits, in the end, for what the queue's head waits
  for: those seconds go to the reason the head recorded last (``QueueHead``);
- **waiting after a preemption**: ``preempted.waiting``;
- **running, in a step that ran it**: the step's cost is shared among the step's requests (the cost
  model below); its own share is ``prefill``, ``decode`` or ``preempted.recompute`` (a prefill after
  a resume), the others' shares are ``other_requests``;
- **running, in a step that did not run it** (the budget went to others, or its tokens were in
  flight): ``other_requests``, all of it;
- **running, between steps**: ``engine_loop``, the busy loop's own work (inputs in, outputs out);
- **any state, in a step that paid a one-time cost** (a torch.compile: the step's
  ``step.one_time_costs``): that cost's seconds are ``one_time``, and the notes name it; the rest of
  the step is charged as above;
- **any state, in a step far slower than the run's own step-cost model predicts for its batch**
  (``slow_steps``; a busy machine, a stall, a compile the trace does not mark): the seconds over the
  prediction are ``slower_than_usual``, and the notes name the step; the rest is charged as above.

``blamed`` charges the other requests: their shares of every step the request spent waiting for
them or sharing with them. So the parts add up to the e2e exactly, and ``blamed`` says who.

The cost model is the run's own step-cost model (``tracevllm/step_cost.py``, fitted as ``traces fit``
fits it, on the start-up's step profile when the trace has one): a request's share of a step is the
part of the model's prediction that its own work causes (``StepCostModel.shares``: the step's fixed
cost equally, the profiled step by tokens, its context and attention by its own), scaled so that the
shares add up to the step's duration. A run with too few steps to fit one shares each step equally.

Tokens come out at the end of a step that decodes the request, or that ends a run of its prefill
chunks. A gap between two tokens longer than twice the request's median gap is given its cause: a
one-time cost, a preemption, a step far slower than usual (if that explains at least half of the
gap's excess), or else the other request that took the largest share of the steps in between.

Requests are named as the live page names them, short id first: ``#3 (chatcmpl-…)`` (``page_labels``).
"""

from __future__ import annotations

import argparse
import json
import statistics
from bisect import bisect_right
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from viz.model import Admission, Preemption, Request, Step, Trace, Wait
from tracevllm.step_cost import StepCostModel
from viz.fit import fit_trace, is_spike, predict_step

PARTS = ("frontend", "queued.next_step", "queued.token_budget", "queued.max_num_seqs", "queued.kv_cache",
         "queued.preemption", "queued.in_flight", "queued.queued_behind", "prefill", "decode", "other_requests",
         "preempted.waiting", "preempted.recompute", "engine_loop", "one_time", "slower_than_usual")
_PART_WORDS = {
    "frontend": "the front end (tokenize, detokenize, output)", "queued.next_step": "waiting for the next step",
    "queued.token_budget": "queued: the token budget was spent", "queued.max_num_seqs": "queued: max_num_seqs",
    "queued.kv_cache": "queued: too few free KV blocks", "queued.preemption": "queued: a preemption in its step",
    "queued.in_flight": "queued: its tokens in flight", "queued.queued_behind": "queued behind another request",
    "prefill": "its own prefill", "decode": "its own decode", "other_requests": "other requests' tokens in its steps",
    "preempted.waiting": "preempted, waiting to resume", "preempted.recompute": "recomputing after a preemption",
    "engine_loop": "the engine loop between steps",
    "one_time": "a one-time cost in its step (a compile)",
    "slower_than_usual": "machine slower than usual (steps far over the run's step-cost model)",
}


def _shares(model: StepCostModel | None, step: Step) -> dict[str, float]:
    """Each request's fraction of the step (they add up to 1); equal without a model."""
    if model is None:
        return {r: 1 / step.batch_size for r in step.req_ids}
    return dict(zip(step.req_ids, model.shares(step.req_num_tokens, step.req_is_decode, step.req_num_computed_tokens)))


@dataclass
class Gap:
    step: int
    gap_s: float
    cause: str


@dataclass
class Explanation:
    request_id: str
    e2e_s: float
    ttft_s: float | None
    label: str = ""  # the live page's short id, "#3" (page_labels)
    parts: dict[str, float] = field(default_factory=dict)
    blamed: dict[str, float] = field(default_factory=dict)
    gaps: list[Gap] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # preemptions and prefix-cache misses, in words

    def add(self, part: str, seconds: float) -> None:
        if seconds > 0:
            self.parts[part] = self.parts.get(part, 0.0) + seconds

    def blame(self, request_id: str, seconds: float) -> None:
        if seconds > 0:
            self.blamed[request_id] = self.blamed.get(request_id, 0.0) + seconds

    def as_dict(self) -> dict:
        return {"request_id": self.request_id, "label": self.label, "e2e_s": self.e2e_s, "ttft_s": self.ttft_s,
                "parts": {p: self.parts[p] for p in PARTS if p in self.parts},
                "blamed": dict(sorted(self.blamed.items(), key=lambda kv: -kv[1])),
                "gaps": [{"step": g.step, "gap_s": g.gap_s, "cause": g.cause} for g in self.gaps]}


def page_labels(requests: Iterable[Request]) -> dict[str, str]:
    """Each request's short id as the live page shows it: ``#i``, the i-th request the engine core
    queued, counted from 0. The page (JavaScript: ``tracevllm/entrypoints/ui/static/model.js``,
    ``EngineModel.request``) numbers requests in the order it first hears of them, which for a page
    that follows a run from its start, and for ``tracevllm traces view``, is the order of their
    ``RequestQueued`` events: of their QUEUED marks, as here. (A page opened mid-run numbers from the
    first request it found; its panel says so.)"""
    ordered = sorted(requests, key=lambda r: r.queued)  # stable: ties keep the trace's arrival order
    return {r.request_id: f"#{i}" for i, r in enumerate(ordered)}


def slow_steps(steps: tuple[Step, ...], model: StepCostModel | None) -> dict[int, tuple[float, float]]:
    """The steps that ran far slower than the run's own step-cost model predicts for their batch, each
    with its duration and the prediction (seconds). Far slower is the fit's own spike rule
    (``StepCostModel.is_spike``: over ``SPIKE_RATIO`` times the prediction and ``SPIKE_MIN_S`` more): a
    step's batch cannot explain that, the machine can (another process on the cores, a stall, a compile
    the trace does not mark). Steps that paid a one-time cost the trace names are not among them (theirs
    is ``one_time``); none without a model."""
    if model is None:
        return {}
    return {s.number: (s.end - s.start, predict_step(model, s)) for s in steps
            if s.num_scheduled_tokens > 0 and s.is_batch_cost_only and is_spike(model, s)}


def run_model(trace: Trace) -> StepCostModel | None:
    """The run's step-cost model (``viz/fit.py``), or None when it cannot be fitted (fewer than two
    steps ran tokens)."""
    try:
        return fit_trace(trace)
    except ValueError:
        return None


class QueueHead:
    """What the waiting queue's head waited for, over the run: every reason but ``queued_behind`` is
    recorded by the request at the head (``core/sched/waiting_reasons.py``), so the last such reason
    recorded by anyone is the queue's, and what every request behind the head waits for in the end."""

    def __init__(self, requests: Iterable[Request]) -> None:
        self.waits = sorted((w for r in requests for w in r.waits if w.reason != "queued_behind"),
                            key=lambda w: (w.time, w.step))
        self.times = [w.time for w in self.waits]
        self.steps = [w.step for w in self.waits]

    def reason_at(self, time: float) -> str:
        i = bisect_right(self.times, time) - 1
        return self.waits[i].reason if i >= 0 else "queued_behind"

    def wait_at_step(self, number: int) -> Wait | None:
        """The head's reason as recorded at or before step ``number``."""
        i = bisect_right(self.steps, number) - 1
        return self.waits[i] if i >= 0 else None


class _Timeline:
    """A request's state at any time: waiting (with its reason), preempted, or running."""

    def __init__(self, request: Request) -> None:
        marks = [(request.queued, "queued", "queued.next_step")]
        marks += [(w.time, "wait", w.reason) for w in request.waits]
        marks += [(a.time, "admitted", "resumed" if a.resumed else "") for a in request.admissions]
        marks += [(t, "preempted", "") for t in request.preemptions]
        marks.sort(key=lambda m: m[0])
        self.times = [m[0] for m in marks]
        self.states: list[str] = []
        state, resumed = "queued.next_step", False
        for _, kind, detail in marks:
            if kind == "admitted":
                state, resumed = "running", resumed or detail == "resumed"
            elif kind == "preempted":
                state = "preempted.waiting"
            elif kind == "wait" and state != "running":
                state = state if state == "preempted.waiting" else f"queued.{detail}"
            self.states.append(state)
        self.resumed_at = min((a.time for a in request.admissions if a.resumed), default=None)

    def state_at(self, time: float) -> str:
        i = bisect_right(self.times, time) - 1
        return self.states[i] if i >= 0 else "queued.next_step"


def _pieces(steps: tuple[Step, ...], start: float, end: float) -> list[tuple[float, float, Step | None]]:
    """``[start, end]`` cut into engine steps and the gaps between them."""
    pieces, t = [], start
    first = max(0, bisect_right([s.end for s in steps], start))
    for step in steps[first:]:
        if step.start >= end:
            break
        if step.start > t:
            pieces.append((t, step.start, None))
        a, b = max(step.start, t), min(step.end, end)
        if b > a:
            pieces.append((a, b, step))
        t = max(t, b)
    if end > t:
        pieces.append((t, end, None))
    return pieces


def _token_steps(request: Request) -> list[tuple[int, float]]:
    """The steps after which the request had a new token, and when they ended: each decode, and the
    last of each run of prefill chunks."""
    out = []
    chunks = request.chunks
    for i, chunk in enumerate(chunks):
        if chunk.is_decode or i + 1 == len(chunks) or chunks[i + 1].is_decode:
            out.append((chunk.step, chunk.end))
    return out


def _blocks(n: int) -> str:
    return f"{n} block" if n == 1 else f"{n} blocks"


def _slow_words(number: int, duration: float, predicted: float) -> str:
    return (f"step {number} took {duration:.3f} s where the run's step-cost model predicts {predicted:.3f} s: "
            "the machine was slower than usual")


def _gap_cause(request: Request, steps: list[Step], model: StepCostModel | None, excess: float,
               slow: Mapping[int, tuple[float, float]], labels: Mapping[str, str]) -> str:
    paid = [(step.number, what, seconds) for step in steps for what, seconds in step.one_time_costs]
    if paid:
        number, what, seconds = max(paid, key=lambda p: p[2])
        return f"step {number} paid a one-time cost, {what} {seconds:.1f} s: +{excess * 1e3:.0f} ms"
    preempted = [p for p in request.preempted if steps and steps[0].number <= p.step <= steps[-1].number]
    if preempted:
        p = preempted[0]
        who = "itself" if p.forced_by == request.request_id else labels.get(p.forced_by, p.forced_by)
        return (f"preempted at step {p.step} for {who} ({_blocks(p.num_blocks_needed)} needed, "
                f"{p.num_free_blocks} free), {p.num_lost_tokens} tokens to compute again: +{excess * 1e3:.0f} ms")
    over = [(step.number, *slow[step.number]) for step in steps if step.number in slow]
    if over and sum(d - p for _, d, p in over) >= excess / 2:
        number, duration, predicted = max(over, key=lambda o: o[1] - o[2])
        return f"{_slow_words(number, duration, predicted)}: +{excess * 1e3:.0f} ms"
    others: dict[str, tuple[float, int, int, bool]] = {}  # request -> (seconds, step, tokens, is_decode)
    for step in steps:
        for r, share in _shares(model, step).items():
            if r == request.request_id:
                continue
            i = step.req_ids.index(r)
            seconds = share * (step.end - step.start)
            best = others.get(r)
            if best is None or seconds > best[0]:
                others[r] = (seconds, step.number, step.req_num_tokens[i], step.req_is_decode[i])
    if not others:
        return f"steps {steps[0].number}-{steps[-1].number} ran without it: +{excess * 1e3:.0f} ms" if steps else ""
    r, (_, number, n, is_decode) = max(others.items(), key=lambda kv: kv[1][0])
    ran = request.request_id in steps[-1].req_ids and len(steps) == 1
    name = labels.get(r, r)
    what = f"{name}'s decode" if is_decode else f"{name}'s {n}-token prefill chunk"
    return f"step {number} {'also ran' if ran else 'ran'} {what}: +{excess * 1e3:.0f} ms"


_WAIT_WORDS = {"token_budget": "the token budget went to others", "max_num_seqs": "max_num_seqs requests ran",
               "kv_cache": "too few free KV blocks", "preemption": "a request was preempted in its step",
               "in_flight": "its tokens were in flight", "queued_behind": "behind the request ahead of it in the queue"}


def wait_words(w: Wait) -> str:
    """Why a request waited, in words: "too few free KV blocks (needed 2, 0 free)", or, vLLM's admission
    rule, "too few free KV blocks (the whole prompt must fit: 15 blocks needed, 6 free)"."""
    who = f" (spent by {', '.join(w.blocked_by)})" if w.reason == "token_budget" and w.blocked_by else \
          f" ({w.blocked_by[0]})" if w.reason == "queued_behind" and w.blocked_by else \
          f" ({_kv_words(w)})" if w.reason == "kv_cache" else ""
    return f"{_WAIT_WORDS.get(w.reason, w.reason)}{who}"


def _kv_words(w: Wait) -> str:
    need = (f"the whole prompt must fit: {_blocks(w.num_blocks_needed)} needed" if w.full_sequence
            else f"needed {w.num_blocks_needed}")
    kept = f", {w.num_watermark_blocks} kept free by the watermark" if w.num_watermark_blocks else ""
    return f"{need}, {w.num_free_blocks} free{kept}"


def preemption_words(p: Preemption, request_id: str) -> str:
    """Who forced the preemption of ``request_id`` and what it lost, in words."""
    who = "it needed" if p.forced_by == request_id else f"{p.forced_by} needed"
    return (f"{who} {_blocks(p.num_blocks_needed)} with {p.num_free_blocks} free, and {p.policy} picked it; "
            f"the KV of {p.num_lost_tokens} tokens was lost")


def lookup_words(a: Admission) -> str:
    """How far an admission's prefix-cache lookup got, and why it stopped there, in words."""
    if a.num_blocks_looked_up == 0 and a.miss_reason == "partial_block":
        return "nothing to look up, the prompt is shorter than a full block"
    why = {"partial_block": "what is left is less than a full block",
           "never_stored": "no earlier request stored the next block",
           "evicted": f"the next block was evicted at step {a.miss_evicted_step} for {a.miss_evicted_for}",
           "cleared": "the cache was reset", "prefix_caching_off": "prefix caching is off",
           "prompt_logprobs": "prompt logprobs skip the cache"}.get(a.miss_reason or "", a.miss_reason)
    return f"{a.num_blocks_hit} of {a.num_blocks_looked_up} full blocks hit; {why}"


def _notes(request: Request) -> list[str]:
    notes = [f"from step {w.step} it waited: {wait_words(w)}" for w in request.waits[:6]]
    notes += [f"preempted at step {p.step}: {preemption_words(p, request.request_id)}" for p in request.preempted]
    notes += [f"prefix cache at step {a.step}: {lookup_words(a)}" for a in request.admissions
              if a.miss_reason is not None]
    return notes


def _one_time_notes(request: Request, paid: tuple[Step, ...]) -> list[str]:
    """The one-time costs of the steps (of those that ``paid`` one) the request lived through, by name."""
    end = request.arrival + (request.e2e or 0.0)
    return [f"step {s.number} paid a one-time cost: {what}, {seconds:.1f} s" for s in paid
            if s.end > request.arrival and s.start < end for what, seconds in s.one_time_costs]


def _slow_notes(request: Request, steps: tuple[Step, ...], slow: Mapping[int, tuple[float, float]]) -> list[str]:
    """The steps far slower than usual (``slow``) that the request lived through."""
    end = request.arrival + (request.e2e or 0.0)
    return [_slow_words(s.number, *slow[s.number]) for s in steps
            if s.number in slow and s.end > request.arrival and s.start < end]


def explain_request(request: Request, steps: tuple[Step, ...], model: StepCostModel | None, queue: QueueHead,
                    paid: tuple[Step, ...] = (), slow: Mapping[int, tuple[float, float]] | None = None,
                    labels: Mapping[str, str] | None = None) -> Explanation | None:
    """None for a request without an e2e (its front-end span is missing). ``paid``: the steps that paid
    a one-time cost; ``slow``: the steps far slower than usual (``slow_steps``); ``labels``: the page's
    short ids (``page_labels``)."""
    if request.e2e is None:
        return None
    slow, labels = slow or {}, labels or {}
    notes = _notes(request) + _one_time_notes(request, paid) + _slow_notes(request, steps, slow)
    x = Explanation(request.request_id, request.e2e, request.ttft, labels.get(request.request_id, ""), notes=notes)
    end = request.arrival + request.e2e
    q0, q1 = min(max(request.queued, request.arrival), end), min(max(request.finished, request.queued), end)
    x.add("frontend", (q0 - request.arrival) + (end - q1))
    timeline = _Timeline(request)
    for a, b, step in _pieces(steps, q0, q1):
        state = timeline.state_at((a + b) / 2)
        if state == "queued.queued_behind":
            state = f"queued.{queue.reason_at((a + b) / 2)}"
        if step is None:
            x.add("engine_loop" if state == "running" else state, b - a)
            continue
        seconds = b - a
        if step.one_time_costs:  # the cost's share of the step is nobody's batch
            once = min(1.0, sum(s for _, s in step.one_time_costs) / max(step.end - step.start, 1e-9))
            x.add("one_time", once * seconds)
            seconds -= once * seconds
        if step.number in slow:  # the seconds over the run's cost model are the machine's, nobody's batch
            duration, predicted = slow[step.number]
            over = (duration - predicted) / duration
            x.add("slower_than_usual", over * seconds)
            seconds -= over * seconds
        shares = _shares(model, step)
        for r, share in shares.items():
            if r != request.request_id:
                x.blame(r, share * seconds)
        if state != "running":
            x.add(state, seconds)
            continue
        own = shares.get(request.request_id, 0.0)
        x.add("other_requests", (1 - own) * seconds)
        if own:
            is_decode = step.req_is_decode[step.req_ids.index(request.request_id)]
            resumed = timeline.resumed_at is not None and step.end > timeline.resumed_at
            x.add("decode" if is_decode else "preempted.recompute" if resumed else "prefill", own * seconds)
    x.gaps = _gaps(request, steps, model, slow, labels)
    return x


def _gaps(request: Request, steps: tuple[Step, ...], model: StepCostModel | None, slow: Mapping[int, tuple[float, float]],
          labels: Mapping[str, str]) -> list[Gap]:
    tokens = _token_steps(request)
    gaps = [(tokens[i][0], tokens[i][1] - tokens[i - 1][1], tokens[i - 1][0]) for i in range(1, len(tokens))]
    if len(gaps) < 2:
        return []
    median = statistics.median(g for _, g, _ in gaps)
    by_number = {s.number: s for s in steps}
    out = []
    for number, gap, previous in gaps:
        if gap > 2 * median:
            between = [by_number[n] for n in range(previous + 1, number + 1) if n in by_number]
            out.append(Gap(number, gap, _gap_cause(request, between, model, gap - median, slow, labels)))
    return out


def explain(trace: Trace) -> list[Explanation]:
    """Every request of the trace with an e2e, the slowest first."""
    steps = trace.require_steps()
    model, queue = run_model(trace), QueueHead(trace.requests.values())
    paid = tuple(s for s in steps if s.one_time_costs)
    slow, labels = slow_steps(steps, model), page_labels(trace.requests.values())
    explanations = [x for r in trace.requests.values()
                    if (x := explain_request(r, steps, model, queue, paid, slow, labels)) is not None]
    return sorted(explanations, key=lambda x: -x.e2e_s)


def describe(x: Explanation, labels: Mapping[str, str] | None = None) -> str:
    """A few plain sentences about one request, named ``#3 (its id)``; the others it charges by their
    short id, from ``labels`` (``page_labels``)."""
    labels = labels or {}
    ttft = f", first token after {x.ttft_s:.3f} s" if x.ttft_s is not None else ""
    name = f"{x.label} ({x.request_id})" if x.label else x.request_id
    lines = [f"{name}: {x.e2e_s:.3f} s end to end{ttft}."]
    parts = sorted(x.parts.items(), key=lambda kv: -kv[1])
    lines.append("  " + "; ".join(f"{_PART_WORDS.get(p, p)} {s:.3f} s ({s / x.e2e_s:.0%})" for p, s in parts
                                  if s >= 0.0005) + ".")
    if x.blamed:
        top = sorted(x.blamed.items(), key=lambda kv: -kv[1])[:3]
        lines.append("  Charged to other requests: " + ", ".join(f"{labels.get(r, r)} {s:.3f} s" for r, s in top) + ".")
    lines += [f"  {note}." for note in x.notes]
    lines += [f"  Token after step {g.step} came {g.gap_s * 1e3:.0f} ms after the one before: {g.cause}."
              for g in x.gaps[:5]]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """``tracevllm traces explain``."""
    from viz.trace_loader import load_trace

    trace = load_trace(args.directory)
    explanations, labels = explain(trace), page_labels(trace.requests.values())
    if args.request is not None:
        explanations = [x for x in explanations if args.request in (x.request_id, x.label)]
        if not explanations:
            raise ValueError(f"no request {args.request!r} with an e2e in {args.directory}")
    if args.json:
        print(json.dumps({"requests": [x.as_dict() for x in explanations]}, indent=1))
    else:
        print("\n\n".join(describe(x, labels) for x in explanations))
    return 0
