"""``GET /v1/engine/events`` on a real ``tracevllm serve`` (a tiny random-weight Llama whose KV cache is
small enough that requests wait, and traced with ``--trace-out`` so that the tracer and the stream
observe together): ``Hello`` first, step records numbered without gaps, each request's events in
their order, the filters, the API key, a client that stops reading dropped while another keeps
receiving and ``/health`` stays fast, a shutdown with a stream open that leaves no process, no
socket file and no KV block behind, and pages connecting mid-run that leave the trace as it was."""

from __future__ import annotations

import glob
import http.client
import json
import os
import random
import re
import signal
import socket
import tempfile
import threading
import time

import psutil
import pytest

from tests.server_utils import RemoteServer, assert_openai_error
from tests.trace_utils import attrs, load_spans

pytestmark = pytest.mark.slow

API_KEY = "sesame"
JAEGER_URL = "http://localhost:16686"
NUM_GPU_BLOCKS = 48
SERVE_ARGS = ["--served-model-name", "tiny", "--dtype", "float32", "--max-model-len", "512", "--max-num-seqs", "8",
              "--max-num-batched-tokens", "256", "--num-gpu-blocks-override", str(NUM_GPU_BLOCKS),
              "--uvicorn-log-level", "warning"]
PREFIX = list(range(100, 132))  # two blocks every prompt shares: prefix-cache hits


@pytest.fixture(scope="module")
def server(tiny_checkpoint, tmp_path_factory):
    trace_dir = tmp_path_factory.mktemp("engine-events-traces")
    with RemoteServer([tiny_checkpoint("llama"), *SERVE_ARGS, "--trace-out", str(trace_dir), "--jaeger-url", JAEGER_URL],
                      api_key=API_KEY) as server:
        yield server


class EventStream:
    """A client of ``/v1/engine/events``, read on a thread of its own: ``messages`` grows as they come."""

    def __init__(self, server: RemoteServer, query: str = "", api_key: str | None = API_KEY) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
        self.conn.request("GET", "/v1/engine/events" + (f"?{query}" if query else ""),
                          headers={"Authorization": f"Bearer {api_key}"} if api_key else {})
        self.sock = self.conn.sock
        self.response = self.conn.getresponse()
        self.status = self.response.status
        self.messages: list[dict] = []
        self.num_bytes = 0
        self.ended = threading.Event()
        if self.status == 200:
            assert self.response.getheader("content-type").startswith("text/event-stream")
            threading.Thread(target=self._read, daemon=True).start()
        else:
            self.ended.set()

    def _read(self) -> None:
        try:
            while line := self.response.readline():
                self.num_bytes += len(line)
                if line.startswith(b"data: "):
                    self.messages.append(json.loads(line[len(b"data: "):]))
                else:
                    assert line == b"\n", line
        except (OSError, http.client.HTTPException, ValueError):
            pass
        self.ended.set()

    def of_type(self, *types: str) -> list[dict]:
        return [m for m in list(self.messages) if m["type"] in types]

    def wait_for(self, predicate, timeout: float = 60.0) -> None:
        deadline = time.time() + timeout
        while not predicate(list(self.messages)):
            assert time.time() < deadline, f"not seen in {timeout} s; last messages: {self.messages[-3:]}"
            time.sleep(0.05)

    def close(self) -> None:
        """Hang up; the reader thread sees the end of the stream and stops."""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.ended.wait(10)
        self.conn.close()


def completion(server: RemoteServer, prompt: list[int], max_tokens: int, **fields) -> dict:
    status, body = server.request("POST", "/v1/completions", {"model": "tiny", "prompt": prompt,
                                                              "max_tokens": max_tokens, "ignore_eos": True, **fields})
    assert status == 200, body
    return json.loads(body)


