// The KV block grid: every block of the cache, by id, row by row, in one canvas (2,000 blocks are
// 2,000 rectangles: no DOM element each). A block held by a request takes the request's colour; held
// by several (shared through the prefix cache) it is hatched; free it is grey, or pale blue when the
// prefix cache can still find it by its hash; the null block (block 0, never held nor free) is dark.
// The cells shrink to keep the grid near GRID_HEIGHT pixels tall, and show their block ids when they
// are big enough to read.

import {CACHED_FREE, FREE, NULL_BLOCK, requestColour} from './colours.js';

const GRID_HEIGHT = 280;
const MIN_CELL = 5;
const MAX_CELL = 30;
const LABELLED_CELL = 24;

export class KVGrid {
  constructor(canvas, legend, tooltip) {
    this.canvas = canvas;
    this.legend = legend;
    this.tooltip = tooltip;
    this.layout = null;
    this.painted = [];  // per block, what its cell shows now: only the cells that change are painted again
    this.legendText = '';
    this.numbers = undefined;  // the legend's number elements, once written (showLegend)
    this.shown = null;
    this.hatch = null;
    canvas.addEventListener('mousemove', e => this.hover(e));
    canvas.addEventListener('mouseleave', () => { this.tooltip.hidden = true; });
  }

  // The canvas is sized (which clears it) only when the layout changes; a block's cell is painted
  // again only when what it shows changes. A step changes a few blocks of thousands.
  draw(snapshot, numBlocks, numNullBlocks, labelOf) {
    this.shown = {snapshot, labelOf, numNullBlocks};
    const width = Math.max(200, this.canvas.clientWidth);
    const cell = Math.max(MIN_CELL, Math.min(MAX_CELL, Math.floor(Math.sqrt(width * GRID_HEIGHT / Math.max(1, numBlocks)))));
    const cols = Math.max(1, Math.floor(width / cell));
    const ratio = window.devicePixelRatio || 1;
    const ctx = this.canvas.getContext('2d');
    const l = this.layout;
    if (l === null || l.width !== width || l.cell !== cell || l.numBlocks !== numBlocks || l.ratio !== ratio) {
      const rows = Math.ceil(numBlocks / cols);
      this.layout = {width, cell, cols, numBlocks, ratio};
      this.painted = new Array(numBlocks).fill(null);
      this.canvas.style.height = `${rows * cell}px`;
      this.canvas.width = Math.round(width * ratio);
      this.canvas.height = Math.round(rows * cell * ratio);
      ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    }
    const gap = cell >= 8 ? 1 : 0;
    const counts = {inUse: 0, shared: 0, cachedFree: 0, free: 0, null: 0};
    const {owner, refs, cached} = snapshot ?? {};
    for (let b = 0; b < numBlocks; b++) {
      const held = refs ? refs[b] : 0;
      const isNull = b < numNullBlocks;
      if (held > 0) counts.inUse++;
      else if (isNull) counts.null++;
      else if (cached && cached[b]) counts.cachedFree++;
      else counts.free++;
      if (held > 1) counts.shared++;
      const fill = held > 0 ? requestColour(owner[b])
        : (isNull ? NULL_BLOCK : (cached && cached[b] ? CACHED_FREE : FREE));
      const look = held > 1 ? `${fill}/` : fill;
      if (this.painted[b] === look) continue;
      this.painted[b] = look;
      const x = (b % cols) * cell;
      const y = Math.floor(b / cols) * cell;
      ctx.clearRect(x, y, cell, cell);
      ctx.fillStyle = fill;
      ctx.fillRect(x, y, cell - gap, cell - gap);
      if (held > 1) {
        ctx.fillStyle = this.hatchPattern(ctx);
        ctx.fillRect(x, y, cell - gap, cell - gap);
      }
      if (cell >= LABELLED_CELL) {
        ctx.fillStyle = held > 0 || isNull ? '#fff' : '#555';
        ctx.font = `${Math.floor(cell * 0.4)}px system-ui, sans-serif`;
        ctx.textAlign = 'center';
        ctx.textBaseline = 'middle';
        ctx.fillText(String(b), x + (cell - gap) / 2, y + (cell - gap) / 2);
      }
    }
    this.showLegend(counts, snapshot?.unplaced ?? 0, numBlocks);
  }

