"""IncrementalDetokenizer: new token ids in, new text out, one step at a time.

Uses the ``tokenizers`` library's ``DecodeStream``, which holds back bytes until they form whole
UTF-8 characters (a Chinese character or an emoji is often split across two or three byte-level
tokens) and handles the spaces that tokenizers put on word boundaries. The stream is primed with the
prompt's last tokens so that the first generated word is decoded in context.

``detokenize=False`` turns all of it off: the request's outputs carry token ids and empty text.
``spaces_between_special_tokens=False`` (with ``skip_special_tokens=False``) writes a special token
that follows another one as its bare content, without the space a tokenizer's decoder may put
before it, as vLLM's fast detokenizer does.
"""

from __future__ import annotations

from tracevllm.engine import EngineCoreRequest

_PROMPT_CONTEXT_TOKENS = 6


class IncrementalDetokenizer:
    def __init__(self, tokenizer, request: EngineCoreRequest) -> None:
        params = request.sampling_params
        self.detokenize = params.detokenize
        # Without detokenize no tokenizer is read (a what-if replay has none: tracevllm/whatif/).
        self._tokenizer = tokenizer._tokenizer if self.detokenize else None  # the Rust tokenizer behind a fast HF one
        self._stream = None
        if self.detokenize:
            from tokenizers.decoders import DecodeStream  # here: a what-if replay never imports tokenizers

            self._stream = DecodeStream(ids=request.prompt_token_ids[-_PROMPT_CONTEXT_TOKENS:],
                                        skip_special_tokens=params.skip_special_tokens)
        # id -> content of the added (special) tokens, when spaces between them must be suppressed.
        self._added_tokens: dict[int, str] | None = None
        if self.detokenize and not params.skip_special_tokens and not params.spaces_between_special_tokens:
            self._added_tokens = {t: tok.content for t, tok in self._tokenizer.get_added_tokens_decoder().items()}
        self._last_was_added = False
        self.output_text = ""
        self.token_ids: list[int] = []
        self.stop = params.stop
        self.include_stop_str_in_output = params.include_stop_str_in_output
        # Text already streamed to a client cannot be taken back, so until the request finishes its
        # last (longest stop string - 1) characters are held back: they may be the start of a stop
        # string that the next token completes, and that must not reach the client.
        self.stop_buffer_length = 0
        if self.stop and not self.include_stop_str_in_output:
            self.stop_buffer_length = max(len(stop) for stop in self.stop) - 1

    def get_output_text(self, finished: bool) -> str:
        """The text that may be shown now: all of it once finished, else without the held-back tail."""
        if finished or not self.stop_buffer_length:
            return self.output_text
        return self.output_text[:max(0, len(self.output_text) - self.stop_buffer_length)]

    def update(self, new_token_ids: list[int], stop_terminated: bool) -> str | None:
        """Append the new tokens' text; return the stop string found in it, if any.

        A stop token (or EOS) that ended the request stays in ``token_ids`` but its text is not
        added, unless ``include_stop_str_in_output``.
        """
        self.token_ids.extend(new_token_ids)
        if not self.detokenize:
            return None
        if stop_terminated and not self.include_stop_str_in_output:
            new_token_ids = new_token_ids[:-1]
        offset = len(self.output_text)
        for token_id in new_token_ids:
            chunk = self._decode_next(token_id)
            if chunk:
                self.output_text += chunk
        if self.stop and not stop_terminated:
            return self._check_stop_strings(offset)
        return None

    def _decode_next(self, token_id: int) -> str | None:
        chunk = self._stream.step(self._tokenizer, token_id)
        if self._added_tokens is not None:
            content = self._added_tokens.get(token_id)
            if content is not None and self._last_was_added:
                chunk = content
            self._last_was_added = content is not None
        return chunk

    def _check_stop_strings(self, new_text_offset: int) -> str | None:
        """Cut the text at the earliest stop string that ends in the new text."""
        found = []
        for stop in self.stop:
            start = self.output_text.find(stop, max(0, new_text_offset - len(stop) + 1))
            if start != -1:
                found.append((start, stop))
        if not found:
            return None
        start, stop = min(found)
        end = start + len(stop) if self.include_stop_str_in_output else start
        self.output_text = self.output_text[:end]
        return stop
