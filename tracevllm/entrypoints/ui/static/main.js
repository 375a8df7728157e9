// The page: follows the stream into the model (model.js) and draws it: what the stream changed at most
// once every LIVE_FRAME_MS, what the user does at the next frame. While paused it keeps following (the
// engine does not wait), but draws the step it was paused at, and the arrows step through the
// buffered steps.

import {drawCharts} from './charts.js';
import {KVGrid} from './grid.js';
import {EngineModel} from './model.js';
import {missedText, renderBatch, renderDetails, renderQueue, renderRequests} from './panels.js';
import {follow} from './stream.js';

const $ = id => document.getElementById(id);
const grid = new KVGrid($('kv-grid'), $('kv-legend'), $('kv-tip'));
const charts = {throughput: $('chart-throughput'), usage: $('chart-usage'), queues: $('chart-queues')};
let model = null;
let paused = false;
let shownStep = null;  // while paused: the step drawn
let selected = null;  // the request whose events are listed
let detailsKey = '';
let status = 'connecting';
let frameAsked = false;
// The stream brings a message a step, and a browser on the server's own cores takes its drawing time
// from the engine: four frames a second follow the engine as well (docs/perf-log.md#live-page-frame-rate).
const LIVE_FRAME_MS = 250;
// The charts and the recent requests (each with its timeline) show the last minute, and move a
// pixel or two a frame: while following live they are drawn once a second, which looks the same.
// Drawing a paused step, the idle engine's last step, a click, or a resize draws them at once.
const HISTORY_FRAME_MS = 1000;
let lastFrame = 0;
let lastHistoryFrame = -Infinity;
let liveTimer = null;
let historyTimer = null;

function onMessage(message) {
  if (message.type === 'Hello') {
    model = new EngineModel(message);
    describeEngine(message);
    const missed = missedText(model);
    Object.assign($('requests-missed'), {textContent: missed, hidden: !missed});
  } else if (message.type === 'Dropped') {
    status = `dropped by the server (${message.reason}); connecting again`;
  } else if (model !== null) {
    model.apply(message);
  }
  redrawSoon();
}

function describeEngine(hello) {
  $('source').textContent = hello.source === 'trace' ? 'recorded run' : 'live';
  $('source').className = hello.source;
  const nullBlock = hello.num_null_blocks ? ` (+ ${hello.num_null_blocks} null)` : '';
  $('engine').textContent = `${hello.model || 'model'} · ${hello.num_gpu_blocks - (hello.num_null_blocks ?? 0)}`
    + `${nullBlock} KV blocks of ${hello.block_size} tokens · max_num_seqs ${hello.max_num_seqs} · max_num_batched_tokens ${hello.max_num_batched_tokens}`;
}

function redraw() {
  if (!frameAsked) {
    frameAsked = true;
    requestAnimationFrame(draw);
  }
}

function redrawSoon() {
  if (liveTimer !== null || frameAsked) return;
  liveTimer = setTimeout(() => { liveTimer = null; redraw(); },
                         Math.max(0, lastFrame + LIVE_FRAME_MS - performance.now()));
}

function historySoon() {
  // A frame that left the last minute's panels as they were: they are drawn when they are due, even
  // if no message comes by then (the engine's last step, before it goes idle).
  if (historyTimer !== null) return;
  historyTimer = setTimeout(() => {
    historyTimer = null;
    if (performance.now() - lastHistoryFrame >= HISTORY_FRAME_MS) redraw();
  }, lastHistoryFrame + HISTORY_FRAME_MS - performance.now());
}

function shownSnapshot() {
  const steps = model.steps;
  if (!steps.length) return null;
  if (!paused) return steps.at(-1);
  return steps.find(s => s.step === shownStep) ?? steps[0];  // the oldest, once it left the buffer
}

