"""What ``tracevllm traces check`` (viz/check.py) reads off a loaded trace: each request's life
from its ``scheduler.request`` span, the start-up's limits, and each step's raw attributes and stages
(what the loaded model of ``viz/model.py`` does not keep)."""

from __future__ import annotations

from dataclasses import dataclass

from tracevllm.tracing.schema import STEP_PARTS, STEP_STAGES, Attr, EventName, SpanName, block_change_keys
from viz.blocks import unflatten
from viz.model import SpanEvent, Step, Trace

ADMITTED = (EventName.SCHEDULED, EventName.RESUMED)


@dataclass(frozen=True)
class Life:
    """One engine-core request, from its ``scheduler.request`` span."""

    request_id: str
    queued: float  # seconds, as Step.start
    order_key: tuple  # the priority queue's order (Request.__lt__): priority, arrival, id
    num_prompt_tokens: int
    num_output_tokens: int
    events: tuple[SpanEvent, ...]
    finish_reason: str | None

    def admissions(self) -> list[SpanEvent]:
        return [e for e in self.events if e.name in ADMITTED]


@dataclass(frozen=True)
class Facts:
    """What the invariants read: the trace, and what the loaded model leaves in the spans."""

    trace: Trace
    lives: dict[str, Life]
    startup: dict  # the EngineCore init span's attributes and its phases'
    step_attributes: dict[int, dict]  # each engine_step span's raw attributes, by step number
    stages: dict[int, set[str]]  # the stage spans each step ran
    # Per step, per stage with host parts: (the stage's nanoseconds, its parts' nanoseconds together).
    stage_parts: dict[int, dict[str, tuple[int, int]]]

    @staticmethod
    def of(trace: Trace) -> Facts:
        step_numbers, startup, step_attributes, lives = {}, {}, {}, {}
        for span in trace.spans:
            if span.name == SpanName.ENGINE_STEP:
                step_numbers[span.span_id] = span.attributes[Attr.STEP_NUMBER]
                step_attributes[span.attributes[Attr.STEP_NUMBER]] = span.attributes
            elif span.name in (SpanName.ENGINE_CORE_INIT, SpanName.ALLOCATE_KV_CACHE):
                startup.update(span.attributes)
        stages: dict[int, set[str]] = {}
        stage_spans = {}
        for span in trace.spans:
            if span.name in STEP_STAGES and span.parent_id in step_numbers:
                stages.setdefault(step_numbers[span.parent_id], set()).add(span.name)
                stage_spans[span.span_id] = span
            elif span.name == SpanName.SCHEDULER_REQUEST:
                a, request = span.attributes, trace.requests[span.attributes[Attr.REQUEST_ID]]
                finished = next((e for e in span.events if e.name == EventName.FINISHED), None)
                lives[request.request_id] = Life(
                    request.request_id, request.queued,
                    (a.get(Attr.PRIORITY, 0), request.arrival, request.request_id), a[Attr.NUM_PROMPT_TOKENS],
                    a.get(Attr.NUM_OUTPUT_TOKENS, 0), span.events,
                    finished and finished.attributes.get(Attr.EVENT_FINISH_REASON))
        stage_parts: dict[int, dict[str, tuple[int, int]]] = {}
        for span in trace.spans:
            stage = stage_spans.get(span.parent_id)
            if stage is not None and span.name in STEP_PARTS.get(stage.name, ()):
                per_stage = stage_parts.setdefault(step_numbers[stage.parent_id], {})
                stage_ns, parts_ns = per_stage.get(stage.name, (stage.end_ns - stage.start_ns, 0))
                per_stage[stage.name] = (stage_ns, parts_ns + span.end_ns - span.start_ns)
        return Facts(trace, lives, startup, step_attributes, stages, stage_parts)

    def block_changes(self, step: Step, prefix: str) -> dict[str, tuple[int, ...]] | None:
        """The step's ``prefix.*`` block changes per request, or None if the trace lacks them."""
        a, keys = self.step_attributes[step.number], block_change_keys(prefix)
        return unflatten(*(a[k] for k in keys)) if keys[0] in a else None
