"""``viz/segments.py`` and ``viz/blocks.py`` on hand-made inputs: the rules their docstrings state."""

from __future__ import annotations

import pytest

from viz.blocks import replay_blocks, unflatten
from viz.model import Chunk
from viz.segments import request_segments


def _kinds(segments) -> list[tuple[str, float, float]]:
    return [(s.kind, s.start, s.end) for s in segments]


def test_segments_from_chunks_split_prefill_and_decode_each_stretch():
    chunks = [Chunk(1, 1.0, 2.0, 8, False), Chunk(2, 2.0, 3.0, 8, False), Chunk(3, 3.0, 4.0, 1, True),
              Chunk(6, 6.0, 7.0, 17, False), Chunk(7, 7.0, 8.0, 1, True)]
    segments = request_segments(0.5, [1.1, 6.1], [4.5], 8.0, 3.0, chunks)
    assert _kinds(segments) == [("queued", 0.5, 1.1), ("prefill", 1.1, 3.0), ("decode", 3.0, 4.5),
                                ("preempted", 4.5, 6.1), ("prefill", 6.1, 7.0), ("decode", 7.0, 8.0)]


def test_segments_without_chunks_use_the_first_token():
    segments = request_segments(0.0, [1.0, 5.0], [3.0], 6.0, 2.0, [])
    assert _kinds(segments) == [("queued", 0.0, 1.0), ("prefill", 1.0, 2.0), ("decode", 2.0, 3.0),
                                ("preempted", 3.0, 5.0), ("decode", 5.0, 6.0)]
    assert _kinds(request_segments(0.0, [], [], 2.0, None, [])) == [("queued", 0.0, 2.0)]  # aborted waiting


def test_replay_takes_before_it_drops_and_keeps_block_table_order():
    changes = [
        (1, {"a": (0, 1, 2), "b": (3,)}, {}),
        (2, {"c": (0, 1, 4)}, {"b": (3,)}),  # c hits a's first two blocks
        (3, {"a": (5,)}, {"a": (0, 1, 2, 5)}),  # a takes a block and finishes in one step
        (4, {}, {"c": (0, 1, 4)}),
    ]
    assert replay_blocks(changes) == [{"a": (0, 1, 2), "b": (3,)}, {"a": (0, 1, 2), "c": (0, 1, 4)},
                                      {"c": (0, 1, 4)}, {}]
    with pytest.raises(ValueError, match="step 2: request 'a' drops block 9"):
        replay_blocks([(1, {"a": (1,)}, {}), (2, {}, {"a": (9,)})])


def test_unflatten():
    assert unflatten(["a", "b"], [2, 1], [4, 5, 6]) == {"a": (4, 5), "b": (6,)}
    with pytest.raises(ValueError, match="do not add up"):
        unflatten(["a"], [2], [4])
