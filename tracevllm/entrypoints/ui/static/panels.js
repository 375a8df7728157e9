// The page's HTML panels, each drawn from a step's snapshot (model.js) or the model at a time:
// the running batch, the waiting queue and why, the recent requests with a timeline each, and the
// events of the request clicked. Chips name requests #i (arrival order), in the request's colour.

import {clearedContext} from './charts.js';
import {PHASE, requestColour} from './colours.js';
import {SERIES_SECONDS, stepRanges} from './model.js';

const MAX_CHIPS = 256;  // per panel; the rest are counted
const RECENT_REQUESTS = 40;

const escape = text => String(text).replace(/[&<>"]/g, c => ({'&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;'}[c]));

function chip({id, index, label}, note, title, extraClass = '') {
  // A request's chip; clicking it shows its events (main.js listens by data-id).
  return `<span class="chip ${extraClass}" style="--c: ${requestColour(index)}" data-id="${escape(id)}" `
    + `title="${escape(title)}">`
    + `<b>${escape(label)}</b>${note ? `<small>${escape(note)}</small>` : ''}</span>`;
}

// The batch's chips and the queue's rows are kept from frame to frame, one per request id, and
// written only where a step changed them: rebuilding a panel's HTML whenever one chip's note changed
// (every step, under load) made the browser parse, lay out and paint all of it again, four times a
// second, on the cores the engine runs on (docs/serving.md).
const kept = new WeakMap();  // container -> Map(request id -> its element)

function keptChildren(container, items, make, update, total) {
  // items: [{id, label, ...}]; make(item) builds an element, update(element, item) writes what changed.
  const before = kept.get(container) ?? new Map();
  const now = new Map();
  const children = items.map(item => {
    let element = before.get(item.id);
    if (element === undefined || element.dataset.label !== item.label) {  // a new model numbers anew
      element = make(item);
      element.dataset.label = item.label;
    }
    update(element, item);
    now.set(item.id, element);
    return element;
  });
  kept.set(container, now);
  if (total > MAX_CHIPS) children.push(Object.assign(document.createElement('span'), {className: 'more',
                                                                                   textContent: `+${total - MAX_CHIPS} more`}));
  const current = container.children;
  if (current.length !== children.length || children.some((c, i) => current[i] !== c && !sameMore(current[i], c))) {
    container.replaceChildren(...children);
  }
}

function sameMore(a, b) {
  return a.className === 'more' && b.className === 'more' && a.textContent === b.textContent;
}

function chipElement(r) {
  const element = document.createElement('span');
  element.style.setProperty('--c', requestColour(r.index));
  element.dataset.id = r.id;
  element.append(Object.assign(document.createElement('b'), {textContent: r.label}), document.createElement('small'));
  return element;
}

function setChip(element, note, title, extraClass) {
  const className = `chip ${extraClass}`;
  if (element.className !== className) element.className = className;
  if (element.title !== title) element.title = title;
  const small = element.lastChild;
  if (small.textContent !== note) small.textContent = note;
}

export function renderBatch(container, summary, snapshot, model) {
  if (!snapshot) {
    summary.textContent = 'no step yet';
    keptChildren(container, [], chipElement, () => {}, 0);
    container.dataset.count = 0;
    return;
  }
  const {record, rows} = snapshot;
  if (record.found) {  // the engine as the page found it (model.js restore())
    summary.textContent = `${rows.length} requests running when the page connected; the next step shows their tokens`;
    keptChildren(container, rows.slice(0, MAX_CHIPS), chipElement,
                 (e, r) => setChip(e, 'running', `${r.id}: ${r.computedBefore} tokens computed`,
                                   r.isDecode ? 'decode' : 'prefill'), rows.length);
    container.dataset.count = rows.length;
    return;
  }
  const batch = record.batch ?? {num_scheduled_tokens: 0, token_budget: 0, preempted_request_ids: []};
  const prefill = rows.filter(r => !r.isDecode).reduce((a, r) => a + r.n, 0);
  const ms = 1000 * Object.values(record.durations).reduce((a, b) => a + b, 0);
  // After its last step the engine is idle: the panel still shows that step, and says so.
  const last = model.idle && snapshot === model.steps.at(-1) ? 'The last step before the engine went idle: ' : '';
  const plural = (n, word) => `${n} ${word}${n === 1 ? '' : 's'}`;
  summary.textContent = `${last}${plural(rows.length, 'request')}, ${plural(batch.num_scheduled_tokens, 'token')} of a `
    + `${batch.token_budget}-token budget (${prefill} prefill, ${batch.num_scheduled_tokens - prefill} decode), `
    + `${ms.toFixed(1)} ms`;
  const shown = rows.slice(0, MAX_CHIPS).map(r => {
    if (r.isDecode) return {...r, note: `D ${r.n}`, title: `${r.id}: decode, ${r.n} token this step`, cls: 'decode'};
    const to = r.computedBefore + r.n;
    const of = r.target === null ? '' : ` of ${r.target}`;
    const title = `${r.id}: prefill${r.chunked ? ' chunk' : ''}, tokens ${r.computedBefore}-${to}${of} this step`;
    return {...r, note: `P ${r.n}${r.chunked ? ' ✂' : ''}`, title, cls: r.chunked ? 'prefill chunked' : 'prefill'};
  });
  const preempted = batch.preempted_request_ids.map(id => {
    const r = model.requests.get(id);
    return {id, index: r?.index ?? -1, label: r?.label ?? id, note: 'preempted',
            title: `${id}: preempted this step, its KV blocks freed`, cls: 'preempted'};
  });
  // A request preempted this step is not in the batch: one chip per id still holds.
  keptChildren(container, [...shown, ...preempted], chipElement, (e, c) => setChip(e, c.note, c.title, c.cls),
               rows.length);
  container.dataset.count = rows.length;
}

export function reasonText(r, model) {
  const label = id => model.requests.get(id)?.label ?? id;
  const w = r.reason;
  if (w === null) return r.state === 'preempted' ? 'preempted: waits to resume' : 'queued: not scheduled yet';
  switch (w.reason) {
    case 'token_budget':
      return `token budget spent${w.blocked_by.length ? ` (most by ${w.blocked_by.map(label).join(', ')})` : ''}`;
    case 'max_num_seqs':
      return `max_num_seqs: ${model.hello.max_num_seqs} already running`;
    case 'kv_cache': {
      const need = w.full_sequence ? `the whole prompt must fit: ${w.num_blocks_needed} blocks needed`
        : `needs ${w.num_blocks_needed} blocks`;
      const kept = w.num_watermark_blocks ? `, ${w.num_watermark_blocks} kept free by the watermark` : '';
      return `KV cache: ${need}, ${w.num_free_blocks} free${kept}`;
    }
    case 'preemption':
      return 'none admitted: a preemption this step';
    case 'in_flight':
      return 'its last tokens are in flight';
    case 'queued_behind':
      return `behind ${w.blocked_by.map(label).join(', ')} in the queue`;
    default:
      return w.reason;
  }
}

export function renderQueue(container, snapshot, model) {
  const queue = snapshot?.queue ?? [];
  keptChildren(container, queue.slice(0, MAX_CHIPS), queueRow, (row, q) => {
    const why = reasonText(q, model);
    setChip(row.firstChild, '', `${q.id}: ${why}`, q.state === 'preempted' ? 'preempted' : 'waiting');
    if (row.lastChild.textContent !== why) row.lastChild.textContent = why;
  }, queue.length);
  container.dataset.count = queue.length;
}

function queueRow(q) {
  const row = document.createElement('div');
  row.className = 'qrow';
  row.append(chipElement(q), document.createElement('span'));
  return row;
}

function stateAt(r, time) {
  // The request's state at ``time``, from its segments: queued, prefill, decode, preempted, finished.
  if (r.finishedAt !== null && r.finishedAt <= time) return 'finished';
  for (let i = r.segments.length - 1; i >= 0; i--) {
    if (r.segments[i].start <= time) return r.segments[i].kind;
  }
  return 'queued';
}

const TRACES_VIEW = 'record the run with --trace-out DIR and open it with tracevllm traces view DIR';

export function missedText(model) {
  // What a page that connected to a running server cannot show: the steps before its Hello, and the
  // events of every request in them (those that finished then are not listed at all).
  const n = model.missedSteps;
  if (!n) return '';
  return `This page connected after step ${n}: the ${n === 1 ? 'step' : `${n} steps`} before it, and the `
    + 'requests that finished in them, are missing; a request found waiting or running is shown from then '
    + `on, without its earlier events. To see a whole run, ${TRACES_VIEW}.`;
}

export function renderRequests(container, header, model, time, selected) {
  const shown = [...model.requests.values()].filter(r => r.queuedAt !== null && r.queuedAt <= time);
  const counts = {queued: 0, prefill: 0, decode: 0, preempted: 0, finished: 0};
  for (const r of shown) counts[stateAt(r, time)]++;
  Object.assign(header.dataset, {total: shown.length, finished: counts.finished,
                                 unfinished: shown.length - counts.finished});
  header.textContent = `${shown.length} seen: ${counts.finished} finished, ${counts.prefill + counts.decode} running, `
    + `${counts.queued + counts.preempted} waiting`;
  const recent = shown.slice(-RECENT_REQUESTS).reverse();
  const shownRows = recent.map(r => updateRow(requestRow(r), r, stateAt(r, time), selected));
  const current = container.children;
  if (current.length !== shownRows.length || shownRows.some((row, i) => current[i] !== row)) {
    container.replaceChildren(...shownRows);
  }
  // One time axis for all: since the oldest shown arrived, at most the last minute. The timelines
  // share their column, so one width read (one layout) serves them all.
  const span = Math.min(SERIES_SECONDS, Math.max(1, time - Math.min(...recent.map(r => r.queuedAt))));
  const canvases = shownRows.map(row => row.querySelector('canvas.timeline'));
  const width = canvases.length ? canvases[0].clientWidth : 0;
  canvases.forEach((canvas, i) => drawTimeline(canvas, width, recent[i], time, span));
}

// Each request's row in the recent list, made once and kept (its chip, its timeline's canvas): a new
// row a frame for each of the 40, as the list was first drawn, made the browser lay out, raster and
// composite 40 new canvases four times a second, most of what the page cost the server's cores.
const requestRows = new WeakMap();  // request (model.js) -> its row

function requestRow(r) {
  let row = requestRows.get(r);
  if (row === undefined) {
    row = document.createElement('div');
    row.dataset.id = r.id;
    const rowChip = chipElement(r);
    setChip(rowChip, '', r.id, '');
    const part = (tag, className) => Object.assign(document.createElement(tag), {className});
    row.append(rowChip, part('span', 'state'), part('canvas', 'timeline'), part('span', 'nums'));
    requestRows.set(r, row);
  }
  return row;
}

function updateRow(row, r, state, selected) {
  // Only what changed is written: the browser then has nothing to lay out again.
  const className = `req${r.id === selected ? ' selected' : ''}`;
  if (row.className !== className) row.className = className;
  if (row.dataset.state !== state) {
    row.dataset.state = state;
    const label = row.querySelector('.state');
    label.className = `state ${state}`;
    label.textContent = state;
  }
  const nums = `in ${r.numPrompt ?? '?'}${r.outputs === null ? '' : ` · out ${r.outputs}`}`;
  const numsSpan = row.querySelector('.nums');
  if (numsSpan.textContent !== nums) numsSpan.textContent = nums;
  return row;
}

function drawTimeline(canvas, width, r, time, span) {
  // The request's life over the last span seconds: queued grey, prefill blue, decode green, preempted red.
  const ratio = window.devicePixelRatio || 1;
  const height = 10;  // as style.css draws it
  const ctx = clearedContext(canvas, width, height, ratio);
  const x = t => width * Math.max(0, 1 - (time - t) / span);
  for (const s of r.segments) {
    const end = Math.min(time, s.end ?? time);
    if (s.start > time || end < time - span) continue;
    ctx.fillStyle = PHASE[s.kind];
    ctx.fillRect(x(s.start), 1, Math.max(1, x(end) - x(s.start)), height - 2);
  }
  if (r.finishedAt !== null && r.finishedAt <= time) {
    ctx.fillStyle = '#222';
    ctx.fillRect(x(r.finishedAt) - 1, 0, 2, height);
  }
}

function describe(m, model) {
  const label = id => model.requests.get(id)?.label ?? id;
  const blocks = ids => (ids.length > 12 ? `${ids.slice(0, 12).join(', ')}, … (${ids.length})` : ids.join(', '));
  switch (m.type) {
    case 'RequestQueued':
      return `${m.num_prompt_tokens} prompt tokens, priority ${m.priority}`;
    case 'RequestWaiting':
      return reasonText({reason: m, state: 'waiting'}, model);
    case 'RequestScheduled':
    case 'RequestResumed': {
      const miss = m.lookup ? `; prefix lookup: ${m.lookup.num_blocks_hit} of ${m.lookup.num_blocks_looked_up} `
        + `blocks found (${m.lookup.miss_reason})` : '';
      return `${m.num_new_tokens} tokens this step, ${m.num_computed_tokens} from the prefix cache${miss}`;
    }
    case 'RequestPreempted':
      return `for ${label(m.forced_by)}, which needed ${m.num_blocks_needed} blocks with ${m.num_free_blocks} free; `
        + `${m.num_lost_tokens} tokens to compute again`;
    case 'RequestFinished':
      return `${m.finish_reason}: ${m.num_output_tokens} output tokens, ${m.num_cached_tokens} cached prompt tokens, `
        + `${m.num_preemptions} preemptions`;
    case 'PrefixCacheHit':
      return `shares cached blocks ${blocks(m.block_ids)} (${m.num_cached_tokens} tokens)`;
    default:
      return m.block_ids ? `blocks ${blocks(m.block_ids)}` : '';
  }
}

export function renderDetails(container, model, id) {
  const r = model.requests.get(id);
  if (r === undefined) {
    container.innerHTML = '<p class="hint">Click a request to see its events.</p>';
    return;
  }
  const jaegerUrl = model.hello.jaeger_url?.replace(/\/$/, '');
  const jaeger = jaegerUrl && r.traceId
    ? ` <a href="${escape(jaegerUrl)}/trace/${r.traceId}" target="_blank" rel="noopener">open in Jaeger</a>` : '';
  const first = r.queuedAt ?? 0;
  const since = m => (m.timestamp ? `+${(1000 * (m.timestamp - first)).toFixed(1)} ms` : '');
  const rows = r.events.map(({step, message: m}) => `<tr><td>${since(m)}</td><td>${step ?? ''}</td>`
    + `<td>${m.type}</td><td>${escape(describe(m, model))}</td></tr>`).join('');
  container.innerHTML = `<p>${chip(r, '', r.id)} <code>${escape(r.id)}</code>: ${r.state}`
    + `${r.finish ? ` (${r.finish.finish_reason})` : ''}; ${r.numPrompt ?? '?'} prompt tokens`
    + `${r.cachedTokens ? ` (${r.cachedTokens} cached)` : ''}, ${r.outputs ?? 0} output tokens, `
    + `${r.preemptions} preemptions; ran in steps ${stepRanges(r.stepRanges) || 'none yet'}</p>`
    + `<p>trace id: <code>${r.traceId ?? 'none (tracing off)'}</code>${jaeger}</p>`
    + `<table><thead><tr><th>time</th><th>step</th><th>event</th><th></th></tr></thead><tbody>${rows}</tbody></table>`
    + (r.eventsLeftOut ? `<p class="hint">${r.eventsLeftOut} later events not kept</p>` : '')
    + (r.foundAfter !== null ? `<p class="missed">Found ${r.foundAfter < 0 ? 'waiting' : `after step ${r.foundAfter}`} `
      + `when the page connected: its events before then are missing (to see them all, ${TRACES_VIEW}).</p>` : '');
}