  hatchPattern(ctx) {
    if (this.hatch === null) {
      const tile = document.createElement('canvas');
      tile.width = tile.height = 6;
      const t = tile.getContext('2d');
      t.strokeStyle = 'rgba(0, 0, 0, 0.55)';
      t.lineWidth = 1.5;
      t.beginPath();
      t.moveTo(0, 6); t.lineTo(6, 0);
      t.moveTo(-1, 1); t.lineTo(1, -1);
      t.moveTo(5, 7); t.lineTo(7, 5);
      t.stroke();
      this.hatch = ctx.createPattern(tile, 'repeat');
    }
    return this.hatch;
  }

  showLegend(counts, unplaced, numBlocks) {
    // The legend's words are written once; then only its numbers, where they changed.
    const text = `${counts.inUse} ${counts.shared} ${counts.cachedFree} ${counts.free} ${counts.null} ${unplaced} `
      + `${numBlocks}`;
    if (text === this.legendText) return;
    this.legendText = text;
    const d = this.legend.dataset;
    d.inUse = counts.inUse;
    d.shared = counts.shared;
    d.cachedFree = counts.cachedFree;
    d.free = counts.free;
    d.null = counts.null;
    d.unplaced = unplaced;
    if (this.numbers === undefined) {
      const swatch = (cls, [before, after], name) => `<span class="key">${cls ? `<i class="${cls}"></i>` : ''}`
        + `${before}<span data-n="${name}"></span>${after}</span>`;
      this.legend.innerHTML = [
        swatch('owned', ['in use: ', ', coloured by request'], 'inUse'),
        swatch('shared', ['shared through the prefix cache: ', ''], 'shared'),
        swatch('cached', ['free, still cached (a later prompt with the same prefix reuses it): ', ''], 'cachedFree'),
        swatch('free', ['free: ', ''], 'free'),
        swatch('null', ['null block (holds no KV): ', ''], 'null'),
        swatch('', ['+ ', ' in use by the engine\'s count, whose allocation the page did not hear (not placed)'], 'unplaced'),
      ].join('');
      this.numbers = Object.fromEntries([...this.legend.querySelectorAll('[data-n]')].map(e => [e.dataset.n, e]));
    }
    const shown = {inUse: `${counts.inUse} of ${numBlocks - counts.null}`, shared: counts.shared,
                   cachedFree: counts.cachedFree, free: counts.free, null: counts.null, unplaced};
    for (const [name, value] of Object.entries(shown)) {
      const element = this.numbers[name];
      if (element.textContent !== String(value)) element.textContent = value;
    }
    this.numbers.unplaced.parentElement.hidden = !unplaced;
    this.numbers.null.parentElement.hidden = !counts.null;
  }

  hover(e) {
    if (this.layout === null || this.shown?.snapshot == null) return;
    const {cell, cols, numBlocks} = this.layout;
    const rect = this.canvas.getBoundingClientRect();
    const col = Math.floor((e.clientX - rect.left) / cell);
    const b = Math.floor((e.clientY - rect.top) / cell) * cols + col;
    if (col >= cols || b < 0 || b >= numBlocks) {
      this.tooltip.hidden = true;
      return;
    }
    const {snapshot, labelOf, numNullBlocks} = this.shown;
    const held = snapshot.refs[b];
    let text = `block ${b}: `;
    if (b < numNullBlocks) text += 'the null block (stands for "no block" in block tables; never holds KV)';
    else if (held === 0) text += snapshot.cached[b] ? 'free, cached (its hash can still be found)' : 'free';
    else {
      text += `held by ${labelOf(snapshot.owner[b])}`;
      if (held > 1) text += ` and ${held - 1} more (shared prefix)`;
      if (snapshot.cached[b]) text += '; full and cached';
    }
    this.tooltip.textContent = text;
    this.tooltip.hidden = false;
    this.tooltip.style.left = `${e.clientX + 12}px`;
    this.tooltip.style.top = `${e.clientY + 12}px`;
  }
}
