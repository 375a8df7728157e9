"""The OpenAI API's request and response bodies, with vLLM's extra sampling fields.

Requests are validated strictly (a string where a number belongs is an error, not coerced); any
problem becomes an HTTP 400 in OpenAI's error shape. Fields OpenAI has but tracevllm does not
implement (tools, logit_bias, suffix, ...) are accepted only at their "off" value.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Discriminator, Field, Tag

from tracevllm.inputs.parse import lone_surrogate_at
from tracevllm.sampling_params import RequestOutputKind, SamplingParams


class OpenAIBaseModel(BaseModel):
    model_config = ConfigDict(extra="allow")  # like vLLM: unknown fields are ignored (and logged)


class StrictRequestModel(OpenAIBaseModel):
    """NaN and Infinity (which Python's json accepts as literals) are errors in every float field."""

    model_config = ConfigDict(extra="allow", strict=True, allow_inf_nan=False)


def _encodable(text: str) -> str:
    if (position := lone_surrogate_at(text)) is not None:
        raise ValueError(f"text is not valid Unicode (a lone surrogate at position {position})")
    return text


Text = Annotated[str, AfterValidator(_encodable)]
"""A string the tokenizer can take: JSON's ``"\\ud800"`` escape decodes to a lone surrogate, which it cannot."""

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1  # vLLM bounds ``seed`` to a C long too
FLOAT32_MAX = 3.4028234663852886e38

Int64 = Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX)]
"""Every integer a request carries ends up in an int64 tensor or crosses msgpack (which stops at
2**64 - 1): a larger one is a 400 naming its field here, not an OverflowError deep in the engine."""


def _float32(value: float) -> float:
    if not abs(value) <= FLOAT32_MAX:
        raise ValueError(f"must be at most {FLOAT32_MAX:.6g} in magnitude (it is used as a float32)")
    return value


Float32 = Annotated[float, AfterValidator(_float32)]
"""A sampling float becomes a float32 tensor, where 1e39 would be inf."""


# ---- errors -------------------------------------------------------------------------------------

class ErrorInfo(OpenAIBaseModel):
    message: str
    type: str
    param: str | None = None
    code: int | str | None = None


class ErrorResponse(OpenAIBaseModel):
    error: ErrorInfo


# ---- requests -----------------------------------------------------------------------------------

class StreamOptions(StrictRequestModel):
    include_usage: bool | None = False


class SamplingFields(StrictRequestModel):
    """Sampling fields shared by both endpoints (OpenAI's, then vLLM's extras)."""

    model: Text | None = None
    n: Int64 = 1
    temperature: Float32 | None = None
    top_p: Float32 | None = None
    seed: Int64 | None = None
    stop: Text | list[Text] | None = None
    presence_penalty: Float32 = 0.0
    frequency_penalty: Float32 = 0.0
    logit_bias: dict[str, float] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    # vLLM's extras
    top_k: Int64 | None = None
    min_p: Float32 | None = None
    repetition_penalty: Float32 | None = None
    ignore_eos: bool = False
    min_tokens: Int64 = 0
    stop_token_ids: list[Int64] | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    priority: Int64 = 0
    prompt_logprobs: Int64 | None = None  # per prompt token: its logprob and the top k (not with stream)
    bad_words: list[Text] | None = None  # words the output may not contain (SamplingParams.bad_words)

    def unsupported_field(self) -> str | None:
        """The name of a field set to something tracevllm cannot do, if any."""
        return "logit_bias" if self.logit_bias else None

    def to_sampling_params(self, max_tokens: int, logprobs: int | None,
                           prompt_logprobs: int | None = None) -> SamplingParams:
        """Raises ValueError naming the field when a value is out of range."""
        return SamplingParams(
            n=self.n,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=-1 if self.top_k is None or self.top_k == 0 else self.top_k,
            min_p=self.min_p or 0.0,
            seed=self.seed,
            max_tokens=max_tokens,
            min_tokens=self.min_tokens,
            stop=self.stop,
            stop_token_ids=self.stop_token_ids,
            include_stop_str_in_output=self.include_stop_str_in_output,
            ignore_eos=self.ignore_eos,
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            repetition_penalty=1.0 if self.repetition_penalty is None else self.repetition_penalty,
            skip_special_tokens=self.skip_special_tokens,
            bad_words=self.bad_words,
            output_kind=RequestOutputKind.DELTA if self.stream else RequestOutputKind.FINAL_ONLY,
        )


class ContentPart(StrictRequestModel):
    type: str
    text: Text | None = None


