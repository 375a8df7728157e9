"""RequestOutput and CompletionOutput: what the user gets back, with vLLM's fields."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tracevllm.metrics.stats import RequestStateStats


@dataclass(slots=True)
class Logprob:
    logprob: float
    rank: int | None = None  # 1 = the most likely token
    decoded_token: str | None = None  # filled in by the OutputProcessor, unless detokenize=False


# One dict per generated position: token id -> Logprob (the sampled token and the top-k).
SampleLogprobs = list[dict[int, Logprob]]
# One per prompt position: None for the first (nothing predicts it), then token id -> Logprob for
# the prompt's own token and the top-k.
PromptLogprobs = list[dict[int, Logprob] | None]


@dataclass(slots=True)
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None  # sum of the sampled tokens' logprobs, when logprobs were asked
    logprobs: SampleLogprobs | None
    finish_reason: str | None = None  # "stop", "length", "abort" or "error"
    stop_reason: int | str | None = None  # the stop token id or stop string that ended it

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(slots=True)
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    num_cached_tokens: int = 0  # prompt tokens found in the prefix cache
    prompt_logprobs: PromptLogprobs | None = None  # when SamplingParams.prompt_logprobs was set
    # The timing record of the engine-core request behind this output (with n > 1, of the sample
    # whose new tokens made this output).
    metrics: "RequestStateStats | None" = field(default=None)

    def add(self, next_output: "RequestOutput", aggregate: bool) -> None:
        """Fold a later output of the same request into this one (for a consumer that fell behind).

        ``aggregate`` (DELTA outputs): append the new text, tokens and logprobs of each sample;
        otherwise the later output replaces this one's contents, since it already holds everything.
        """
        self.finished = next_output.finished
        self.num_cached_tokens = next_output.num_cached_tokens
        if next_output.prompt_logprobs is not None:
            self.prompt_logprobs = next_output.prompt_logprobs
        self.metrics = next_output.metrics
        if not aggregate:
            self.outputs = next_output.outputs
            return
        by_index = {c.index: c for c in self.outputs}
        for new in next_output.outputs:
            old = by_index.get(new.index)
            if old is None:
                self.outputs.append(new)
                continue
            old.text += new.text
            old.token_ids.extend(new.token_ids)
            if old.logprobs is not None and new.logprobs is not None:
                old.logprobs.extend(new.logprobs)
            old.cumulative_logprob = new.cumulative_logprob
            old.finish_reason, old.stop_reason = new.finish_reason, new.stop_reason
