// One work item of the AMX decode op (cpu_amx_decode.cpp) on the tile unit: one decode row's query
// heads (a "head tile") against the K/V the row owns, read in place from the paged cache through its
// block table.
//
// A tile is 16 rows of 64 bytes; TDPBF16PS adds A [M, 32] x B [32, N] (bf16, B "VNNI-packed": row r
// holds the pairs (2r, 2r + 1) of each column, one 32-bit word per column) into C [M, N] float32.
// A work item is one decode row and a "head tile": up to 16 of its query heads, whole KV-head groups.
// Its keys are met 64 at a time (a step):
//
//     S^T = K Q^T     [64 keys, heads]   A = 16 keys of the cache as they lie (a slot's rows of one KV
//                                         head are 64-byte runs, `slot_width` apart), B = Q^T packed
//                                         once per row. Heads of other KV heads are zero columns in B,
//                                         so the KV heads' products add up into one S^T tile per 16 keys.
//     P = softmax     [heads, 64 keys]   online, per head, over rows of S^T (a head per vector lane);
//                                         P is turned into A layout (16 x 16 transposes of key pairs)
//     O += P V        [heads, head_dim]  B = V packed per step into key pairs; per KV head, A holds
//                                         only that KV head's rows of P (the others stay zero).
//
// Nothing is gathered or packed per context, only per step, so a row's K and V are read from memory
// once. Keys outside [first, last) are masked to probability 0 and their values to 0 (a cache slot
// past a sequence's end may hold anything, NaN included).
//
// Where the time went, and what each part of the design bought, is in docs/perf-log.md: the tile unit
// runs beside the vector units, so the steps are pipelined (RowAttention::run); the next steps' cache
// lines are prefetched a few at a time between this step's loads; work items go longest first.
//
// Only cpu_amx_decode.cpp includes this file: the two are one translation unit (hence the unnamed
// namespace), built by cpu_amx_decode.py with -mamx-tile -mamx-bf16 -mavx512bf16; ninja rebuilds it
// when either changes.

#pragma once

#include <c10/util/BFloat16.h>

#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>

namespace {

using bf16 = c10::BFloat16;
constexpr int kRows = 16;                 // rows of a tile: keys of a chunk, heads of a head tile
constexpr int kChunks = 4;                // 16-key chunks per step (an S^T tile each)
constexpr int kStep = kChunks * kRows;    // keys per step
constexpr int kPairTiles = kStep / (2 * kRows);  // 32-key A tiles of P per step
constexpr int kTileDims = 32;             // bf16 values in a 64-byte tile row
constexpr int kMaxHeadDim = 256;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Linux hands out the tile registers' state only on request, once per process.
bool request_amx() {
  constexpr int kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  static const bool granted = syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  return granted;
}

// Every tile used here is 16 rows of 64 bytes. For S^T: tmm0, tmm5 and tmm6 take keys (A), tmm1 Q^T
// (B), and tmm2, tmm3, tmm4 and tmm7 the scores of a step's four chunks. For P V: tmm0 takes P (A),
// tmm1, tmm5 and tmm6 values (B), and tmm2, tmm3, tmm4 and tmm7 four 16-column slices of the product.
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
  TileConfig() {
    for (int t = 0; t < 8; ++t) colsb[t] = 64, rows[t] = kRows;
  }
};

// One thread's working memory, 64-byte aligned (tile loads and stores of aligned rows).
struct alignas(64) Scratch {
  uint32_t q_t[16][kMaxHeadDim / kTileDims][kRows][kRows];  // per KV head of the tile, per 32 dims: B = Q^T
  uint32_t p[16][kPairTiles][kRows][kRows];                // per KV head, 32 keys: A = its heads' rows of P
  uint32_t v[16][kPairTiles][kMaxHeadDim / kRows][kRows][kRows];  // per KV head, 32 keys, 16 dims: B = V
  float s_t[kStep][kRows];                                 // S^T of a step, a head per column
  float pv[kMaxHeadDim / kRows][kRows][kRows];             // P V of a step, per 16 dims: [head][dim]
  float acc[kRows][kMaxHeadDim];                           // O, unnormalised
};