class ChatCompletionMessageParam(StrictRequestModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Text | list[ContentPart] | None = None
    name: Text | None = None


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatCompletionMessageParam]
    max_tokens: Int64 | None = None  # deprecated by OpenAI in favour of max_completion_tokens
    max_completion_tokens: Int64 | None = None
    logprobs: bool = False
    top_logprobs: Int64 | None = None
    response_format: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    # vLLM's extras
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False  # on top of those the chat template writes (vLLM's default: none)
    chat_template_kwargs: dict[str, Any] | None = None

    def unsupported_field(self) -> str | None:
        # The chat template reads its ``tools`` from these kwargs too: refused the same way either way.
        if self.tools or (self.chat_template_kwargs or {}).get("tools"):
            return "tools"
        if self.tool_choice not in (None, "none", "auto"):
            return "tool_choice"
        if self.response_format and self.response_format.get("type") != "text":
            return "response_format"
        return super().unsupported_field()


class CompletionRequest(SamplingFields):
    prompt: Text | list[Text] | list[Int64] | list[list[Int64]]
    max_tokens: Int64 | None = 16
    logprobs: Int64 | None = None
    echo: bool = False
    best_of: Int64 | None = None
    suffix: str | None = None

    def unsupported_field(self) -> str | None:
        if self.suffix:
            return "suffix"
        if self.best_of not in (None, 1, self.n):
            return "best_of"
        return super().unsupported_field()


# ---- responses ----------------------------------------------------------------------------------

class UsageInfo(OpenAIBaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


class CompletionLogProbs(OpenAIBaseModel):
    text_offset: list[int] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    tokens: list[str] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)


class PromptLogprob(OpenAIBaseModel):
    """vLLM's ``Logprob``, as its API writes a prompt position's entries."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


# vLLM's prompt_logprobs: per prompt token, None for the first, then token id -> its Logprob.
PromptLogprobs = list[dict[int, PromptLogprob] | None]


class CompletionResponseChoice(OpenAIBaseModel):
    index: int
    text: str
    logprobs: CompletionLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    prompt_logprobs: PromptLogprobs | None = None


class CompletionResponse(OpenAIBaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionResponseChoice]
    usage: UsageInfo | None = None


class ChatCompletionLogProb(OpenAIBaseModel):
    token: str
    logprob: float = -9999.0
    bytes: list[int] | None = None


class ChatCompletionLogProbsContent(ChatCompletionLogProb):
    top_logprobs: list[ChatCompletionLogProb] = Field(default_factory=list)


class ChatCompletionLogProbs(OpenAIBaseModel):
    content: list[ChatCompletionLogProbsContent] | None = None


class ChatMessage(OpenAIBaseModel):
    role: str
    content: str | None = None


class ChatCompletionResponseChoice(OpenAIBaseModel):
    index: int
    message: ChatMessage
    logprobs: ChatCompletionLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class ChatCompletionResponse(OpenAIBaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatCompletionResponseChoice]
    usage: UsageInfo
    prompt_logprobs: PromptLogprobs | None = None


class DeltaMessage(OpenAIBaseModel):
    role: str | None = None
    content: str | None = None


class ChatCompletionResponseStreamChoice(OpenAIBaseModel):
    index: int
    delta: DeltaMessage
    logprobs: ChatCompletionLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class ChatCompletionStreamResponse(OpenAIBaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatCompletionResponseStreamChoice]
    usage: UsageInfo | None = None


class ModelCard(OpenAIBaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "tracevllm"
    root: str | None = None
    max_model_len: int | None = None


class ModelList(OpenAIBaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard] = Field(default_factory=list)


# ---- tokenization (vLLM's /tokenize and /detokenize) -------------------------------------------

class TokenizeCompletionRequest(StrictRequestModel):
    model: Text | None = None
    prompt: Text
    add_special_tokens: bool = True


class TokenizeChatRequest(StrictRequestModel):
    """The messages rendered by the chat template (which writes the special tokens itself)."""

    model: Text | None = None
    messages: list[ChatCompletionMessageParam]
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False  # as for chat completions: the template writes them
    chat_template_kwargs: dict[str, Any] | None = None


def _tokenize_kind(body: Any) -> str:
    if isinstance(body, dict):
        return "chat" if "messages" in body else "completion"
    return "chat" if isinstance(body, TokenizeChatRequest) else "completion"


TokenizeRequest = Annotated[
    Annotated[TokenizeCompletionRequest, Tag("completion")] | Annotated[TokenizeChatRequest, Tag("chat")],
    Discriminator(_tokenize_kind),
]
"""Chat-style when the body has ``messages``, else completion-style (errors then name one model's fields)."""


class TokenizeResponse(OpenAIBaseModel):
    count: int
    max_model_len: int
    tokens: list[int]


class DetokenizeRequest(StrictRequestModel):
    model: Text | None = None
    tokens: list[Int64]


class DetokenizeResponse(OpenAIBaseModel):
    prompt: str
