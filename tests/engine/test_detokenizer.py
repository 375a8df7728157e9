"""IncrementalDetokenizer against the tokenizer's own full decode."""

from __future__ import annotations

import pytest

from tracevllm.engine import EngineCoreRequest
from tracevllm.engine.detokenizer import IncrementalDetokenizer
from tracevllm.sampling_params import SamplingParams

TEXT = "Paged attention 把 KV 缓存切成块 🧱🚀, then the scheduler — naïvely — fills them."


@pytest.fixture(scope="module")
def tokenizer(bundled_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(bundled_model_dir, local_files_only=True)


def make(tokenizer, prompt_ids, **params) -> IncrementalDetokenizer:
    request = EngineCoreRequest("r", prompt_ids, SamplingParams(**params), tokenizer.eos_token_id, 0.0)
    return IncrementalDetokenizer(tokenizer, request)


def test_one_token_at_a_time_equals_full_decode(tokenizer):
    prompt = tokenizer.encode("Question: what is it?\nAnswer:")
    ids = tokenizer.encode(" " + TEXT)
    # Multi-byte characters (Chinese, emoji) are split across byte-level tokens here.
    assert any("\ufffd" in tokenizer.decode([i]) for i in ids)
    detok = make(tokenizer, prompt)
    for i in ids:
        detok.update([i], stop_terminated=False)
        assert "\ufffd" not in detok.output_text
    assert detok.output_text == tokenizer.decode(ids)
    assert detok.token_ids == ids


def test_special_tokens_skipped_or_kept(tokenizer):
    ids = tokenizer.encode(" hello") + [tokenizer.eos_token_id] + tokenizer.encode(" world")
    skip = make(tokenizer, [1, 2, 3])
    skip.update(ids, stop_terminated=False)
    keep = make(tokenizer, [1, 2, 3], skip_special_tokens=False)
    keep.update(ids, stop_terminated=False)
    assert skip.output_text == tokenizer.decode(ids, skip_special_tokens=True)
    assert keep.output_text == tokenizer.decode(ids, skip_special_tokens=False)


def test_stop_string_across_tokens_cuts_at_earliest(tokenizer):
    ids = tokenizer.encode(" alpha beta gamma delta epsilon")
    detok = make(tokenizer, [1], stop=["delta", "ta gam"])
    found = None
    for i in ids:
        found = detok.update([i], stop_terminated=False)
        if found:
            break
    assert found == "ta gam"
    assert detok.output_text == " alpha be"


def test_include_stop_str_and_stop_token_text(tokenizer):
    ids = tokenizer.encode(" one two three")
    detok = make(tokenizer, [1], stop=["two"], include_stop_str_in_output=True)
    assert detok.update(ids, stop_terminated=False) == "two"
    assert detok.output_text == " one two"
    # A stop token that ended the request stays in token_ids but not in the text.
    detok = make(tokenizer, [1], skip_special_tokens=False)
    detok.update(ids + [tokenizer.eos_token_id], stop_terminated=True)
    assert detok.output_text == tokenizer.decode(ids) and detok.token_ids[-1] == tokenizer.eos_token_id


def test_streamed_text_never_shows_the_start_of_a_stop_string(tokenizer):
    """While unfinished, the last len(stop) - 1 characters are held back; once the stop string is
    complete, the text is cut before it, so nothing that was shown has to be taken back."""
    ids = tokenizer.encode(" 5, 6, 7, 8")
    detok = make(tokenizer, [1], stop=[", 7", "zz"])
    shown = []
    for i in ids:
        stop = detok.update([i], stop_terminated=False)
        shown.append(detok.get_output_text(finished=stop is not None))
        if stop is not None:
            break
    assert stop == ", 7" and shown[-1] == " 5, 6"
    assert all(shown[-1].startswith(s) for s in shown)  # each view extends the one before
    assert detok.stop_buffer_length == 2


def test_no_hold_back_without_stop_strings_or_when_they_are_kept(tokenizer):
    for params in ({}, {"stop": ["abc"], "include_stop_str_in_output": True}):
        detok = make(tokenizer, [1], **params)
        detok.update(tokenizer.encode(" hello"), stop_terminated=False)
        assert detok.get_output_text(finished=False) == detok.output_text == " hello"
