"""The API server's side of the live event stream (entrypoints/openai/engine_events.py), on a stand-in
for the engine core client: an event's JSON (fields by name, nested structs as objects, hashes as
hex), ``Hello`` first with the step the client starts after, sessions started by the first client
and stopped by the last, the filters, and the clients that fall behind (a message waiting too long,
too many bytes, or messages the engine core could not send) ending with ``Dropped``."""

from __future__ import annotations

import asyncio
import json
import time

import msgspec
import pytest

from tracevllm.core.events import (
    BatchScheduled, BlocksAllocated, BlocksStored, EngineIdle, PrefixCacheLookup, RequestFinished, RequestQueued,
    RequestResumed, RequestWaiting, ScheduledRequest, StepGauges, StepRecord, StepStarted,
)
from tracevllm.engine.event_publisher import EventsHeader
from tracevllm.engine.snapshot import EngineSnapshot, RequestSnapshot
from tracevllm.entrypoints.openai import engine_events
from tracevllm.entrypoints.openai.engine_events import (
    MAX_ECHOED_CHARS, EngineEventFanOut, EventFilter, Hello, sse_message, to_json_object,
)

EMPTY = EngineSnapshot([], [])
RUNNING_A = EngineSnapshot([RequestSnapshot("a", "running", 1.0, 20, 20, 0, 1, 0, [3, 4])], [3])
HELLO = Hello(num_gpu_blocks=64, block_size=16, max_num_seqs=4, max_num_batched_tokens=256, model="m",
              jaeger_url="http://jaeger:16686", step=-1)


class FakeEngineCore:
    """What the fan-out uses of AsyncMPClient: it records the sessions asked for."""

    def __init__(self) -> None:
        self.published: list[int | None] = []

    async def publish_events_async(self, session: int | None) -> None:
        self.published.append(session)

    async def get_events_async(self):
        await asyncio.Event().wait()  # the tests hand messages to dispatch() themselves


def step(number: int, *request_ids: str) -> list:
    batch = BatchScheduled([ScheduledRequest(r, 1, True, 20) for r in request_ids], [], 256, len(request_ids))
    return [StepStarted(number, 10.0 + number),
            StepRecord(number, 10.0 + number, {"schedule": 0.001}, batch, StepGauges(60, 64, 0.0625, 1, 0))]


def received(client) -> list[dict]:
    """The messages pending for ``client``, parsed (and taken)."""
    data = b"".join(client.pending)
    client.pending, client.num_pending_bytes = [], 0
    messages = [m for m in data.split(b"\n\n") if m]
    assert all(m.startswith(b"data: ") for m in messages), data
    return [json.loads(m[len(b"data: "):]) for m in messages]


def run(scenario) -> None:
    async def main() -> None:
        core = FakeEngineCore()
        fan_out = EngineEventFanOut(core, HELLO)  # type: ignore[arg-type]
        await scenario(fan_out, core)
        fan_out.shutdown()

    asyncio.run(main())


def test_an_event_in_json_has_its_fields_by_name():
    record = step(7, "a")[1]
    assert json.loads(sse_message(record).removeprefix(b"data: ")) == {
        "type": "StepRecord", "step": 7, "start_time": 17.0, "durations": {"schedule": 0.001}, "error": None,
        "batch": {"scheduled": [{"request_id": "a", "num_tokens": 1, "is_decode": True, "num_computed_tokens": 20}],
                  "preempted_request_ids": [], "token_budget": 256, "num_scheduled_tokens": 1},
        "gauges": {"num_free_blocks": 60, "num_gpu_blocks": 64, "kv_cache_usage": 0.0625, "num_running_reqs": 1,
                   "num_waiting_reqs": 0},
        "parts": {}, "forward_device_s": None}
    assert sse_message(record).endswith(b"}\n\n")
    assert to_json_object(BlocksStored("a", [3, 4], [b"\x01\xff", b"\x00"])) == {
        "request_id": "a", "block_ids": [3, 4], "block_hashes": ["01ff", "00"]}
    resumed = RequestResumed("a", 1.5, 4, 32, [1, 2], [9], PrefixCacheLookup(2, 2, "partial_block"))
    assert json.loads(sse_message(resumed).removeprefix(b"data: "))["lookup"] == {
        "num_blocks_looked_up": 2, "num_blocks_hit": 2, "miss_reason": "partial_block", "miss_block_hash": None}
    assert json.loads(sse_message(RequestWaiting("a", 1.0, "kv_cache", [], 3, 1, True)).removeprefix(b"data: ")) == {
        "type": "RequestWaiting", "request_id": "a", "timestamp": 1.0, "reason": "kv_cache", "blocked_by": [],
        "num_blocks_needed": 3, "num_free_blocks": 1, "full_sequence": True, "num_watermark_blocks": 0}


