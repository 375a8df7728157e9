"""SamplingParams validation: every bad value is a ValueError that names its field."""

from __future__ import annotations

import msgspec
import pytest

from tracevllm.sampling_params import SamplingParams


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
    dict(max_tokens=None), dict(logprobs=0), dict(presence_penalty=-2.0), dict(repetition_penalty=1e-3),
])
def test_edge_values_pass(kwargs):
    SamplingParams(**kwargs)


def test_stop_normalised_and_msgpack_round_trip():
    p = SamplingParams(stop="###", seed=3, temperature=0.5)
    assert p.stop == ["###"] and p.stop_token_ids == []
    q = msgspec.msgpack.decode(msgspec.msgpack.encode(p), type=SamplingParams)
    assert q == p
