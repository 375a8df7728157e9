// Three charts over the last minute of the engine's clock (a recorded run keeps its own): the
// throughput (prefill and decode tokens in each second, stacked bars), the KV cache usage, and the
// queues (running and waiting requests after each step, lines). Plain canvas: axes, labels, marks.

import {PHASE, WAITING} from './colours.js';
import {SERIES_SECONDS} from './model.js';

const PAD = {left: 44, right: 10, top: 18, bottom: 18};

export function drawCharts(canvases, series, now) {
  const recent = series.filter(p => p.time > now - SERIES_SECONDS && p.time <= now);
  drawThroughput(canvases.throughput, recent, now);
  drawLines(canvases.usage, now, [
    {label: 'KV cache usage', colour: '#7a4fd0', points: recent.map(p => [p.time, 100 * p.usage])},
  ], 100);
  drawLines(canvases.queues, now, [
    {label: 'running', colour: PHASE.decode, points: recent.map(p => [p.time, p.running])},
    {label: 'waiting', colour: WAITING, points: recent.map(p => [p.time, p.waiting])},
  ]);
}

function drawThroughput(canvas, points, now) {
  // Each step's tokens, counted in the whole second of the engine's clock it ended in (the last
  // bar, the second now running, is still growing).
  const bins = new Map();
  for (const p of points) {
    const second = Math.floor(p.time);
    const bin = bins.get(second) ?? {prefill: 0, decode: 0};
    bin.prefill += p.prefill;
    bin.decode += p.decode;
    bins.set(second, bin);
  }
  const top = niceMax(Math.max(1, ...[...bins.values()].map(b => b.prefill + b.decode)));
  const {ctx, x, y} = axes(canvas, now, top, [['decode', PHASE.decode], ['prefill', PHASE.prefill]]);
  for (const [second, bin] of bins) {
    const left = Math.max(x(second), x(now - SERIES_SECONDS));
    const width = Math.max(1, x(Math.min(second + 1, now)) - left - 1);
    ctx.fillStyle = PHASE.decode;
    ctx.fillRect(left, y(bin.decode), width, y(0) - y(bin.decode));
    ctx.fillStyle = PHASE.prefill;
    ctx.fillRect(left, y(bin.decode + bin.prefill), width, y(bin.decode) - y(bin.decode + bin.prefill));
  }
}

function drawLines(canvas, now, lines, fixedMax) {
  const top = fixedMax ?? niceMax(Math.max(1, ...lines.flatMap(l => l.points.map(p => p[1]))));
  const {ctx, x, y} = axes(canvas, now, top, lines.map(l => [l.label, l.colour]));
  for (const line of lines) {
    ctx.strokeStyle = ctx.fillStyle = line.colour;
    ctx.lineWidth = 1.6;
    ctx.beginPath();
    line.points.forEach(([t, v], i) => (i ? ctx.lineTo(x(t), y(v)) : ctx.moveTo(x(t), y(v))));
    ctx.stroke();
    if (line.points.length === 1) ctx.fillRect(x(line.points[0][0]) - 2, y(line.points[0][1]) - 2, 4, 4);
  }
}

export function clearedContext(canvas, width, height, ratio) {
  // The canvas, blank, drawn in CSS pixels. Sizing a canvas allocates it anew: only when its size
  // changes; else it is cleared.
  const ctx = canvas.getContext('2d');
  const w = Math.round(width * ratio);
  const h = Math.round(height * ratio);
  if (canvas.width !== w || canvas.height !== h) {
    canvas.width = w;
    canvas.height = h;
  } else {
    ctx.setTransform(1, 0, 0, 1, 0, 0);
    ctx.clearRect(0, 0, w, h);
  }
  ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
  return ctx;
}

function axes(canvas, now, top, legend) {
  // A cleared canvas with the value axis (0, half, top), the time axis (-60 s .. now) and a legend;
  // returns the context and the scales.
  const ratio = window.devicePixelRatio || 1;
  const width = Math.max(160, canvas.clientWidth);
  const height = Math.max(100, canvas.clientHeight);
  const ctx = clearedContext(canvas, width, height, ratio);
  const x = t => PAD.left + (width - PAD.left - PAD.right) * (1 - (now - t) / SERIES_SECONDS);
  const y = v => height - PAD.bottom - (height - PAD.top - PAD.bottom) * (v / top);
  ctx.font = '11px system-ui, sans-serif';
  ctx.fillStyle = '#666';
  ctx.strokeStyle = '#ddd';
  ctx.lineWidth = 1;
  ctx.textAlign = 'right';
  ctx.textBaseline = 'middle';
  for (const v of [0, top / 2, top]) {
    ctx.beginPath();
    ctx.moveTo(PAD.left, y(v));
    ctx.lineTo(width - PAD.right, y(v));
    ctx.stroke();
    ctx.fillText(formatNumber(v), PAD.left - 4, y(v));
  }
  ctx.textBaseline = 'top';
  for (const [s, align] of [[SERIES_SECONDS, 'left'], [SERIES_SECONDS / 2, 'center'], [0, 'right']]) {
    ctx.textAlign = align;
    ctx.fillText(s ? `-${s} s` : 'now', x(now - s), height - PAD.bottom + 3);
  }
  ctx.textAlign = 'left';
  let legendX = PAD.left + 4;
  for (const [label, colour] of legend) {
    ctx.fillStyle = colour;
    ctx.fillText(label, legendX, 2);
    legendX += ctx.measureText(label).width + 12;
  }
  return {ctx, x, y};
}

function niceMax(value) {
  const step = 10 ** Math.floor(Math.log10(value));
  return [1, 2, 5, 10].map(m => m * step).find(m => m >= value);
}

function formatNumber(v) {
  return v >= 1000 ? `${(v / 1000).toFixed(v >= 10000 ? 0 : 1)}k` : `${Math.round(v * 10) / 10}`;
}