def test_sessions_start_with_the_first_client_and_stop_with_the_last():
    async def scenario(fan_out, core):
        first = fan_out.subscribe(EventFilter())
        await asyncio.sleep(0)
        assert core.published == [1] and first.pending == []  # Hello waits for the session's first message
        fan_out.dispatch(EventsHeader(1, 41, snapshot=True), EMPTY)
        assert received(first) == [{**json.loads(sse_message(HELLO)[6:]), "step": 41,
                                    "snapshot": {"requests": [], "cached_block_ids": []}}]
        fan_out.dispatch(EventsHeader(1, 42), step(42, "a"))
        assert [m["type"] for m in received(first)] == ["StepStarted", "StepRecord"]
        second = fan_out.subscribe(EventFilter())  # while the session is live: it asks for a snapshot
        also = fan_out.subscribe(EventFilter())  # and one more before it comes: the same snapshot
        await asyncio.sleep(0)
        assert core.published == [1, 1] and second.pending == also.pending == []
        fan_out.dispatch(EventsHeader(1, 43), step(43, "a"))  # before the snapshot: theirs is after it
        fan_out.dispatch(EventsHeader(1, 43, snapshot=True), RUNNING_A)
        for client in (second, also):
            assert received(client) == [{**json.loads(sse_message(HELLO)[6:]), "step": 43,
                                         "snapshot": json.loads(msgspec.json.encode(RUNNING_A))}]
        assert [m["step"] for m in received(first) if m["type"] == "StepRecord"] == [43]  # no second Hello
        fan_out.unsubscribe(first)
        fan_out.unsubscribe(second)
        fan_out.unsubscribe(also)
        await asyncio.sleep(0)
        assert core.published == [1, 1, None]
        fan_out.dispatch(EventsHeader(1, 44), step(44, "a"))  # sent before the stop: nobody hears it

        third = fan_out.subscribe(EventFilter())
        await asyncio.sleep(0)
        assert core.published == [1, 1, None, 2]
        fan_out.dispatch(EventsHeader(1, 45), step(45, "a"))  # the old session's, still: not this client's
        fan_out.dispatch(EventsHeader(2, 50, snapshot=True), EMPTY)
        fan_out.dispatch(EventsHeader(2, 51), step(51, "a"))
        assert [(m["type"], m.get("step")) for m in received(third)] == [
            ("Hello", 50), ("StepStarted", 51), ("StepRecord", 51)]

    run(scenario)


