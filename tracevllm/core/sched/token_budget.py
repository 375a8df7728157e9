"""The server's token budget on CPU, fitted to steps timed at start-up.

Every stream waits for each engine step, so the longest a step takes is the longest gap a client sees
between two chunks. A step's cost grows with the tokens it runs, ``max_num_batched_tokens`` at most,
and a CPU runs far fewer tokens a second than a GPU: vLLM's fixed CPU default (2048 for the server)
made steps of several seconds on a 2-core machine. So when the user sets no budget, the engine core
times dummy prompt chunks of ``PROBE_TOKENS`` once the model is warm (``engine/step_profile.py``),
and lowers the budget to the most tokens whose chunk the step-cost model of that profile
(``tracevllm/step_cost.py``: ``StepCostModel.from_profile``) predicts within ``target_step_seconds``.

The budget never drops below ``max_num_seqs`` (each running request must be able to decode every
step) nor rises above the default it started from.
"""

from __future__ import annotations

from tracevllm.step_cost import BatchFeatures, StepCostModel

# The two prompt chunks timed, in tokens: small enough to cost little, far enough apart to show a slope.
PROBE_TOKENS = (32, 256)
# The budget is a multiple of this many tokens.
BUDGET_GRANULE = 16


def fit_token_budget(model: StepCostModel, target_step_seconds: float, max_num_seqs: int, ceiling: int) -> int:
    """The most tokens a step may hold so that ``model`` predicts its prompt chunk within
    ``target_step_seconds``, in multiples of ``BUDGET_GRANULE``, within [``max_num_seqs``, ``ceiling``]
    (a cost that grows with the tokens: the largest that fits is found by bisection)."""
    # In granules: ``fits`` fits (or is 0); ``over`` does not, or lies past the first granule at or over the ceiling.
    fits, over = 0, ceiling // BUDGET_GRANULE + 2
    while over - fits > 1:
        middle = (fits + over) // 2
        if model.predict(BatchFeatures.prompt_chunk(middle * BUDGET_GRANULE)) <= target_step_seconds:
            fits = middle
        else:
            over = middle
    return max(max_num_seqs, min(ceiling, fits * BUDGET_GRANULE))


def seconds_per_token(model: StepCostModel) -> float:
    """What one more prompt token costs between the two probes (the span's ``warmup.step_seconds_per_token``)."""
    (t1, t2) = PROBE_TOKENS
    return (model.predict(BatchFeatures.prompt_chunk(t2)) - model.predict(BatchFeatures.prompt_chunk(t1))) / (t2 - t1)