def run_load(server: RemoteServer, num_requests: int, max_tokens: int = 40, prompt_len: int = 100) -> list[str]:
    """``num_requests`` completions at once (more than ``--max-num-seqs``, more KV than the cache holds);
    their response ids."""
    rng = random.Random(num_requests)
    ids: list[str] = []

    def one() -> None:
        prompt = PREFIX + [rng.randrange(200, 5000) for _ in range(prompt_len - len(PREFIX))]
        ids.append(completion(server, prompt, max_tokens)["id"])

    threads = [threading.Thread(target=one) for _ in range(num_requests)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(ids) == num_requests
    return ids


def request_events(messages: list[dict]) -> dict[str, list[dict]]:
    """The request events of each request (by the engine's request id), in stream order."""
    events: dict[str, list[dict]] = {}
    for m in messages:
        if m["type"].startswith("Request"):
            events.setdefault(m["request_id"], []).append(m)
    return events


def assert_steps_without_gaps(messages: list[dict], after: int) -> list[dict]:
    """Every ``StepRecord`` after ``Hello``'s step, numbered without a gap, each after its ``StepStarted``."""
    after = max(after, 0)  # -1: no step yet
    records = [m for m in messages if m["type"] == "StepRecord"]
    assert [r["step"] for r in records] == list(range(after + 1, after + 1 + len(records)))
    started = [m["step"] for m in messages if m["type"] == "StepStarted"]
    assert started[:len(records)] == [r["step"] for r in records]
    return records


def assert_life_in_order(request_id: str, events: list[dict]) -> None:
    """Queued, Workload, (Waiting...), Scheduled, then (Preempted, (Waiting...), Resumed)..., Finished,
    each with a timestamp no earlier than the one before."""
    types = [e["type"] for e in events]
    assert types[:2] == ["RequestQueued", "RequestWorkload"] and types[-1] == "RequestFinished", (request_id, types)
    running = scheduled = False
    for kind in types[2:-1]:
        if kind == "RequestWaiting":
            assert not running, (request_id, types)
        elif kind in ("RequestScheduled", "RequestResumed"):
            assert not running and scheduled == (kind == "RequestResumed"), (request_id, types)
            running = scheduled = True
        else:
            assert kind == "RequestPreempted" and running, (request_id, types)
            running = False
    assert running, (request_id, types)
    timestamps = [e["timestamp"] for e in events if "timestamp" in e]
    assert timestamps == sorted(timestamps), (request_id, types)


def test_every_step_and_every_request_event_arrives_in_order(server):
    stream = EventStream(server)
    stream.wait_for(lambda ms: ms)
    hello = stream.messages[0]
    assert hello["type"] == "Hello" and hello["source"] == "live" and hello["jaeger_url"] == JAEGER_URL
    assert (hello["num_gpu_blocks"], hello["block_size"], hello["max_num_seqs"], hello["max_num_batched_tokens"],
            hello["model"]) == (NUM_GPU_BLOCKS, 16, 8, 256, "tiny")
    assert hello["num_null_blocks"] == 1  # block 0, vLLM's null block: never held, never free
    assert isinstance(hello["step"], int) and hello["step"] >= -1

    ids = run_load(server, 16)
    engine_ids = {f"{i}-0" for i in ids}
    stream.wait_for(lambda ms: {m["request_id"] for m in ms if m["type"] == "RequestFinished"} >= engine_ids)
    stream.wait_for(lambda ms: ms and ms[-1]["type"] == "EngineIdle")
    messages = list(stream.messages)
    stream.close()

    records = assert_steps_without_gaps(messages[1:], hello["step"])
    lives = request_events(messages)
    assert set(lives) == engine_ids
    for request_id, events in lives.items():
        assert_life_in_order(request_id, events)
    # Recorded only when observed, they flow while a client listens: why requests waited, what they asked.
    reasons = {m["reason"] for m in messages if m["type"] == "RequestWaiting"}
    assert "max_num_seqs" in reasons or "kv_cache" in reasons, reasons
    workload = next(m for m in messages if m["type"] == "RequestWorkload")
    assert workload["block_size"] == 16 and all(re.fullmatch(r"[0-9a-f]{2,}", h)
                                                for h in workload["prompt_block_hashes"])
    assert any(m["type"] == "PrefixCacheHit" for m in messages)
    stored = next(m for m in messages if m["type"] == "BlocksStored")
    assert len(stored["block_hashes"]) == len(stored["block_ids"]) and isinstance(stored["block_hashes"][0], str)
    # The step records' shape, and what they say at the end: nothing runs, nothing waits, no block is held.
    busiest = max(records, key=lambda r: r["batch"]["num_scheduled_tokens"] if r["batch"] else 0)
    assert set(busiest["batch"]) == {"scheduled", "preempted_request_ids", "token_budget", "num_scheduled_tokens"}
    assert set(busiest["batch"]["scheduled"][0]) == {"request_id", "num_tokens", "is_decode", "num_computed_tokens"}
    assert {s["request_id"] for r in records if r["batch"] for s in r["batch"]["scheduled"]} == engine_ids
    last = records[-1]["gauges"]
    assert (last["num_running_reqs"], last["num_waiting_reqs"], last["kv_cache_usage"]) == (0, 0, 0.0)
    assert last["num_gpu_blocks"] == NUM_GPU_BLOCKS and last["num_free_blocks"] == NUM_GPU_BLOCKS - 1
    metrics = server.metrics()
    assert metrics["vllm:kv_cache_usage_perc"] == 0.0 and metrics["vllm:num_requests_running"] == 0


def test_a_later_client_starts_where_its_hello_says(server):
    first = EventStream(server)
    first.wait_for(lambda ms: ms)
    thread = threading.Thread(target=run_load, args=(server, 12))
    thread.start()
    first.wait_for(lambda ms: sum(m["type"] == "StepRecord" for m in ms) >= 5)
    second = EventStream(server)  # joins mid-run, while the engine publishes
    thread.join()
    first.wait_for(lambda ms: ms and ms[-1]["type"] == "EngineIdle")
    second.wait_for(lambda ms: ms and ms[-1]["type"] == "EngineIdle")
    hello = second.messages[0]
    assert hello["type"] == "Hello" and hello["step"] >= max(first.messages[0]["step"], 0) + 5
    later = assert_steps_without_gaps(second.messages[1:], hello["step"])
    assert later and later[-1] == first.of_type("StepRecord")[-1]
    # Each starts from its own snapshot: the first from the engine before the load, the second from
    # the run under way, whose waiting requests say why as the first client heard it last.
    assert_snapshot_accounts_for_every_block(list(first.messages))
    snapshot = assert_snapshot_accounts_for_every_block(list(second.messages))
    assert snapshot["requests"], "the second client joined mid-run"
    before_join = first.messages[:first.messages.index(second.messages[1])]
    heard = {m["request_id"]: {**m, "type": None} for m in before_join if m["type"] == "RequestWaiting"}
    reasons = [({**r["waiting"], "type": None}, heard[r["request_id"]])
               for r in snapshot["requests"] if r["waiting"] is not None]
    assert reasons and all(ours == theirs for ours, theirs in reasons), reasons
    first.close()
    second.close()


def assert_snapshot_accounts_for_every_block(messages: list[dict]) -> dict:
    """Replay the stream's block and queue events onto its Hello's snapshot: every freed block was held
    by the request that frees it, every request that finishes or is admitted was known (from the
    snapshot or queued since), and at the end no block is held and nothing waits. The snapshot."""
    snapshot = messages[0]["snapshot"]
    holders: dict[int, list[str]] = {}
    for r in snapshot["requests"]:
        assert r["status"] in ("waiting", "preempted", "running")
        for block in r["block_ids"]:
            holders.setdefault(block, []).append(r["request_id"])
    waiting = [r["request_id"] for r in snapshot["requests"] if r["status"] != "running"]
    known = {r["request_id"] for r in snapshot["requests"]}
    for m in messages[1:]:
        kind, request_id = m["type"], m.get("request_id")
        if kind in ("BlocksAllocated", "PrefixCacheHit"):
            for block in m["block_ids"]:
                holders.setdefault(block, []).append(request_id)
        elif kind == "BlocksFreed":
            for block in m["block_ids"]:
                assert request_id in holders.get(block, []), (request_id, block, holders.get(block))
                holders[block].remove(request_id)
        elif kind == "RequestQueued":
            known.add(request_id)
            waiting.append(request_id)
        elif kind in ("RequestScheduled", "RequestResumed", "RequestFinished", "RequestPreempted"):
            assert request_id in known, (kind, request_id)
            if request_id in waiting:
                waiting.remove(request_id)
            if kind == "RequestPreempted":
                waiting.insert(0, request_id)
    assert not any(holders.values()) and not waiting, ({b: h for b, h in holders.items() if h}, waiting)
    return snapshot


def test_a_client_that_connects_mid_run_starts_from_a_snapshot(server):
    """No client while the load starts: the first one to connect opens a session mid-run, and its
    Hello's snapshot holds the requests already waiting and running, with their blocks."""
    thread = threading.Thread(target=run_load, args=(server, 16))
    thread.start()
    deadline = time.time() + 60
    while server.metrics().get("vllm:num_requests_waiting", 0) < 2:  # the engine is busy, with a queue
        assert time.time() < deadline and thread.is_alive(), "the load never queued"
        time.sleep(0.05)
    stream = EventStream(server)
    thread.join()
    stream.wait_for(lambda ms: ms and ms[-1]["type"] == "EngineIdle")
    snapshot = assert_snapshot_accounts_for_every_block(list(stream.messages))
    statuses = [r["status"] for r in snapshot["requests"]]
    assert "running" in statuses and "waiting" in statuses, statuses
    assert statuses == sorted(statuses, key=lambda status: status == "running")  # the queue, then the batch
    assert any(r["block_ids"] for r in snapshot["requests"]) and snapshot["cached_block_ids"]
    assert all(r["trace_headers"]["traceparent"] for r in snapshot["requests"])
    stream.close()


def follows(m: dict, request_ids: set[str]) -> bool:
    """Whether the message is about one of ``request_ids`` (a step record: one of them is in its batch)."""
    if m["type"] == "StepRecord":
        batch = m["batch"] or {"scheduled": [], "preempted_request_ids": []}
        return bool(request_ids & {*(s["request_id"] for s in batch["scheduled"]), *batch["preempted_request_ids"]})
    return m.get("request_id") in request_ids


def test_filters_by_type_and_by_request(server):
    everything = EventStream(server)
    by_type = EventStream(server, "types=StepRecord&types=RequestFinished")  # a repeated key adds up
    for stream in (everything, by_type):
        stream.wait_for(lambda ms: ms)
    # A streamed request with two samples, followed by the id of its first chunk (the response's).
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    conn.request("POST", "/v1/completions", json.dumps({"model": "tiny", "prompt": PREFIX * 3, "max_tokens": 60, "n": 2,
                                                        "ignore_eos": True, "stream": True}),
                 {"Content-Type": "application/json", "Authorization": f"Bearer {API_KEY}"})
    response = conn.getresponse()
    response_id = json.loads(response.readline().removeprefix(b"data: "))["id"]
    by_request = EventStream(server, f"request_id={response_id}")
    by_request.wait_for(lambda ms: ms)
    other_ids = {f"{i}-0" for i in run_load(server, 4)}
    response.read()
    conn.close()
    everything.wait_for(lambda ms: ms and ms[-1]["type"] == "EngineIdle")
    time.sleep(1.0)  # the other streams had the same messages at the same moment: let their readers finish

    assert {m["type"] for m in by_type.messages} == {"Hello", "StepRecord", "RequestFinished"}
    assert by_type.messages[1:] == everything.of_type("StepRecord", "RequestFinished")
    # In the engine, the two samples are "0_<id>-0" and "1_<id>-0" (n > 1, and prompt 0 of a completion).
    samples = {f"{j}_{response_id}-0" for j in range(2)}
    followed = by_request.messages[1:]
    assert {m["request_id"] for m in followed if m["type"] == "RequestFinished"} == samples
    assert all(follows(m, samples) for m in followed) and not {m.get("request_id") for m in followed} & other_ids
    # Exactly what the unfiltered stream has of them, from the moment the client joined.
    expected = [m for m in everything.messages[1:] if follows(m, samples)]
    assert followed == expected[len(expected) - len(followed):]
    for stream in (everything, by_type, by_request):
        stream.close()

    assert_openai_error(server.request("GET", "/v1/engine/events?types=StepRecord,Nonsense"), 400, "types", "Nonsense")
    # A repeated ``types`` adds its names, in either order; one that names nothing is refused.
    for query in ("types=Bogus&types=StepRecord", "types=StepRecord&types=Bogus"):
        assert_openai_error(server.request("GET", f"/v1/engine/events?{query}"), 400, "types", "Bogus")
    for query in ("types=", "types=,,,"):
        assert_openai_error(server.request("GET", f"/v1/engine/events?{query}"), 400, "types", "names no event type")


def test_the_stream_wants_the_api_key(server):
    for key in (None, "wrong"):
        stream = EventStream(server, api_key=key)
        assert stream.status == 401
        stream.close()
    stream = EventStream(server)
    assert stream.status == 200
    stream.wait_for(lambda ms: ms and ms[0]["type"] == "Hello")
    stream.close()


def loopback_buffer_bytes() -> int:
    """What a loopback TCP connection holds for a peer that does not read (and whose receive buffer is
    4 KiB, as the stalled client's below): the sender's kernel buffer and the peer's."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        with socket.socket() as peer:
            peer.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            peer.connect(listener.getsockname())
            conn, _ = listener.accept()
            with conn:
                conn.setblocking(False)
                total = 0
                try:
                    while True:
                        total += conn.send(b"x" * 65536)
                except BlockingIOError:
                    return total


def keep_busy(server: RemoteServer, stop: threading.Event, concurrency: int = 16) -> list[threading.Thread]:
    """``concurrency`` clients, each sending one completion after another until ``stop`` is set."""
    def client(seed: int) -> None:
        rng = random.Random(seed)
        while not stop.is_set():
            completion(server, PREFIX + [rng.randrange(200, 5000) for _ in range(160)], 60)

    threads = [threading.Thread(target=client, args=(seed,)) for seed in range(concurrency)]
    for thread in threads:
        thread.start()
    return threads


def test_a_client_that_stops_reading_is_dropped_and_nobody_waits_for_it(server):
    """The stalled client's connection fills (the kernel's buffers, then uvicorn's); from then on its
    messages wait on the server, and MAX_LAG_S (2 s) later it is dropped: when it reads again it finds
    ``Dropped`` after the last message its connection took, less than 5 s of engine time after it.
    Meanwhile the other client receives every step, and ``/health`` answers within 1 s."""
    full = loopback_buffer_bytes() + 2**17  # what the stalled connection holds: the kernel's and uvicorn's buffers
    reader = EventStream(server)
    reader.wait_for(lambda ms: ms)
    stalled = socket.socket()
    stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    stalled.connect(("127.0.0.1", server.port))
    stalled.sendall(f"GET /v1/engine/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {API_KEY}\r\n\r\n".encode())
    streamed_before = reader.num_bytes
    stop = threading.Event()
    clients = keep_busy(server, stop)
    health_seconds = []
    deadline = time.time() + 300
    filled_at = None  # then the load goes on for 4 s: the drop comes 2 s after the buffers are full
    while (filled_at is None or time.time() < filled_at + 4.0) and time.time() < deadline:
        start = time.perf_counter()
        assert server.request("GET", "/health", timeout=5)[0] == 200
        health_seconds.append(time.perf_counter() - start)
        if filled_at is None and reader.num_bytes - streamed_before >= full:
            filled_at = time.time()
        time.sleep(0.2)
    stop.set()
    for client in clients:
        client.join()
    reader.wait_for(lambda ms: ms and ms[-1]["type"] == "EngineIdle")
    assert filled_at is not None, "the load did not stream enough to fill the stalled client's buffers"
    assert max(health_seconds) < 1.0, max(health_seconds)

    stalled.settimeout(30)
    data = b""
    while not data.endswith(b"0\r\n\r\n"):  # the chunked body's end: the server ended the response
        chunk = stalled.recv(1 << 20)
        assert chunk, "the connection closed before the response ended"
        data += chunk
    stalled.close()
    messages = [json.loads(line[len(b"data: "):]) for line in data.split(b"\n") if line.startswith(b"data: ")]
    assert messages[0]["type"] == "Hello" and messages[-1]["type"] == "Dropped", messages[-1]
    dropped_at = int(re.search(r"step (\d+)", messages[-1]["reason"]).group(1))
    last_taken = max(m["step"] for m in messages if m["type"] == "StepRecord")
    times = {r["step"]: r["start_time"] for r in reader.of_type("StepRecord")}
    assert times[dropped_at] - times[last_taken] < 5.0, (last_taken, dropped_at)
    assert_steps_without_gaps(reader.messages[1:], reader.messages[0]["step"])
    reader.close()


def test_shutdown_with_a_stream_open_leaves_nothing_behind(tiny_checkpoint):
    """SIGTERM with a stream open (it never ends by itself): the server ends it and exits at once,
    rather than after ``--shutdown-timeout``, and leaves no process and no socket file behind."""
    before = set(glob.glob(os.path.join(tempfile.gettempdir(), "tracevllm-*")))
    with RemoteServer([tiny_checkpoint("llama"), *SERVE_ARGS, "--shutdown-timeout", "30"]) as server:
        engine_core = server.engine_core_process()
        stream = EventStream(server, api_key=None)
        run_load(server, 4)
        stream.wait_for(lambda ms: ms and ms[-1]["type"] == "EngineIdle")
        started = time.perf_counter()
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(60) == 0
        assert time.perf_counter() - started < 10.0
        assert stream.ended.wait(10) and stream.messages[-1]["type"] == "EngineIdle"
        gone, alive = psutil.wait_procs([engine_core], timeout=15)
        assert engine_core in gone, "the EngineCore process outlived the server"
    assert set(glob.glob(os.path.join(tempfile.gettempdir(), "tracevllm-*"))) <= before


def repeated_waits(trace_dir) -> tuple[int, list[tuple[str, str]]]:
    """The trace's ``WAITING`` events, and those that repeat the reason their request last recorded
    without an admission between: the tracer records a reason once per change (chapter 12)."""
    num_waits, repeats = 0, []
    for span in load_spans(trace_dir):
        last = None
        for event in span.get("events", []):
            if event["name"] in ("SCHEDULED", "RESUMED"):
                last = None
            elif event["name"] == "WAITING":
                a = attrs(event)
                key = (a["reason"], a.get("blocked_by", [""])[0] if a["reason"] == "queued_behind" else "")
                num_waits += 1
                if key == last:
                    repeats.append((span["name"], a["reason"]))
                last = key
    return num_waits, repeats


@pytest.mark.parametrize("num_pages", [0, 3])
def test_pages_that_connect_mid_run_leave_the_trace_as_it_was(tiny_checkpoint, tmp_path, num_pages):
    """The same served load, traced, with no page and with three pages (event streams, as ``/ui``
    opens) connecting while requests wait: each request's ``WAITING`` reasons are in the trace once
    per change either way. A page's snapshot is built from what the engine knows already; it must not
    make the engine record the queue's reasons again."""
    trace_dir = tmp_path / "traces"
    with RemoteServer([tiny_checkpoint("llama"), *SERVE_ARGS, "--trace-out", str(trace_dir)]) as server:
        load = threading.Thread(target=run_load, args=(server, 24))
        load.start()
        pages = []
        for _ in range(num_pages):
            deadline = time.time() + 60
            while server.metrics().get("vllm:num_requests_waiting", 0) < 2:  # a queue, with reasons recorded
                assert time.time() < deadline and load.is_alive(), "the load never queued"
                time.sleep(0.02)
            pages.append(EventStream(server, api_key=None))
            pages[-1].wait_for(lambda ms: ms and ms[0]["type"] == "Hello")
        load.join()
        for page in pages:
            page.close()
    num_waits, repeats = repeated_waits(trace_dir)
    print(f"{num_pages} pages: {num_waits} WAITING events, {len(repeats)} repeated")
    assert num_waits > 0 and repeats == []