// exp(x) for lanes that are -inf or at most 0 after the max is taken off: 2^n * p(f) (degree-5
// polynomial), exact enough for probabilities rounded to bf16; -inf and below 2^-126 give 0.
inline __m512 exp2_lanes(__m512 t) {
  const __m512 floor_t = _mm512_set1_ps(-126.f);
  const __mmask16 visible = _mm512_cmp_ps_mask(t, floor_t, _CMP_GT_OQ);
  const __m512 tc = _mm512_max_ps(t, floor_t);
  const __m512 n = _mm512_roundscale_ps(tc, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(tc, n);
  __m512 p = _mm512_set1_ps(1.3333558e-3f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6181291e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5504109e-2f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022651e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f));
  return _mm512_maskz_scalef_ps(visible, p, n);
}

// In place: row i of the 16 x 16 matrix of 32-bit words `m` becomes its column i.
inline void transpose_16x16(__m512i (&m)[16]) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(m[i], m[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(m[i], m[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    m[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    m[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    m[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    m[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  // Each 128-bit lane j of m[4a + b] now holds rows 4a .. 4a + 3 of column 4j + b (for a's 4 rows).
  for (int i = 0; i < 4; ++i) {
    const __m512i x0 = _mm512_shuffle_i32x4(m[i], m[i + 4], 0x88), x1 = _mm512_shuffle_i32x4(m[i], m[i + 4], 0xdd);
    const __m512i x2 = _mm512_shuffle_i32x4(m[i + 8], m[i + 12], 0x88),
                  x3 = _mm512_shuffle_i32x4(m[i + 8], m[i + 12], 0xdd);
    t[i] = _mm512_shuffle_i32x4(x0, x2, 0x88);
    t[i + 8] = _mm512_shuffle_i32x4(x0, x2, 0xdd);
    t[i + 4] = _mm512_shuffle_i32x4(x1, x3, 0x88);
    t[i + 12] = _mm512_shuffle_i32x4(x1, x3, 0xdd);
  }
  for (int i = 0; i < 16; ++i) m[i] = t[i];
}

// The geometry of one op call, shared by its work items.
struct Layout {
  const bf16 *key_cache, *value_cache;
  int block_size, head_dim, slot_width, group, kv_per_tile;  // kv_per_tile KV heads (their groups) per item
};

// Keys of one KV head, positions [pos, pos + 16) of a cache block, as the rows of an A tile.
inline const bf16* chunk_rows(const bf16* cache, const Layout& l, const int32_t* blocks, int64_t pos, int kv_head) {
  const int64_t block = blocks[pos / l.block_size];
  return cache + (block * l.block_size + pos % l.block_size) * l.slot_width + kv_head * l.head_dim;
}

// S^T rows of chunk j (tile 2, 3, 4 or 7) += the chunk's keys (A, through tile 0, 5 or 6) x Q^T (B, in
// tile 1). Tile numbers are part of the instruction, hence the switch.
inline void qk_chunk(int j, const bf16* keys, int64_t row_stride) {
  switch (j) {
    case 0: _tile_loadd(0, keys, row_stride); _tile_dpbf16ps(2, 0, 1); break;
    case 1: _tile_loadd(5, keys, row_stride); _tile_dpbf16ps(3, 5, 1); break;
    case 2: _tile_loadd(6, keys, row_stride); _tile_dpbf16ps(4, 6, 1); break;
    default: _tile_loadd(0, keys, row_stride); _tile_dpbf16ps(7, 0, 1); break;
  }
}

// vpermt2w indices: the words of two rows a and b, interleaved as (a[j], b[j]) pairs.
alignas(64) const uint16_t kInterleaveLo[32] = {0, 32, 1, 33, 2, 34, 3, 35, 4, 36, 5, 37, 6, 38, 7, 39,
                                                8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
alignas(64) const uint16_t kInterleaveHi[32] = {16, 48, 17, 49, 18, 50, 19, 51, 20, 52, 21, 53, 22, 54, 23, 55,
                                                24, 56, 25, 57, 26, 58, 27, 59, 28, 60, 29, 61, 30, 62, 31, 63};
// vpermw indices: [a as bf16 | b as bf16] into (a[h], b[h]) words.
alignas(64) const uint16_t kPairWords[32] = {0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23,
                                             8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};

// A work item's keys: positions [first, last) of the request with these cache blocks, KV heads from kv0
// on. Its steps of kStep keys start at the 16-key chunk that holds `first`.
struct Keys {
  const int32_t* blocks;
  int64_t first, last;
  int kv0;
  int64_t start() const { return first / kRows * kRows; }
  int64_t end() const { return start() + (last - start() + kStep - 1) / kStep * kStep; }  // past the last step
};

// Attention of one decode row's heads [kv0 * group, (kv0 + kv_per_tile) * group) over its keys, a step of
// kStep keys at a time. The tile unit runs beside the vector units, so `run` pipelines the
// steps: the scores of step i + 1 are multiplied while the vector units pack step i's values and
// take its softmax, and step i's P V is folded into O while step i + 1 goes on.
class RowAttention {
 public:
  // `following`: the thread's next work item, whose first steps are prefetched during this one's last.
  RowAttention(const Layout& l, const bf16* query, const Keys& keys, const Keys* following, float scale, Scratch& s)
      : l_(l), keys_(keys),
        following_(following), heads_(l.kv_per_tile * l.group),
        row_stride_(l.slot_width * sizeof(bf16)), to_log2_(_mm512_set1_ps(scale * 1.4426950408889634f)), s_(s) {
    // B = Q^T per KV head g: word (r, h) of its tile c holds dims (32c + 2r, 32c + 2r + 1) of head h
    // if head h reads KV head g, else 0. A = P per KV head: the rows of other heads stay 0.
    std::memset(s.q_t, 0, sizeof(s.q_t[0]) * l.kv_per_tile);
    std::memset(s.p, 0, sizeof(s.p[0]) * l.kv_per_tile);
    for (int h = 0; h < heads_; ++h) {
      const auto* q = reinterpret_cast<const uint32_t*>(query + h * l.head_dim);
      for (int c = 0; c < l.head_dim / kTileDims; ++c)
        for (int r = 0; r < kRows; ++r) s.q_t[h / l.group][c][r][h] = q[c * kRows + r];
    }
    for (int h = 0; h < heads_; ++h) std::fill(s.acc[h], s.acc[h] + l.head_dim, 0.f);
  }

  void run(bf16* out) {
    const int64_t start = keys_.start();
    multiply_scores(start);
    store_scores(start);
    __m512 alpha = _mm512_setzero_ps();
    for (int64_t step = start; step < keys_.last; step += kStep) {
      const int64_t next = step + kStep;
      if (next < keys_.last) multiply_scores(next);  // into the S^T tiles, already stored for this step
      if (step != start) add_values(alpha);      // the last step's P V, stored by now
      pack_values(step);
      alpha = softmax(step);
      if (next < keys_.last) store_scores(next);
      multiply_values(step);
    }
    add_values(alpha);
    alignas(64) float sums[kRows];
    _mm512_store_ps(sums, sum_);
    for (int h = 0; h < heads_; ++h) {
      const float inv = 1.f / sums[h];
      for (int d = 0; d < l_.head_dim; ++d) out[h * l_.head_dim + d] = static_cast<bf16>(s_.acc[h][d] * inv);
    }
  }

 private:
  int chunks(int64_t step) const { return std::min<int64_t>(kChunks, (keys_.last - step + kRows - 1) / kRows); }
  int pair_tiles(int64_t step) const { return (chunks(step) + 1) / 2; }  // 32-key tiles with any key in them
  bool visible(int64_t pos) const { return pos >= keys_.first && pos < keys_.last; }
  const bf16* rows(const bf16* cache, int64_t pos, int g) const {
    return chunk_rows(cache, l_, keys_.blocks, pos, keys_.kv0 + g);
  }

  // The rows of chunk j of the step `steps` after `step`, of KV head g, as bytes to prefetch: past this
  // item's last step, the steps go on into the following item's; nullptr past both.
  const char* ahead(const bf16* cache, int64_t step, int steps, int j, int g) const {
    int64_t pos = step + steps * kStep + j * kRows;
    const Keys* keys = &keys_;
    if (pos >= keys_.end() && following_) {
      keys = following_;
      pos = following_->start() + (pos - keys_.end());
    }
    if (pos >= keys->last || (keys == &keys_ && pos >= keys_.end())) return nullptr;
    return reinterpret_cast<const char*>(chunk_rows(cache, l_, keys->blocks, pos, keys->kv0 + g));
  }

  // S^T = K Q^T, a tile per 16-key chunk, every KV head's product into the same tile; the chunks'
  // products alternate, so that each waits less on the one before it.
  void multiply_scores(int64_t step) {
    _tile_zero(2);
    _tile_zero(3);
    _tile_zero(4);
    _tile_zero(7);
    for (int g = 0; g < l_.kv_per_tile; ++g)
      for (int t = 0; t < l_.head_dim / kTileDims; ++t) {
        _tile_loadd(1, s_.q_t[g][t], 64);
        for (int j = 0; j < chunks(step); ++j)
          qk_chunk(j, rows(l_.key_cache, step + j * kRows, g) + t * kTileDims, row_stride_);
      }
  }

  void store_scores(int64_t step) {
    const int n = chunks(step);
    _tile_stored(2, s_.s_t[0], 64);
    if (n > 1) _tile_stored(3, s_.s_t[kRows], 64);
    if (n > 2) _tile_stored(4, s_.s_t[2 * kRows], 64);
    if (n > 3) _tile_stored(7, s_.s_t[3 * kRows], 64);
  }

  // V in key pairs, per KV head, 32 keys and 16 dims: row i of a tile holds keys (2i, 2i + 1). Keys
  // outside [first, last) are zeros. The next step's keys and values, whose blocks may lie anywhere in
  // the cache, are asked for (into L2) from here, a few lines between each of this step's loads
  // rather than all at once.
  void pack_values(int64_t step) {
    const __m512i lo_idx = _mm512_load_si512(kInterleaveLo), hi_idx = _mm512_load_si512(kInterleaveHi);
    const int n = chunks(step);
    for (int j = 0; j < 2 * pair_tiles(step); ++j)
      for (int g = 0; g < l_.kv_per_tile; ++g) {
        const bf16* v = j < n ? rows(l_.value_cache, step + j * kRows, g) : nullptr;
        // Keys two steps ahead (the next step's are being multiplied already), values one.
        const char* ahead_k = ahead(l_.key_cache, step, 2, j, g);
        const char* ahead_v = ahead(l_.value_cache, step, 1, j, g);
        auto* tiles = s_.v[g][j / 2];
        for (int i = 0; i < kRows / 2; ++i) {
          const int64_t pos = step + j * kRows + 2 * i;
          const bool a_in = v && visible(pos), b_in = v && visible(pos + 1);
          const int row = (j % 2) * kRows / 2 + i;
          for (int d = 0; d < l_.head_dim; d += kTileDims) {
            for (const char* lines : {ahead_k, ahead_v})
              if (lines) {
                _mm_prefetch(lines + 2 * i * row_stride_ + 2 * d, _MM_HINT_T1);
                _mm_prefetch(lines + (2 * i + 1) * row_stride_ + 2 * d, _MM_HINT_T1);
              }
            const __m512i a = a_in ? _mm512_loadu_si512(v + 2 * i * l_.slot_width + d) : _mm512_setzero_si512();
            const __m512i b = b_in ? _mm512_loadu_si512(v + (2 * i + 1) * l_.slot_width + d) : _mm512_setzero_si512();
            _mm512_store_si512(tiles[d / kRows][row], _mm512_permutex2var_epi16(a, lo_idx, b));
            _mm512_store_si512(tiles[d / kRows + 1][row], _mm512_permutex2var_epi16(a, hi_idx, b));
          }
        }
      }
  }

  // The online softmax of a step's scores, a head per lane (keys outside [first, last) are -inf):
  // P into the A tiles of each KV head, the running max and sum updated. Returns what O must be
  // scaled by before this step's P V is added (0 at the first step).
  __m512 softmax(int64_t step) {
    const __m512i pair_idx = _mm512_load_si512(kPairWords);
    const int n = chunks(step) * kRows;
    auto scores = [&](int k) {
      return k < n && visible(step + k) ? _mm512_load_ps(s_.s_t[k]) : _mm512_set1_ps(kNegInf);
    };
    __m512 step_max = _mm512_set1_ps(kNegInf);
    for (int k = 0; k < n; ++k) step_max = _mm512_max_ps(step_max, scores(k));
    const __m512 new_max = _mm512_max_ps(max_, step_max);
    const __m512 shift = _mm512_mul_ps(new_max, to_log2_);
    const __m512 alpha = exp2_lanes(_mm512_sub_ps(_mm512_mul_ps(max_, to_log2_), shift));
    max_ = new_max;
    __m512 step_sum = _mm512_setzero_ps();
    for (int t = 0; t < pair_tiles(step); ++t) {
      __m512i pairs[kRows];  // word h of pairs[i]: the bf16 probabilities of keys 2i and 2i + 1 for head h
      for (int i = 0; i < kRows; ++i) {
        const int k = t * 2 * kRows + 2 * i;
        const __m512 e0 = exp2_lanes(_mm512_fmsub_ps(scores(k), to_log2_, shift));
        const __m512 e1 = exp2_lanes(_mm512_fmsub_ps(scores(k + 1), to_log2_, shift));
        step_sum = _mm512_add_ps(step_sum, _mm512_add_ps(e0, e1));
        pairs[i] = _mm512_permutexvar_epi16(pair_idx, (__m512i)_mm512_cvtne2ps_pbh(e1, e0));
      }
      transpose_16x16(pairs);  // pairs[h]: head h's 16 key pairs, a row of A
      for (int h = 0; h < heads_; ++h) _mm512_store_si512(s_.p[h / l_.group][t][h], pairs[h]);
    }
    sum_ = _mm512_fmadd_ps(sum_, alpha, step_sum);
    return alpha;
  }

  // P V, 16 dims a tile (2, 3, 4 and 7 take four slices at once), every KV head's product into the
  // same tile; stored into s.pv.
  void multiply_values(int64_t step) {
    for (int d0 = 0; d0 < l_.head_dim / kRows; d0 += 4) {
      _tile_zero(2);
      _tile_zero(3);
      _tile_zero(4);
      _tile_zero(7);
      for (int g = 0; g < l_.kv_per_tile; ++g)
        for (int t = 0; t < pair_tiles(step); ++t) {
          _tile_loadd(0, s_.p[g][t], 64);
          _tile_loadd(1, s_.v[g][t][d0], 64);
          _tile_dpbf16ps(2, 0, 1);
          _tile_loadd(5, s_.v[g][t][d0 + 1], 64);
          _tile_dpbf16ps(3, 0, 5);
          _tile_loadd(6, s_.v[g][t][d0 + 2], 64);
          _tile_dpbf16ps(4, 0, 6);
          _tile_loadd(1, s_.v[g][t][d0 + 3], 64);
          _tile_dpbf16ps(7, 0, 1);
        }
      _tile_stored(2, s_.pv[d0], 64);
      _tile_stored(3, s_.pv[d0 + 1], 64);
      _tile_stored(4, s_.pv[d0 + 2], 64);
      _tile_stored(7, s_.pv[d0 + 3], 64);
    }
  }

  // O = O * alpha + P V.
  void add_values(__m512 alpha) {
    alignas(64) float alphas[kRows];
    _mm512_store_ps(alphas, alpha);
    for (int h = 0; h < heads_; ++h) {
      const __m512 a = _mm512_set1_ps(alphas[h]);
      for (int d = 0; d < l_.head_dim / kRows; ++d) {
        float* o = s_.acc[h] + d * kRows;
        _mm512_storeu_ps(o, _mm512_fmadd_ps(_mm512_loadu_ps(o), a, _mm512_load_ps(s_.pv[d][h])));
      }
    }
  }

  const Layout& l_;
  const Keys& keys_;
  const Keys* following_;
  const int heads_;
  const int64_t row_stride_;
  const __m512 to_log2_;
  Scratch& s_;
  __m512 max_ = _mm512_set1_ps(kNegInf), sum_ = _mm512_setzero_ps();
};

}  // namespace
