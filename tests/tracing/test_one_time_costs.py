"""One-time costs inside a step (worker/one_time_costs.py): a real torch.compile run inside one step's
forward is drawn under that step, named by ``traces explain``, and left out of both step-cost fits."""

from __future__ import annotations

import torch

from tests.trace_utils import attrs, load_spans
from tracevllm import LLM, SamplingParams
from tracevllm.layers.compiled import compiled
from tracevllm.worker.gpu_model_runner import GPUModelRunner
from viz.explain import explain
from viz.trace_loader import load_trace
from viz.fit import fit_steps


def test_a_compile_in_a_step_is_named_and_left_out_of_the_fits(tiny_checkpoint, tmp_path, monkeypatch):
    plain_execute = GPUModelRunner.execute_model
    compiled_in: list[int] = []

    def execute_model(self, scheduler_output):
        first_long_prefill = scheduler_output.total_num_scheduled_tokens >= 40 and not compiled_in
        dummy = any(r.startswith("warmup-") for r in scheduler_output.num_scheduled_tokens)  # start-up's steps
        if first_long_prefill and not dummy:  # a request's step
            compiled_in.append(scheduler_output.total_num_scheduled_tokens)
            compiled(lambda x: x * 3 - 1)(torch.ones(5))  # a real torch.compile, inside this step
        return plain_execute(self, scheduler_output)

    monkeypatch.setattr(GPUModelRunner, "execute_model", execute_model)
    llm = LLM(tiny_checkpoint("llama"), dtype="float32", trace_out=str(tmp_path))
    prompts = [{"prompt_token_ids": list(range(5, 5 + n))} for n in (12, 60, 9)]
    llm.generate(prompts, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True), use_tqdm=False)
    assert compiled_in

    trace = load_trace(str(tmp_path))
    (paid,) = [s for s in trace.steps if s.one_time_costs]
    ((what, seconds),) = paid.one_time_costs
    assert what == "torch.compile" and 0 < seconds <= paid.end - paid.start
    spans = load_spans(tmp_path)
    by_id = {s["spanId"]: s for s in spans}
    (span,) = [s for s in spans if s["name"] == "torch.compile"]
    assert attrs(by_id[span["parentSpanId"]])["step.number"] == paid.number
    assert attrs(span)["one_time.cached"] is False

    # explain charges the compile to "one_time" and names it; the parts still add up to each e2e.
    for x in explain(trace):
        assert abs(sum(x.parts.values()) - x.e2e_s) <= max(1e-3, 0.005 * x.e2e_s)
    ran = [x for x in explain(trace) if x.request_id in paid.req_ids]
    assert ran and all(x.parts["one_time"] > 0 for x in ran)
    assert all(any(f"step {paid.number} paid a one-time cost: torch.compile" in n for n in x.notes) for x in ran)

    # The step-cost model is fitted as if the step were not there.
    others = tuple(s for s in trace.steps if s is not paid)
    assert fit_steps(trace.steps).coefficients == fit_steps(others).coefficients
