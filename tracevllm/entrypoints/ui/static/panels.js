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

const html = new WeakMap();  // per container, the HTML it was last given

function setHTML(container, text) {
  // A frame that would give a panel the HTML it already shows leaves it as it is: no new elements to
  // lay out and paint (the batch of a steady decode looks the same step after step).
  if (html.get(container) === text) return;
  html.set(container, text);
  container.innerHTML = text;
}

function more(total) {
  return total > MAX_CHIPS ? `<span class="more">+${total - MAX_CHIPS} more</span>` : '';
}

export function renderBatch(container, summary, snapshot, model) {
  if (!snapshot) {
    summary.textContent = 'no step yet';
    setHTML(container, '');
    container.dataset.count = 0;
    return;
  }
  const {record, rows} = snapshot;
  if (record.found) {  // the engine as the page found it (model.js restore())
    summary.textContent = `${rows.length} requests running when the page connected; the next step shows their tokens`;
    setHTML(container, rows.slice(0, MAX_CHIPS).map(r => chip(r, 'running', `${r.id}: ${r.computedBefore} tokens computed`,
                                                              r.isDecode ? 'decode' : 'prefill')).join('') + more(rows.length));
    container.dataset.count = rows.length;
    return;
  }
  const batch = record.batch ?? {num_scheduled_tokens: 0, token_budget: 0, preempted_request_ids: []};
  const prefill = rows.filter(r => !r.isDecode).reduce((a, r) => a + r.n, 0);
  const ms = 1000 * Object.values(record.durations).reduce((a, b) => a + b, 0);
  summary.textContent = `${rows.length} requests, ${batch.num_scheduled_tokens} tokens of a ${batch.token_budget}-token `
    + `budget (${prefill} prefill, ${batch.num_scheduled_tokens - prefill} decode), ${ms.toFixed(1)} ms`;
  const chips = rows.slice(0, MAX_CHIPS).map(r => {
    if (r.isDecode) return chip(r, `D ${r.n}`, `${r.id}: decode, ${r.n} token this step`, 'decode');
    const to = r.computedBefore + r.n;
    const of = r.target === null ? '' : ` of ${r.target}`;
    const title = `${r.id}: prefill${r.chunked ? ' chunk' : ''}, tokens ${r.computedBefore}-${to}${of} this step`;
    return chip(r, `P ${r.n}${r.chunked ? ' ✂' : ''}`, title, r.chunked ? 'prefill chunked' : 'prefill');
  });
  const preempted = batch.preempted_request_ids.map(id => {
    const r = model.requests.get(id);
    const known = {id, index: r?.index ?? -1, label: r?.label ?? id};
    return chip(known, 'preempted', `${id}: preempted this step, its KV blocks freed`, 'preempted');
  });
  setHTML(container, chips.join('') + more(rows.length) + preempted.join(''));
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
    case 'kv_cache':
      return `KV cache: needs ${w.num_blocks_needed} blocks, ${w.num_free_blocks} free`;
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
  setHTML(container, queue.slice(0, MAX_CHIPS).map(q => {
    const why = reasonText(q, model);
    const cls = q.state === 'preempted' ? 'preempted' : 'waiting';
    return `<div class="qrow">${chip(q, '', `${q.id}: ${why}`, cls)}<span>${escape(why)}</span></div>`;
  }).join('') + more(queue.length));
  container.dataset.count = queue.length;
}

function stateAt(r, time) {
  // The request's state at ``time``, from its segments: queued, prefill, decode, preempted, finished.
  if (r.finishedAt !== null && r.finishedAt <= time) return 'finished';
  for (let i = r.segments.length - 1; i >= 0; i--) {
    if (r.segments[i].start <= time) return r.segments[i].kind;
  }
  return 'queued';
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
  // One time axis for all: since the oldest shown arrived, at most the last minute.
  const span = Math.min(SERIES_SECONDS, Math.max(1, time - Math.min(...recent.map(r => r.queuedAt))));
  const canvases = shownRows.map(row => row.querySelector('canvas.timeline'));
  const widths = canvases.map(c => c.clientWidth);  // read every size before drawing: one layout, not 40
  canvases.forEach((canvas, i) => drawTimeline(canvas, widths[i], recent[i], time, span));
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
    row.innerHTML = chip(r, '', r.id) + '<span class="state"></span><canvas class="timeline"></canvas>'
      + '<span class="nums"></span>';
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
    + (r.eventsLeftOut ? `<p class="hint">${r.eventsLeftOut} later events not kept</p>` : '');
}
