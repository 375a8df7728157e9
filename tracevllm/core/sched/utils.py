"""check_stop: the engine core's stop rules (stop *strings* are checked on text, by the front end)."""

from __future__ import annotations

from tracevllm.request import Request, RequestStatus


def check_stop(request: Request, max_model_len: int) -> bool:
    """Set the request's finished status and return True if its last sampled token ends it.

    In vLLM's order: EOS (unless ``ignore_eos``); a stop token id (recorded as ``stop_reason``); then
    the length, ``max_tokens`` or the KV cache unable to hold another token (``max_model_len``). So a
    stop token that is also the last token ``max_model_len`` allows finishes as a stop. EOS and stop
    tokens stay in the output token ids, as in vLLM. ``min_tokens`` is the sampler's to keep: it
    masks EOS and the stop tokens until then.
    """
    params = request.sampling_params
    last_token_id = request.output_token_ids[-1]
    if not params.ignore_eos and last_token_id == request.eos_token_id:
        request.status = RequestStatus.FINISHED_STOPPED
        return True
    if last_token_id in params.stop_token_ids:
        request.status = RequestStatus.FINISHED_STOPPED
        request.stop_reason = last_token_id
        return True
    if request.num_tokens >= max_model_len or (
            request.max_tokens is not None and request.num_output_tokens >= request.max_tokens):
        request.status = RequestStatus.FINISHED_LENGTH_CAPPED
        return True
    return False
