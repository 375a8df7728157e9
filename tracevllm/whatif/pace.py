"""The replay's clock: what a step costs, and what passes between steps, both taken from the recorded run.

- A step lasts what the step-cost model fitted on the recorded steps predicts for its batch
  (``tracevllm/step_cost.py``, fitted as ``tracevllm traces fit`` fits it: ``viz/fit.py``), times
  ``scale``: the recorded steps' time over the model's prediction of those same steps. The fit is
  robust, so it follows the typical step; a run's time also holds the steps the machine stretched
  (spikes, left out of the fit), and a re-run pays such steps too. The scale spreads them over every
  step, so that the recorded batches, replayed, take the recorded time. It all goes to ``execute_model``.
- Between two steps of a busy engine passes ``gap_s``: the recorded median of the time from a step's
  end to the next one's start, while requests were unfinished (offline, the front end's work on the
  step's outputs; in a server, the busy loop's). An idle engine that is handed a request steps as long
  after it queues it.
- The front end sees a step's outputs ``output_delay_s`` after the step ends: the recorded median,
  over the requests, of the time from the end of the step that sampled a request's first token to the
  first token as the front end timed it (``llm_request``'s TTFT). TTFT and e2e include it.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from tracevllm.step_cost import BatchFeatures, StepCostModel
from viz.fit import fit_trace, predict_step
from viz.model import Trace


@dataclass(frozen=True)
class Pace:
    cost: StepCostModel
    gap_s: float
    output_delay_s: float
    scale: float = 1.0

    @staticmethod
    def recorded(trace: Trace) -> Pace:
        """Fitted on ``trace``'s steps (ValueError for a trace without steps, or too few to fit)."""
        steps = trace.require_steps()
        gaps = [b.start - a.end for a, b in zip(steps, steps[1:]) if a.num_running_reqs + a.num_waiting_reqs > 0]
        first_step_end: dict[str, float] = {}
        for step in steps:
            for req_id, n, computed in zip(step.req_ids, step.req_num_tokens, step.req_num_computed_tokens):
                request = trace.requests.get(req_id)
                if request is not None and req_id not in first_step_end and computed + n >= request.num_prompt_tokens:
                    first_step_end[req_id] = step.end
        delays = [trace.requests[r].first_token - end for r, end in first_step_end.items()
                  if trace.requests[r].first_token is not None]
        cost = fit_trace(trace)
        # every step that ran tokens, spikes included; not those that paid a one-time cost or a thread probe
        ran = [s for s in steps if s.num_scheduled_tokens > 0 and s.is_batch_cost_only]
        predicted = sum(predict_step(cost, s) for s in ran)
        return Pace(cost, max(0.0, statistics.median(gaps)) if gaps else 0.0,
                    max(0.0, statistics.median(delays)) if delays else 0.0,
                    sum(s.end - s.start for s in ran) / predicted if predicted > 0 else 1.0)

    def step_seconds(self, num_tokens: list[int], is_decode: list[bool], num_computed_tokens: list[int]) -> float:
        """The predicted duration of a step that runs this batch."""
        return self.scale * self.cost.predict(BatchFeatures.of(num_tokens, is_decode, num_computed_tokens))
