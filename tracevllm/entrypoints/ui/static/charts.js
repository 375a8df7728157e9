// Three line charts over the last minute of the engine's clock (a recorded run keeps its own):
// throughput (prefill and decode tokens per second, in one-second bins), KV cache usage, and the
// queues (running and waiting requests after each step). Plain canvas: an axis, a few labels, lines.

import {PHASE} from './colours.js';
import {SERIES_SECONDS} from './model.js';

const PAD = {left: 44, right: 8, top: 18, bottom: 18};

export function drawCharts(canvases, series, now) {
  const recent = series.filter(p => p.time > now - SERIES_SECONDS && p.time <= now);
  const bins = throughputBins(recent, now);
  drawChart(canvases.throughput, now, [
    {label: 'prefill', colour: PHASE.prefill, points: bins.map(b => [b.time, b.prefill])},
    {label: 'decode', colour: PHASE.decode, points: bins.map(b => [b.time, b.decode])},
  ]);
  drawChart(canvases.usage, now, [
    {label: 'KV cache usage', colour: '#7a4fd0', points: recent.map(p => [p.time, 100 * p.usage])},
  ], 100);
  drawChart(canvases.queues, now, [
    {label: 'running', colour: PHASE.decode, points: recent.map(p => [p.time, p.running])},
    {label: 'waiting', colour: PHASE.queued, points: recent.map(p => [p.time, p.waiting])},
  ]);
}

function throughputBins(points, now) {
  // Each step's tokens, counted in the second it ended in: one bin per second of the window.
  const bins = Array.from({length: SERIES_SECONDS}, (_, i) => ({time: now - SERIES_SECONDS + i + 1, prefill: 0, decode: 0}));
  for (const p of points) {
    const i = Math.min(SERIES_SECONDS - 1, Math.floor(p.time - (now - SERIES_SECONDS)));
    if (i >= 0) {
      bins[i].prefill += p.prefill;
      bins[i].decode += p.decode;
    }
  }
  const first = points.length ? points[0].time : now;
  return bins.filter(b => b.time >= first);  // no zeros before the page saw the first step
}

function drawChart(canvas, now, lines, fixedMax) {
  const ratio = window.devicePixelRatio || 1;
  const width = Math.max(160, canvas.clientWidth);
  const height = Math.max(100, canvas.clientHeight);
  canvas.width = Math.round(width * ratio);
  canvas.height = Math.round(height * ratio);
  const ctx = canvas.getContext('2d');
  ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
  ctx.clearRect(0, 0, width, height);
  const top = fixedMax ?? niceMax(Math.max(1, ...lines.flatMap(l => l.points.map(p => p[1]))));
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
  ctx.textAlign = 'center';
  ctx.textBaseline = 'top';
  for (const s of [SERIES_SECONDS, SERIES_SECONDS / 2, 0]) {
    ctx.fillText(s ? `-${s} s` : 'now', x(now - s), height - PAD.bottom + 3);
  }
  ctx.textAlign = 'left';
  let legendX = PAD.left + 4;
  for (const line of lines) {
    ctx.strokeStyle = line.colour;
    ctx.lineWidth = 1.6;
    ctx.beginPath();
    line.points.forEach(([t, v], i) => (i ? ctx.lineTo(x(t), y(v)) : ctx.moveTo(x(t), y(v))));
    ctx.stroke();
    ctx.fillStyle = line.colour;
    ctx.fillText(line.label, legendX, 2);
    legendX += ctx.measureText(line.label).width + 12;
  }
}

function niceMax(value) {
  const step = 10 ** Math.floor(Math.log10(value));
  return [1, 2, 5, 10].map(m => m * step).find(m => m >= value);
}

function formatNumber(v) {
  return v >= 1000 ? `${(v / 1000).toFixed(v >= 10000 ? 0 : 1)}k` : `${Math.round(v * 10) / 10}`;
}
