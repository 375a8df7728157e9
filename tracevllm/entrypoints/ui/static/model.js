// The engine as its events tell it (tracevllm/core/events.py, one message of the stream each): the
// requests and their lives, the waiting queue in the scheduler's order, who holds each KV block and
// which blocks the prefix cache can still find, and a snapshot of every step's end for the last
// BUFFERED_STEPS steps, which the page draws (and steps through when paused).
//
//   RequestQueued ─▶ waiting ─ RequestScheduled ─▶ running ─ RequestFinished ─▶ finished
//                      ▲   RequestWaiting: why not yet  │
//                      └──── RequestPreempted ◀─────────┘  (back to the front of the queue)
//
//   BlocksAllocated / PrefixCacheHit: the request takes a reference   owners[block] gains it
//   BlocksFreed: it drops it                                           owners[block] loses it
//   BlocksStored / BlocksEvicted / AllBlocksCleared                    cached[block] = findable by hash
//
// A block with no owner is free; free and cached, the prefix cache can still hand it to a request
// with the same prefix, until it is evicted (given to another request). The first numNullBlocks blocks
// (block 0, vLLM's null block; none in a trace recorded before it) are neither held nor free. Times are the engine's
// (seconds since the epoch), so a recorded run keeps its own clock.
//
// A page that connects while the engine runs starts from the snapshot in its Hello
// (tracevllm/engine/snapshot.py): the requests waiting and running, the blocks each holds, the
// blocks the prefix cache can find. The events that follow change it from there.

export const BUFFERED_STEPS = 300;
export const SERIES_SECONDS = 60;
const MAX_REQUESTS = 2000;  // the oldest finished requests are forgotten beyond this
const MAX_EVENTS = 300;  // per request: its first events, then a count of those left out

export class EngineModel {
  constructor(hello) {
    this.hello = hello;
    this.numBlocks = hello.num_gpu_blocks;
    this.numNullBlocks = hello.num_null_blocks ?? 0;
    this.owners = Array.from({length: this.numBlocks}, () => []);  // request ids holding each block
    this.cached = new Uint8Array(this.numBlocks);  // 1: findable by its hash (stored, not evicted)
    this.requests = new Map();  // id -> request, in arrival order
    this.byIndex = new Map();  // arrival number -> request
    this.queue = [];  // waiting request ids, as the scheduler orders them (FCFS)
    this.arrivals = 0;
    this.step = hello.step;  // the last step recorded
    this.stepRunning = null;  // the step between its StepStarted and its StepRecord (null: between steps)
    this.steps = [];  // the snapshots of the last BUFFERED_STEPS steps (snapshot())
    this.series = [];  // one point per step of the last SERIES_SECONDS: tokens, KV usage, queues
    this.now = null;  // the engine's time of the latest event
    this.idle = true;  // until a step starts (the page may connect to an engine with nothing to do)
    // Steps that ran before a live page connected: their events are not sent again (the snapshot
    // holds only what they left). A recorded run's replay starts from its first step.
    this.missedSteps = hello.source === 'live' ? Math.max(0, hello.step) : 0;
    if (hello.snapshot) this.restore(hello.snapshot);
  }

  restore(snapshot) {
    // The engine as it was when the page connected. Its requests are numbered in arrival order; a
    // waiting one has queued since it arrived, the others are shown from then on (what they did
    // before is not in the snapshot).
    const found = Math.max(0, ...snapshot.requests.map(s => s.arrival_time));  // the engine's time then, at least
    for (const s of [...snapshot.requests].sort((a, b) => a.arrival_time - b.arrival_time)) {
      this.request(s.request_id, s.arrival_time);
    }
    for (const s of snapshot.requests) {
      const r = this.requests.get(s.request_id);
      const preempted = s.status === 'preempted';
      Object.assign(r, {numPrompt: s.num_prompt_tokens, queuedAt: s.arrival_time, computed: s.num_computed_tokens,
                        target: s.num_prompt_tokens + (preempted ? s.num_output_tokens : 0),
                        admittedAt: s.num_cached_tokens, outputs: s.num_output_tokens,
                        preemptions: s.num_preemptions, state: s.status, reason: s.waiting,
                        cachedTokens: s.status === 'waiting' ? null : s.num_cached_tokens,
                        traceId: traceId(s.trace_headers), foundAfter: this.step});
      if (s.status !== 'running') this.queue.push(r.id);
      if (s.status === 'waiting') openSegment(r, 'queued', s.arrival_time);
      else openSegment(r, preempted ? 'preempted' : (s.num_output_tokens > 0 ? 'decode' : 'prefill'), found);
      for (const b of s.block_ids) this.owners[b]?.push(r.id);
    }
    for (const b of snapshot.cached_block_ids) this.cached[b] = 1;
    this.idle = snapshot.requests.length === 0;
    // Drawn at once as the first buffered step: the page found the engine so (its step's tokens are
    // not in the snapshot, so the batch lists who runs, with none this step). Before any step: nothing.
    if (this.step < 0) return;
    const running = snapshot.requests.filter(s => s.status === 'running').map(s => this.requests.get(s.request_id));
    const rows = running.map(r => ({id: r.id, index: r.index, label: r.label, n: 0, isDecode: r.outputs > 0,
                                    chunked: false, computedBefore: r.computed, target: r.target}));
    this.steps.push(this.snapshot({step: this.step, found: true, durations: {}, batch: null, gauges: null}, found, rows));
  }

