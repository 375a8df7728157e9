"""SamplingParams validation: every bad value is a ValueError that names its field."""

from __future__ import annotations

import msgspec
import pytest

from tracevllm.sampling_params import RequestOutputKind, SamplingParams


@pytest.mark.parametrize("field, value", [
    ("n", 0), ("temperature", -0.1), ("top_p", 0.0), ("top_p", 1.01), ("top_k", -2), ("top_k", 0),
    ("min_p", -0.1), ("min_p", 1.5), ("max_tokens", 0), ("min_tokens", -1), ("logprobs", -1),
    ("presence_penalty", 2.5), ("frequency_penalty", -3.0), ("repetition_penalty", 0.0),
    ("stop", [""]), ("stop_token_ids", [-1]),
])
def test_bad_values_name_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})


def test_min_tokens_above_max_tokens():
    with pytest.raises(ValueError, match="min_tokens"):
        SamplingParams(min_tokens=5, max_tokens=4)


@pytest.mark.parametrize("kwargs", [
    dict(temperature=0.0), dict(top_p=1.0), dict(top_k=-1), dict(top_k=1), dict(min_p=1.0),
    dict(max_tokens=None), dict(logprobs=0), dict(presence_penalty=-2.0), dict(repetition_penalty=0.01),
    dict(repetition_penalty=100.0), dict(top_k=2**63 - 1), dict(temperature=3.4e38),
])
def test_edge_values_pass(kwargs):
    SamplingParams(**kwargs)


def test_stop_normalised_and_msgpack_round_trip():
    p = SamplingParams(stop="###", seed=3, temperature=0.5)
    assert p.stop == ["###"] and p.stop_token_ids == []
    q = msgspec.msgpack.decode(msgspec.msgpack.encode(p), type=SamplingParams)
    assert q == p


@pytest.mark.parametrize("field", [
    "temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty",
])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_nan_and_infinite_floats_name_the_field(field, value):
    with pytest.raises(ValueError, match=f"{field} must be a finite number"):
        SamplingParams(**{field: value})


def test_seed_is_bounded_to_int64_and_minus_one_means_none():
    SamplingParams(seed=2**63 - 1)
    SamplingParams(seed=-(2**63))
    for seed in (2**63, 2**64, -(2**63) - 1):
        with pytest.raises(ValueError, match="seed"):
            SamplingParams(seed=seed)
    assert SamplingParams(seed=-1).seed is None


@pytest.mark.parametrize("field, value", [
    ("bad_words", [""]), ("bad_words", ["  "]), ("bad_words", [["a"]]), ("bad_words_token_ids", [[]]), ("bad_words_token_ids", [[1, -1]]), ("truncate_prompt_tokens", 0), ("truncate_prompt_tokens", -2),
])
def test_new_fields_bad_values_name_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})


def test_new_fields_defaults_and_normalisation():
    p = SamplingParams(bad_words=["x", "y", "x"], truncate_prompt_tokens=-1, detokenize=False,
                       spaces_between_special_tokens=False)
    assert p.bad_words == ["x", "y"] and p.bad_words_token_ids is None
    assert SamplingParams(bad_words="Paris").bad_words == ["Paris"]  # one word, not its letters
    q = SamplingParams()
    assert q.detokenize and q.spaces_between_special_tokens and q.bad_words is None
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(p), type=SamplingParams) == p


def test_stop_strings_need_detokenize():
    with pytest.raises(ValueError, match="detokenize"):
        SamplingParams(stop=["\n"], detokenize=False)
    SamplingParams(stop_token_ids=[5], detokenize=False)  # token ids need no text


def test_prompt_logprobs_takes_none_or_a_count():
    SamplingParams(prompt_logprobs=None)
    SamplingParams(prompt_logprobs=0)
    for bad in (-1, 1.5, "2"):
        with pytest.raises(ValueError, match="prompt_logprobs"):
            SamplingParams(prompt_logprobs=bad)


@pytest.mark.parametrize("field, value", [
    # Finite in float64, inf in float32: the sampler's logits became NaN.
    ("temperature", 1e39), ("top_p", -1e39), ("presence_penalty", 1e39),
    # Multiplies a logit 1e45-fold: inf in float32.
    ("repetition_penalty", 1e-45), ("repetition_penalty", 0.009), ("repetition_penalty", 101.0),
    # Overflow an int64 tensor or msgpack.
    ("top_k", 2**63), ("n", 2**63), ("max_tokens", 2**63), ("min_tokens", 2**63), ("logprobs", 2**63),
    ("prompt_logprobs", 2**63), ("truncate_prompt_tokens", 2**63), ("stop_token_ids", [1, 2**64]),
    ("stop_token_ids", [2**63]), ("bad_words_token_ids", [[1, 2**63]]), ("top_k", True),
])
def test_values_that_do_not_fit_their_dtype_are_value_errors(field, value):
    kwargs = {field: value, "max_tokens": None} if field == "min_tokens" else {field: value}
    with pytest.raises(ValueError, match=f"^{field} must be"):
        SamplingParams(**kwargs)


@pytest.mark.parametrize("field, value", [
    ("stop", 5), ("stop", {"a": 1}), ("stop", "\ud800"), ("stop", ["ok", "x\udfff"]), ("stop_token_ids", 5),
    ("stop_token_ids", "12"), ("bad_words", ["\ud800"]), ("ignore_eos", "x"), ("ignore_eos", 1),
    ("include_stop_str_in_output", None), ("skip_special_tokens", "no"), ("spaces_between_special_tokens", 0),
    ("detokenize", "yes"), ("output_kind", 7), ("output_kind", True), ("output_kind", "DELTA"),
])
def test_values_of_the_wrong_type_name_the_field(field, value):
    """Issue 48: each was accepted, or raised TypeError: 'int' object is not iterable."""
    with pytest.raises(ValueError, match=f"^{field} must be"):
        SamplingParams(**{field: value})


def test_sequences_and_output_kind_values_are_normalised():
    p = SamplingParams(stop=("a", "b"), stop_token_ids=(1, 2), output_kind=2)
    assert p.stop == ["a", "b"] and p.stop_token_ids == [1, 2] and p.output_kind is RequestOutputKind.FINAL_ONLY


def test_the_reported_requests_are_refused():
    """Issue 27's bodies: each used to kill the engine core."""
    with pytest.raises(ValueError, match="top_k"):
        SamplingParams(max_tokens=3, temperature=1, top_k=9223372036854775808)
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(max_tokens=4, temperature=1e39, min_tokens=2)
    with pytest.raises(ValueError, match="repetition_penalty"):
        SamplingParams(max_tokens=4, temperature=1.0, repetition_penalty=1e-45)


def test_msgpack_decode_runs_the_same_checks():
    raw = msgspec.msgpack.encode({"top_k": 2**63, "stop_token_ids": [2**64 - 1]})
    with pytest.raises(msgspec.ValidationError, match="top_k"):
        msgspec.msgpack.decode(raw, type=SamplingParams)
