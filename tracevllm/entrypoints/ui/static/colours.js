// The page's colours. A request's colour follows its arrival number (#i): consecutive requests are
// far apart on the colour wheel (the golden angle), at two lightnesses, so neighbours in the batch
// and in the KV grid stay apart. The phases and block states have colours of their own, greys and a
// pale blue that no request takes; the phases' are the figures' and the report's (viz/palette.py,
// served as /ui/palette.js).

import {FREE_BLOCK, PHASE, WAITING} from '../palette.js';

export {PHASE, WAITING};

export function requestColour(index) {
  if (index < 0) return UNKNOWN;
  const hue = (index * 137.508) % 360;
  return `hsl(${hue.toFixed(1)}, 62%, ${index % 2 ? 42 : 56}%)`;
}

export const UNKNOWN = '#9a9a9a';  // a request the page no longer (or never) knew
export const FREE = FREE_BLOCK;
export const NULL_BLOCK = '#555';  // block 0, vLLM's null block: never held, never free
export const CACHED_FREE = '#bcd3e6';  // free, but still findable by its hash: the prefix cache