def test_filters_by_type_and_by_request():
    events = [RequestQueued("cmpl-1-0", 1.0, 8, 0), RequestQueued("0_cmpl-1-0", 1.0, 8, 0),
              RequestQueued("cmpl-10-0", 1.0, 8, 0), BlocksAllocated("cmpl-1-0", [1]), *step(5, "cmpl-10-0"),
              *step(6, "cmpl-10-0", "1_cmpl-1-0"), EngineIdle(2.0),
              RequestFinished("cmpl-1", 3.0, "stop", None, 1, 0, 0, [1])]

    async def scenario(fan_out, core):
        by_type = fan_out.subscribe(EventFilter.from_query(["StepRecord, RequestQueued"], None))
        by_request = fan_out.subscribe(EventFilter.from_query(None, "cmpl-1"))
        fan_out.dispatch(EventsHeader(1, 4, snapshot=True), EMPTY)
        fan_out.dispatch(EventsHeader(1, 6), events)
        assert [m["type"] for m in received(by_type)] == ["Hello", *["RequestQueued"] * 3, "StepRecord", "StepRecord"]
        assert [(m["type"], m.get("request_id", m.get("step"))) for m in received(by_request)] == [
            ("Hello", 4), ("RequestQueued", "cmpl-1-0"), ("RequestQueued", "0_cmpl-1-0"),
            ("BlocksAllocated", "cmpl-1-0"), ("StepRecord", 6), ("RequestFinished", "cmpl-1")]

    run(scenario)
    with pytest.raises(ValueError, match="types: unknown event type.*StepRecords"):
        EventFilter.from_query(["StepRecords"], None)


def test_a_types_filter_names_at_least_one_type_and_repeats_add_up():
    for empty in ([""], [",,,"], [" , "], ["", ","]):
        with pytest.raises(ValueError, match="types: names no event type"):
            EventFilter.from_query(empty, None)
    assert EventFilter.from_query(["StepRecord", "RequestQueued,EngineIdle"], None).types == {
        "StepRecord", "RequestQueued", "EngineIdle"}
    for order in (["Bogus", "StepRecord"], ["StepRecord", "Bogus"]):
        with pytest.raises(ValueError, match="unknown event type.*Bogus"):
            EventFilter.from_query(order, None)
    with pytest.raises(ValueError) as refused:  # what is echoed back of the client's input is bounded
        EventFilter.from_query([",".join(f"Bogus{i}" * 100 for i in range(1000))], None)
    assert len(str(refused.value)) < MAX_ECHOED_CHARS + 1000 and "(1000 names)" in str(refused.value)


def test_a_client_whose_messages_wait_too_long_is_dropped_alone():
    async def scenario(fan_out, core):
        stalled, reading = fan_out.subscribe(EventFilter()), fan_out.subscribe(EventFilter())
        fan_out.dispatch(EventsHeader(1, 0, snapshot=True), EMPTY)
        received(reading)
        stalled.pending_since = time.monotonic() - engine_events.MAX_LAG_S - 0.1  # its Hello waits still
        fan_out.dispatch(EventsHeader(1, 1), step(1, "a"))
        (dropped,) = received(stalled)
        assert dropped["type"] == "Dropped" and "step 1" in dropped["reason"] and stalled.ended
        assert await stalled.take() is None  # what the response writes next: the end
        assert [m["type"] for m in received(reading)] == ["StepStarted", "StepRecord"]
        assert fan_out.clients == [reading]

    run(scenario)


def test_a_client_with_too_many_bytes_waiting_is_dropped(monkeypatch):
    monkeypatch.setattr(engine_events, "MAX_PENDING_BYTES", 2000)

    async def scenario(fan_out, core):
        client = fan_out.subscribe(EventFilter())
        fan_out.dispatch(EventsHeader(1, 0, snapshot=True), EMPTY)
        for number in range(1, 10):
            fan_out.dispatch(EventsHeader(1, number), step(number, "a", "b"))
        assert [m["type"] for m in received(client)] == ["Dropped"] and fan_out.clients == []
        await asyncio.sleep(0)
        assert core.published == [1, None]  # it was the last client: the engine stops publishing

    run(scenario)


def test_messages_the_engine_core_could_not_send_end_every_stream():
    async def scenario(fan_out, core):
        clients = [fan_out.subscribe(EventFilter()) for _ in range(2)]
        fan_out.dispatch(EventsHeader(1, 0, snapshot=True), EMPTY)
        fan_out.dispatch(EventsHeader(1, 1, num_lost=3), step(1, "a"))
        for client in clients:
            assert [m["type"] for m in received(client)] == ["Dropped"] and client.ended  # in place of what waited
        assert fan_out.clients == []

    run(scenario)