  apply(message) {
    const handler = this[`on${message.type}`];
    if (handler !== undefined) handler.call(this, message);
    if (message.timestamp) this.now = Math.max(this.now ?? 0, message.timestamp);
  }

  request(id, time) {
    // A request is numbered #0, #1, ... in the order the page first hears of it: from the start of a run,
    // the order of the RequestQueued events (viz/explain.py page_labels names requests by the same rule).
    let r = this.requests.get(id);
    if (r === undefined) {
      const index = this.arrivals++;
      r = {id, index, label: `#${index}`, state: 'waiting', numPrompt: null, target: null, admittedAt: 0,
           cachedTokens: null, computed: 0, outputs: null, preemptions: 0, queuedAt: time ?? this.now,
           finishedAt: null, finish: null, traceId: null, reason: null, segments: [], stepRanges: [],
           events: [], eventsLeftOut: 0, foundAfter: null};
      this.requests.set(id, r);
      this.byIndex.set(index, r);
      this.forgetOldRequests();
    }
    return r;
  }

  forgetOldRequests() {
    for (const [id, r] of this.requests) {
      if (this.requests.size <= MAX_REQUESTS) return;
      if (r.state === 'finished') {
        this.requests.delete(id);
        this.byIndex.delete(r.index);
      }
    }
  }

  log(r, message) {
    if (r.events.length < MAX_EVENTS) r.events.push({step: this.stepRunning, message});
    else r.eventsLeftOut++;
  }

  // ---- a request's life ----------------------------------------------------------------------

  onRequestQueued(m) {
    const r = this.request(m.request_id, m.timestamp);
    Object.assign(r, {numPrompt: m.num_prompt_tokens, target: m.num_prompt_tokens, queuedAt: m.timestamp,
                      state: 'waiting', traceId: traceId(m.trace_headers)});
    this.queue.push(r.id);
    openSegment(r, 'queued', m.timestamp);
    this.log(r, m);
  }

  onRequestWaiting(m) {
    const r = this.request(m.request_id, m.timestamp);
    r.reason = m;
    this.log(r, m);
  }

  onRequestScheduled(m) {
    const r = this.request(m.request_id, m.timestamp);
    if (r.cachedTokens === null) r.cachedTokens = m.num_computed_tokens;
    Object.assign(r, {state: 'running', reason: null, admittedAt: m.num_computed_tokens});
    this.leaveQueue(r.id);
    openSegment(r, 'prefill', m.timestamp);
    this.log(r, m);
  }

  onRequestResumed(m) {
    this.onRequestScheduled(m);
  }

  onRequestPreempted(m) {
    const r = this.request(m.request_id, m.timestamp);
    Object.assign(r, {state: 'preempted', reason: null, outputs: m.num_output_tokens,
                      target: (r.numPrompt ?? 0) + m.num_output_tokens, preemptions: r.preemptions + 1});
    this.leaveQueue(r.id);
    this.queue.unshift(r.id);  // the scheduler puts a preempted request back at the front
    openSegment(r, 'preempted', m.timestamp);
    this.log(r, m);
  }

  onRequestFinished(m) {
    const r = this.request(m.request_id, m.timestamp);
    Object.assign(r, {state: 'finished', reason: null, finish: m, finishedAt: m.timestamp,
                      outputs: m.num_output_tokens});
    this.leaveQueue(r.id);
    closeSegment(r, m.timestamp);
    this.log(r, m);
  }

  leaveQueue(id) {
    const i = this.queue.indexOf(id);
    if (i >= 0) this.queue.splice(i, 1);
  }

  // ---- KV blocks -----------------------------------------------------------------------------

  onBlocksAllocated(m) {
    for (const b of m.block_ids) this.owners[b]?.push(m.request_id);
    this.log(this.request(m.request_id), m);
  }

  onPrefixCacheHit(m) {
    this.onBlocksAllocated(m);
  }

  onBlocksFreed(m) {
    for (const b of m.block_ids) {
      const holders = this.owners[b] ?? [];
      const i = holders.indexOf(m.request_id);
      if (i >= 0) holders.splice(i, 1);  // else taken before the page connected
    }
    if (this.requests.has(m.request_id)) this.log(this.requests.get(m.request_id), m);
  }

