"""The stream's messages (tracevllm/entrypoints/ui/messages.py): an engine event as a JSON object with
its type and fields by name, nested structs as objects and block hashes as hex; the filters by type
and by request."""

from __future__ import annotations

import json

import pytest

from tracevllm.core.events import (
    BatchScheduled, BlocksStored, RequestQueued, ScheduledRequest, StepGauges, StepRecord, StepStarted,
)
from tracevllm.entrypoints.ui.messages import Dropped, Hello, MessageFilter, event_message, sse

RECORD = StepRecord(7, 1700000000.5, {"schedule": 0.001, "execute_model": 0.02},
                    BatchScheduled([ScheduledRequest("a", 16, False, 32), ScheduledRequest("b", 1, True, 40)], ["c"],
                                   64, 17),
                    StepGauges(10, 16, 0.375, 2, 1))


def test_a_step_record_is_an_object_of_objects():
    message = event_message(RECORD)
    assert message["type"] == "StepRecord" and message["step"] == 7
    assert message["batch"]["scheduled"][0] == {"request_id": "a", "num_tokens": 16, "is_decode": False,
                                                "num_computed_tokens": 32}
    assert message["batch"]["preempted_request_ids"] == ["c"] and message["batch"]["token_budget"] == 64
    assert message["gauges"] == {"num_free_blocks": 10, "num_gpu_blocks": 16, "kv_cache_usage": 0.375,
                                 "num_running_reqs": 2, "num_waiting_reqs": 1}
    data = sse(message)
    assert data.startswith(b"data: ") and data.endswith(b"\n\n") and json.loads(data[6:]) == message


def test_block_hashes_are_hex_and_the_streams_own_messages_are_typed():
    stored = event_message(BlocksStored("a", [3, 4], [b"\x01\xff", b"\x00"]))
    assert stored == {"type": "BlocksStored", "request_id": "a", "block_ids": [3, 4], "block_hashes": ["01ff", "00"]}
    hello = event_message(Hello(16, 4, 8, 32, "tiny", None, -1, "trace"))
    assert hello == {"type": "Hello", "num_gpu_blocks": 16, "block_size": 4, "max_num_seqs": 8,
                     "max_num_batched_tokens": 32, "model": "tiny", "jaeger_url": None, "step": -1, "source": "trace"}
    assert event_message(Dropped("fell behind")) == {"type": "Dropped", "reason": "fell behind"}


def test_filters_by_type_and_by_request():
    record, started = event_message(RECORD), event_message(StepStarted(7, 1700000000.5))
    queued_a = event_message(RequestQueued("a", 1.0, 5, 0))
    hello = event_message(Hello(16, 4, 8, 32, "tiny", None, -1, "live"))
    only_records = MessageFilter("StepRecord, RequestFinished")
    assert [only_records.passes(m) for m in (record, started, queued_a, hello)] == [True, False, False, True]
    only_a = MessageFilter(request_id="a")
    assert [only_a.passes(m) for m in (record, started, queued_a)] == [True, False, True]
    assert MessageFilter(request_id="c").passes(record)  # preempted in the step
    assert not MessageFilter(request_id="z").passes(record)
    assert not MessageFilter(request_id="b").passes(queued_a)
    with pytest.raises(ValueError, match="unknown event type StepRecords"):
        MessageFilter("StepRecords")