function draw() {
  frameAsked = false;
  lastFrame = performance.now();
  if (model === null) {
    $('status').textContent = status;
    return;
  }
  const snapshot = shownSnapshot();
  if (paused && snapshot !== null) shownStep = snapshot.step;
  // Every panel shows the end of the step drawn: events of a step still running wait for its record.
  const time = snapshot !== null ? snapshot.time : (model.now ?? 0);
  // The canvases first: each reads its width, and a read after the panels' HTML changed would make
  // the browser lay the page out there and then, and again before it paints.
  grid.draw(snapshot, model.numBlocks, model.numNullBlocks, index => model.byIndex.get(index)?.label ?? '?');
  const history = paused || model.idle || lastFrame - lastHistoryFrame >= HISTORY_FRAME_MS;
  if (history) {
    lastHistoryFrame = lastFrame;
    drawCharts(charts, model.series, time);
  } else {
    historySoon();
  }
  $('step').textContent = snapshot !== null ? snapshot.step : (model.step >= 0 ? model.step : '–');
  const state = model.idle ? 'idle' : 'running';
  $('status').textContent = paused ? `paused (the engine is at step ${model.step}, ${state})` : `${status}, ${state}`;
  const steps = model.steps;
  $('scrub').max = Math.max(0, steps.length - 1);
  $('scrub').value = snapshot !== null ? steps.indexOf(snapshot) : 0;
  $('buffer').textContent = steps.length ? `steps ${steps[0].step}-${steps.at(-1).step} buffered` : '';
  renderBatch($('running'), $('batch-summary'), snapshot, model);
  $('running-count').textContent = snapshot !== null ? snapshot.rows.length : 0;
  renderQueue($('waiting'), snapshot, model);
  $('waiting-count').textContent = snapshot !== null ? snapshot.queue.length : 0;
  if (history) renderRequests($('requests'), $('requests-summary'), model, time, selected);
  const r = model.requests.get(selected);
  const key = `${selected}:${r?.events.length}:${r?.state}`;
  if (key !== detailsKey) {
    detailsKey = key;
    $('detail-id').textContent = r ? r.label : '';
    renderDetails($('details'), model, selected);
  }
}

function pause(on) {
  paused = on;
  shownStep = on && model?.steps.length ? model.steps.at(-1).step : null;
  $('pause').textContent = on ? 'Follow live' : 'Pause';
  redraw();
}

function stepBy(delta) {
  if (model === null || !model.steps.length) return;
  if (!paused) pause(true);
  const i = model.steps.findIndex(s => s.step === shownStep);
  const next = Math.max(0, Math.min(model.steps.length - 1, (i < 0 ? 0 : i) + delta));
  shownStep = model.steps[next].step;
  redraw();
}

function askKey() {
  const dialog = $('key-dialog');
  dialog.showModal();
  return new Promise(resolve => dialog.addEventListener('close', () => resolve($('key-input').value), {once: true}));
}

$('pause').addEventListener('click', () => pause(!paused));
$('back').addEventListener('click', () => stepBy(-1));
$('forward').addEventListener('click', () => stepBy(1));
$('scrub').addEventListener('input', e => {
  if (model === null || !model.steps.length) return;
  if (!paused) pause(true);
  shownStep = model.steps[Number(e.target.value)].step;
  redraw();
});
document.addEventListener('keydown', e => {
  if (e.target.tagName === 'INPUT') return;
  if (e.key === ' ') pause(!paused);
  else if (e.key === 'ArrowLeft') stepBy(-1);
  else if (e.key === 'ArrowRight') stepBy(1);
  else return;
  e.preventDefault();
});
document.querySelector('main').addEventListener('click', e => {
  const target = e.target.closest('[data-id]');
  if (target !== null) {
    selected = target.dataset.id;
    lastHistoryFrame = -Infinity;  // the list shows the selection at once
    redraw();
  }
});
window.addEventListener('resize', () => { lastHistoryFrame = -Infinity; redraw(); });

follow('/v1/engine/events', onMessage, s => { status = s; redrawSoon(); }, askKey);