  onBlocksStored(m) {
    for (const b of m.block_ids) this.cached[b] = 1;
  }

  onBlocksEvicted(m) {
    for (const b of m.block_ids) this.cached[b] = 0;
  }

  onAllBlocksCleared() {
    this.cached.fill(0);
  }

  // ---- steps ---------------------------------------------------------------------------------

  onStepStarted(m) {
    this.idle = false;
    this.stepRunning = m.step;
    this.now = Math.max(this.now ?? 0, m.start_time);
  }

  onStepRecord(m) {
    const end = m.start_time + Object.values(m.durations).reduce((a, b) => a + b, 0);
    this.step = m.step;
    this.stepRunning = null;
    this.now = Math.max(this.now ?? 0, end);
    const batch = m.batch ?? {scheduled: [], preempted_request_ids: [], num_scheduled_tokens: 0, token_budget: 0};
    const rows = batch.scheduled.map(s => this.ran(s, m));
    const prefill = rows.filter(row => !row.isDecode).reduce((a, row) => a + row.n, 0);
    this.series.push({time: end, duration: end - m.start_time, prefill, decode: batch.num_scheduled_tokens - prefill,
                      usage: m.gauges?.kv_cache_usage ?? 0, running: m.gauges?.num_running_reqs ?? rows.length,
                      waiting: m.gauges?.num_waiting_reqs ?? this.queue.length});
    while (this.series.length && this.series[0].time < end - SERIES_SECONDS - 5) this.series.shift();
    this.steps.push(this.snapshot(m, end, rows));
    if (this.steps.length > BUFFERED_STEPS) this.steps.shift();
  }

  ran(s, record) {
    // One request's share of the step: its tokens, prefill or decode, and whether the prefill is
    // a chunk (more of its prompt comes in later steps, or came in earlier ones).
    const r = this.request(s.request_id, record.start_time);
    if (r.state !== 'finished') {  // it may have finished in this very step
      r.state = 'running';  // (a request first seen in a batch: running since before the page connected)
      openSegment(r, s.is_decode ? 'decode' : 'prefill', record.start_time);
    }
    addStep(r.stepRanges, record.step);
    r.computed = s.num_computed_tokens + s.num_tokens;
    if (r.numPrompt !== null && r.computed >= r.numPrompt) r.outputs = r.computed - r.numPrompt + 1;
    const chunked = !s.is_decode && r.target !== null
      && (s.num_computed_tokens + s.num_tokens < r.target || s.num_computed_tokens > r.admittedAt);
    return {id: r.id, index: r.index, label: r.label, n: s.num_tokens, isDecode: s.is_decode, chunked,
            computedBefore: s.num_computed_tokens, target: r.target};
  }

  snapshot(record, end, rows) {
    // What the page draws for this step, kept as it was: the batch, the queue, the blocks.
    const owner = new Int32Array(this.numBlocks).fill(-1);  // the first holder's arrival number
    const refs = new Uint16Array(this.numBlocks);
    let placed = 0;
    for (let b = 0; b < this.numBlocks; b++) {
      const holders = this.owners[b];
      refs[b] = holders.length;
      if (holders.length) {
        placed++;
        owner[b] = this.requests.get(holders[0])?.index ?? -1;
      }
    }
    const gauges = record.gauges;
    const inUse = gauges ? gauges.num_gpu_blocks - this.numNullBlocks - gauges.num_free_blocks : placed;
    const queue = this.queue.map(id => {
      const r = this.requests.get(id);
      return {id, index: r.index, label: r.label, state: r.state, reason: r.reason};
    });
    return {step: record.step, time: end, record, rows, queue, owner, refs, cached: this.cached.slice(),
            unplaced: Math.max(0, inUse - placed)};
  }

  onEngineIdle() {
    this.idle = true;
  }
}

function traceId(headers) {
  // W3C traceparent: version-traceid-parentid-flags
  const parts = (headers?.traceparent ?? '').split('-');
  return parts.length === 4 ? parts[1] : null;
}

function openSegment(r, kind, time) {
  const last = r.segments.at(-1);
  if (last !== undefined && last.end === null) {
    if (last.kind === kind) return;
    last.end = time;
  }
  r.segments.push({kind, start: time, end: null});
}

function closeSegment(r, time) {
  const last = r.segments.at(-1);
  if (last !== undefined && last.end === null) last.end = time;
}

function addStep(ranges, step) {
  const last = ranges.at(-1);
  if (last !== undefined && step <= last[1] + 1) last[1] = Math.max(last[1], step);
  else ranges.push([step, step]);
}

export function stepRanges(ranges) {
  return ranges.map(([a, b]) => (a === b ? `${a}` : `${a}-${b}`)).join(', ');
}
