// Prefill attention on CPU with AMX tiles, or with AVX512-BF16 dot products where there are no tiles:
// every prefill row's query tokens against the keys they may see (causal, optionally a sliding
// window), K/V read through the block table from the paged cache.
//
// Built at first use by torch.utils.cpp_extension (cpu_amx_prefill.py) and registered as
// torch.ops.tracevllm.prefill_attention. The plain-PyTorch version of the same computation is
// TorchAttentionImpl._prefill: the K/V (gathered from the cache when there is a context), then SDPA.
//
// It is a flash attention. A work item is one block of up to kBlock query tokens of one request,
// for all the query heads that share one KV head (their rows stacked: group * kBlock rows). It meets
// the keys kStepKeys at a time. Both matrix products run on AMX tiles through torch's own
// batch-reduce GEMM (at::native::cpublas::brgemm, oneDNN's micro-kernel; bf16 in, float32 out):
//
//     S = Q K^T              [rows, kStepKeys] float32
//     P = exp(S - max)       [rows, kStepKeys] bf16    (online softmax per row, in float32)
//     O = O * alpha + P V    [rows, head_dim] float32  (the accumulator, rescaled when a max grows)
//
// On a CPU with AVX512-BF16 but no AMX (AMD Zen 4, Intel Cooper Lake), `amx` false, the same two
// products run on dot_product_gemm instead: the same inputs, on vdpbf16ps, 16 float32 lanes at a time.
//
// AMX wants its right-hand matrix "VNNI-packed": pairs of rows interleaved, [K/2][N][2]. So each
// request's keys and values are first packed once per KV head (pack_keys, pack_values); every query
// block then reads the packed copy. Positions past the end of the context are packed as zeros.
//
// Causality is per 64-key block: the blocks wholly after a query block are skipped, and only keys
// past a row's own position (or before its window) are masked, row by row. SDPA's CPU kernel, in
// bf16, masks in blocks of 512 keys and runs a oneDNN GEMM per block pair, so at 1,024 tokens a
// causal prefill costs it about as much as a full one.
//
// Work items are taken longest first by torch's threads from one shared counter, since a causal
// block's cost grows with its position.

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <ATen/native/CPUBlas.h>
#include <immintrin.h>
#include <torch/library.h>

#include "../../layers/cpu_dot_product.h"
#include "cpu_avx512_math.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

namespace {

using Vec = at::vec::Vectorized<float>;
using bf16 = at::BFloat16;
constexpr int64_t kBlock = 64;  // query rows and keys per block; also the N width of a packed matrix
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Where a request's keys (or values) lie: position p is slot p % block_size of cache block
// table[p / block_size].
struct Context {
  const bf16* cache;  // [num_blocks, block_size, num_kv_heads, head_dim]
  const int32_t* table;
  int64_t block_size, slot_stride, block_stride;
  const bf16* row(int64_t pos, int64_t kv_head, int64_t head_dim) const {
    return cache + table[pos / block_size] * block_stride + (pos % block_size) * slot_stride + kv_head * head_dim;
  }
};

// Keys [pos0, pos0 + kBlock) of one KV head into the right-hand side of S = Q K^T: K^T [head_dim,
// keys] VNNI-packed, [head_dim / 2][keys][2], `keys` (a multiple of kBlock) apart from one pair of
// dims to the next. A key's pair of dims (2d, 2d + 1) is one 32-bit word, so this is a transpose of
// 32-bit words: with AVX-512, 16 keys by 16 words at a time in registers (transpose_16x16). Keys
// from n on are zero.
#if defined(CPU_CAPABILITY_AVX512)
// r[0..16) -> r'[w] = word w of r[0], ..., word w of r[15]: unpacking pairs of rows by 32 and 64
// bits gives each 128-bit lane four rows' words; two shuffles of lanes gather them.
inline void transpose_16x16(__m512i (&r)[16]) {
  __m512i t[16], u[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {  // u[i + c], lane k: word 4k + c of rows i .. i + 3
    u[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    u[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    u[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    u[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int c = 0; c < 4; ++c)
    for (int half = 0; half < 2; ++half) {  // rows 0-7, then 8-15: words c, c + 8 (0x88) and c + 4, c + 12 (0xdd)
      t[half * 8 + c] = _mm512_shuffle_i32x4(u[half * 8 + c], u[half * 8 + 4 + c], 0x88);
      t[half * 8 + 4 + c] = _mm512_shuffle_i32x4(u[half * 8 + c], u[half * 8 + 4 + c], 0xdd);
    }
  for (int c = 0; c < 4; ++c) {
    r[c] = _mm512_shuffle_i32x4(t[c], t[8 + c], 0x88);
    r[c + 8] = _mm512_shuffle_i32x4(t[c], t[8 + c], 0xdd);
    r[c + 4] = _mm512_shuffle_i32x4(t[4 + c], t[12 + c], 0x88);
    r[c + 12] = _mm512_shuffle_i32x4(t[4 + c], t[12 + c], 0xdd);
  }
}

void pack_keys(const Context& ctx, int64_t pos0, int64_t n, int64_t kv_head, int64_t head_dim, bf16* dst,
               int64_t keys) {
  auto* out = reinterpret_cast<uint32_t*>(dst);
  for (int64_t j0 = 0; j0 < kBlock; j0 += 16)
    for (int64_t w0 = 0; w0 < head_dim / 2; w0 += 16) {
      __m512i r[16];
      for (int64_t t = 0; t < 16; ++t)
        r[t] = j0 + t < n ? _mm512_loadu_si512(ctx.row(pos0 + j0 + t, kv_head, head_dim) + 2 * w0)
                          : _mm512_setzero_si512();
      transpose_16x16(r);
      for (int64_t w = 0; w < 16; ++w) _mm512_storeu_si512(out + (w0 + w) * keys + j0, r[w]);
    }
}
#else
void pack_keys(const Context& ctx, int64_t pos0, int64_t n, int64_t kv_head, int64_t head_dim, bf16* dst,
               int64_t keys) {
  auto* out = reinterpret_cast<uint32_t*>(dst);
  const int64_t pairs = head_dim / 2;
  for (int64_t j = 0; j < n; ++j) {
    const auto* in = reinterpret_cast<const uint32_t*>(ctx.row(pos0 + j, kv_head, head_dim));
    for (int64_t d = 0; d < pairs; ++d) out[d * keys + j] = in[d];
  }
  for (int64_t j = n; j < kBlock; ++j)
    for (int64_t d = 0; d < pairs; ++d) out[d * keys + j] = 0;
}
#endif

// Values [pos0, pos0 + n) of one KV head as the right-hand side of O += P V: V [keys, head_dim],
// VNNI-packed in column chunks of kBlock: chunk c at dst + c * chunk_stride is [keys / 2][kBlock][2],
// element (k, col) next to (k + 1, col). A request's keys follow each other in a chunk, so one
// product can take several key blocks at once. Rows n .. kBlock are zero, so that the padding's zero
// probabilities add 0, not NaN.
void pack_values(const Context& ctx, int64_t pos0, int64_t n, int64_t kv_head, int64_t head_dim, bf16* dst,
                 int64_t chunk_stride) {
  static const bf16 zeros[256] = {};
  for (int64_t k = 0; k < kBlock; k += 2) {
    const bf16* a = k < n ? ctx.row(pos0 + k, kv_head, head_dim) : zeros;
    const bf16* b = k + 1 < n ? ctx.row(pos0 + k + 1, kv_head, head_dim) : zeros;
    for (int64_t c = 0; c < head_dim; c += kBlock) {
      auto* o = reinterpret_cast<uint32_t*>(dst + (c / kBlock) * chunk_stride + (k / 2) * kBlock * 2);
      const auto* a16 = reinterpret_cast<const uint16_t*>(a + c);
      const auto* b16 = reinterpret_cast<const uint16_t*>(b + c);
#if defined(CPU_CAPABILITY_AVX512)
      for (int64_t j = 0; j < kBlock; j += 16) {  // 16 columns: a's element in the low half, b's in the high
        const __m512i lo = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a16 + j)));
        const __m512i hi = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b16 + j)));
        _mm512_storeu_si512(o + j, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
      }
#else
      for (int64_t j = 0; j < kBlock; ++j) o[j] = uint32_t(a16[j]) | (uint32_t(b16[j]) << 16);
#endif
    }
  }
}

// Keys per softmax step: the row maxima, sums and rescaling are paid once per this many keys, not
// once per 64-key block. 4 blocks measured fastest: docs/perf-log.md#amx-prefill-attention.
constexpr int64_t kStepKeys = 4 * kBlock;

// One thread's working memory for a work item: the query rows of every head of a KV head's group
// (head by head, kBlock rows each) and their scores, probabilities, accumulators and softmax state.
// The matrices are ATen tensors for their 64-byte alignment: from unaligned memory, the two products
// of a step ran at about half the speed (docs/perf-log.md#amx-prefill-attention).
struct Scratch {
  at::Tensor q_, probs_, scores_, acc_;
  bf16 *q, *probs;
  float *scores, *acc;
  std::vector<float> max, sum;
  Scratch(int64_t rows, int64_t head_dim)
      : q_(at::empty({rows, head_dim}, at::kBFloat16)), probs_(at::empty({rows, kStepKeys}, at::kBFloat16)),
        scores_(at::empty({rows, kStepKeys}, at::kFloat)), acc_(at::empty({rows, head_dim}, at::kFloat)),
        q(q_.data_ptr<bf16>()), probs(probs_.data_ptr<bf16>()), scores(scores_.data_ptr<float>()),
        acc(acc_.data_ptr<float>()), max(rows), sum(rows) {}
};

// A work item: one query block of one request, for all the query heads that share KV head `kv_head`,
// so that each packed K/V block is read by all of them at once. `cost`: the keys its last row sees.
struct Item {
  int64_t request, kv_head, q_block, cost;
};

#if defined(CPU_CAPABILITY_AVX512)
using tracevllm::exp2_for_bf16;  // cpu_avx512_math.h

// The lanes of x[j .. j + 16) that are in [lo, hi).
inline __mmask16 seen(int64_t j, int64_t lo, int64_t hi) {
  const int64_t a = std::clamp<int64_t>(lo - j, 0, 16), b = std::clamp<int64_t>(hi - j, 0, 16);
  return static_cast<__mmask16>(((1u << b) - 1) & ~((1u << a) - 1));
}
#endif

// One row's step of the online softmax: its scores x[0, width) (width a multiple of kBlock), of which
// it sees [lo, hi) (lo < hi), fold into its running `max` and `sum`; p[0, width) gets the
// probabilities exp((x - max) * scale) in bf16, 0 where unseen. Returns the factor by which the row's
// accumulator must be rescaled for the new max. The unseen scores are masked as they are loaded, not
// overwritten: scalar stores of -inf read back by a vector load cost a stall each, on every row of a
// diagonal block. The CPUs this op runs on all have AVX512-BF16 (the AMX ones too), whose
// vcvtne2ps2bf16 rounds 32 floats to bf16 in one instruction.
#if defined(CPU_CAPABILITY_AVX512)
__attribute__((target("avx512f,avx512bf16"))) float softmax_step(const float* x, bf16* p, int64_t lo, int64_t hi,
                                                                 int64_t width, float scale, float& max, float& sum) {
  const __m512 neg_inf = _mm512_set1_ps(kNegInf);
  __m512 m = neg_inf;
  for (int64_t j = lo / 16 * 16; j < hi; j += 16) m = _mm512_max_ps(m, _mm512_mask_loadu_ps(neg_inf, seen(j, lo, hi), x + j));
  const float new_max = std::max(max, _mm512_reduce_max_ps(m));
  const float alpha = max == new_max ? 1.f : std::exp((max - new_max) * scale);  // 0 at the first step
  constexpr float kLog2e = 1.4426950408889634f;
  const __m512 shift = _mm512_set1_ps(-new_max * scale * kLog2e), vscale = _mm512_set1_ps(scale * kLog2e);
  __m512 total = _mm512_setzero_ps();
  for (int64_t j = 0; j < width; j += 32) {
    if (j + 32 <= lo || j >= hi) {
      _mm512_storeu_si512(p + j, _mm512_setzero_si512());
      continue;
    }
    const __m512 x0 = _mm512_mask_loadu_ps(neg_inf, seen(j, lo, hi), x + j);
    const __m512 x1 = _mm512_mask_loadu_ps(neg_inf, seen(j + 16, lo, hi), x + j + 16);
    const __m512 e0 = exp2_for_bf16(_mm512_fmadd_ps(x0, vscale, shift));
    const __m512 e1 = exp2_for_bf16(_mm512_fmadd_ps(x1, vscale, shift));
    total = _mm512_add_ps(total, _mm512_add_ps(e0, e1));
    _mm512_storeu_si512(p + j, (__m512i)_mm512_cvtne2ps_pbh(e1, e0));
  }
  sum = sum * alpha + _mm512_reduce_add_ps(total);
  max = new_max;
  return alpha;
}
#else
float softmax_step(const float* x, bf16* p, int64_t lo, int64_t hi, int64_t width, float scale, float& max,
                   float& sum) {
  float new_max = max;
  for (int64_t j = lo; j < hi; ++j) new_max = std::max(new_max, x[j]);
  const float alpha = max == new_max ? 1.f : std::exp((max - new_max) * scale);
  float total = 0.f;
  for (int64_t j = 0; j < width; ++j) {
    const float e = j >= lo && j < hi ? std::exp((x[j] - new_max) * scale) : 0.f;
    total += e;
    p[j] = bf16(e);
  }
  sum = sum * alpha + total;
  max = new_max;
  return alpha;
}
#endif

// The product cpublas::brgemm computes on AMX tiles, on AVX512-BF16's vdpbf16ps instead, from the same
// packed layout (layers/cpu_dot_product.h).
void dot_product_gemm(int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb, int64_t ldc, bool add,
                      const bf16* A, const bf16* B, float* C) {
  tracevllm::dot_product_gemm(M, N, K, lda, ldb, ldc, add, A, B, C);
}

// The same product on AMX tiles, through torch's own micro-kernel.
void tile_gemm(int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb, int64_t ldc, bool add, const bf16* A,
               const bf16* B, float* C) {
  at::native::cpublas::brgemm(M, N, K, lda, ldb, ldc, add, A, B, C);
}

void prefill_attention(at::Tensor& out, const at::Tensor& query, const at::Tensor& key_cache,
                       const at::Tensor& value_cache, const at::Tensor& block_table, const at::Tensor& query_start_loc,
                       const at::Tensor& seq_lens, const at::Tensor& rows, double scale, int64_t sliding_window,
                       bool amx) {
  TORCH_CHECK(query.scalar_type() == at::kBFloat16 && key_cache.scalar_type() == at::kBFloat16 &&
                  value_cache.scalar_type() == at::kBFloat16 && out.scalar_type() == at::kBFloat16,
              "prefill_attention: bfloat16 only");
  TORCH_CHECK(!amx || at::native::cpublas::could_pack(at::kBFloat16), "prefill_attention: this CPU has no AMX bf16 tiles");
  TORCH_CHECK(amx || __builtin_cpu_supports("avx512bf16"), "prefill_attention: this CPU has no AVX512-BF16");
  TORCH_CHECK(query.dim() == 3 && out.sizes() == query.sizes(), "query and out: [num_tokens, num_heads, head_dim]");
  TORCH_CHECK(key_cache.dim() == 4 && key_cache.is_contiguous() && value_cache.is_contiguous() &&
                  value_cache.sizes() == key_cache.sizes(),
              "caches: contiguous [num_blocks, block_size, num_kv_heads, head_dim]");
  const int64_t num_heads = query.size(1), head_dim = query.size(2);
  const int64_t num_blocks = key_cache.size(0), block_size = key_cache.size(1), num_kv_heads = key_cache.size(2);
  TORCH_CHECK(key_cache.size(3) == head_dim && num_heads % num_kv_heads == 0, "head counts or head_dim mismatch");
  TORCH_CHECK(head_dim % kBlock == 0 && head_dim <= 256, "prefill_attention: head_dim 64, 128, 192 or 256");
  TORCH_CHECK(query.stride(2) == 1 && query.stride(1) == head_dim && out.stride(2) == 1 && out.stride(1) == head_dim,
              "query and out: each token's heads must be contiguous");
  TORCH_CHECK(block_table.scalar_type() == at::kInt && seq_lens.scalar_type() == at::kInt &&
                  query_start_loc.scalar_type() == at::kInt && rows.scalar_type() == at::kLong &&
                  block_table.stride(1) == 1 && seq_lens.is_contiguous() && query_start_loc.is_contiguous() &&
                  rows.is_contiguous(),
              "block_table, seq_lens and query_start_loc int32, rows int64, with contiguous rows");

  const int32_t* table = block_table.data_ptr<int32_t>();
  const int32_t* lens = seq_lens.data_ptr<int32_t>();
  const int32_t* starts = query_start_loc.data_ptr<int32_t>();
  const int64_t* row_ids = rows.data_ptr<int64_t>();
  const int64_t num_rows = rows.numel(), table_width = block_table.size(1), table_stride = block_table.stride(0);
  const int64_t group = num_heads / num_kv_heads;

  // Where each request's packed keys start (in key blocks), and the work list.
  std::vector<int64_t> pack_offset(num_rows + 1, 0);
  std::vector<Item> items;
  for (int64_t i = 0; i < num_rows; ++i) {
    const int64_t r = row_ids[i];
    TORCH_CHECK(r >= 0 && r < seq_lens.numel() && r + 1 < query_start_loc.numel(), "prefill_attention: bad row ", r);
    const int64_t q_len = starts[r + 1] - starts[r], seq_len = lens[r];
    TORCH_CHECK(q_len >= 1 && q_len <= seq_len && seq_len <= table_width * block_size && starts[r] >= 0 &&
                    starts[r + 1] <= query.size(0),
                "prefill_attention: row ", r, " has ", q_len, " query tokens and ", seq_len, " keys");
    for (int64_t b = 0; b < (seq_len + block_size - 1) / block_size; ++b)
      TORCH_CHECK(table[r * table_stride + b] >= 0 && table[r * table_stride + b] < num_blocks,
                  "prefill_attention: block id ", table[r * table_stride + b], " out of range");
    pack_offset[i + 1] = pack_offset[i] + (seq_len + kBlock - 1) / kBlock;
    for (int64_t qb = 0; qb < (q_len + kBlock - 1) / kBlock; ++qb)
      for (int64_t g = 0; g < num_kv_heads; ++g)
        items.push_back({i, g, qb, seq_len - q_len + std::min(q_len, (qb + 1) * kBlock)});
  }
  std::stable_sort(items.begin(), items.end(), [](const Item& a, const Item& b) { return a.cost > b.cost; });

  // Request i's packed K^T and V, each KV head's after the other, from (pack_offset[i] * num_kv_heads)
  // blocks of kBlock * head_dim: keys a block at a time, values a column chunk at a time.
  const int64_t packed_block = kBlock * head_dim;
  const int64_t packed_size = pack_offset[num_rows] * num_kv_heads * packed_block;
  at::Tensor packed_k_ = at::empty({packed_size}, at::kBFloat16), packed_v_ = at::empty({packed_size}, at::kBFloat16);
  bf16 *packed_k = packed_k_.data_ptr<bf16>(), *packed_v = packed_v_.data_ptr<bf16>();
  auto request_keys = [&](int64_t i) { return (pack_offset[i + 1] - pack_offset[i]) * kBlock; };
  auto k_head = [&](int64_t i, int64_t g) {  // K^T of request i, KV head g: [head_dim / 2][request_keys(i)][2]
    return packed_k + (pack_offset[i] * num_kv_heads + g * (request_keys(i) / kBlock)) * packed_block;
  };
  auto v_chunks = [&](int64_t i, int64_t g) {  // chunk c at + c * request_keys(i) * kBlock
    return packed_v + (pack_offset[i] * num_kv_heads + g * (request_keys(i) / kBlock)) * packed_block;
  };
  auto context = [&](int64_t i, const at::Tensor& cache) {
    return Context{cache.data_ptr<bf16>(), table + row_ids[i] * table_stride, block_size, num_kv_heads * head_dim,
                   block_size * num_kv_heads * head_dim};
  };
  at::parallel_for(0, num_rows * num_kv_heads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t w = begin; w < end; ++w) {  // request i, KV head g
      const int64_t i = w / num_kv_heads, g = w % num_kv_heads;
      const Context kc = context(i, key_cache), vc = context(i, value_cache);
      const int64_t seq_len = lens[row_ids[i]];
      for (int64_t kb = 0; kb < request_keys(i) / kBlock; ++kb) {
        const int64_t n = std::min(kBlock, seq_len - kb * kBlock);
        pack_keys(kc, kb * kBlock, n, g, head_dim, k_head(i, g) + kb * kBlock * 2, request_keys(i));
        pack_values(vc, kb * kBlock, n, g, head_dim, v_chunks(i, g) + kb * kBlock * kBlock, request_keys(i) * kBlock);
      }
    }
  });

  const float fscale = static_cast<float>(scale);
  const bf16* q_data = query.data_ptr<bf16>();
  bf16* o_data = out.data_ptr<bf16>();
  const int64_t q_stride = query.stride(0), o_stride = out.stride(0);
  const auto gemm = amx ? &tile_gemm : &dot_product_gemm;
  std::atomic<int64_t> next{0};
  at::parallel_for(0, at::get_num_threads(), 1, [&](int64_t, int64_t) {
    Scratch s(group * kBlock, head_dim);
    for (int64_t w = next++; w < static_cast<int64_t>(items.size()); w = next++) {
      const Item& it = items[w];
      const int64_t r = row_ids[it.request];
      const int64_t q_len = starts[r + 1] - starts[r], seq_len = lens[r], context_len = seq_len - q_len;
      const int64_t m = std::min(kBlock, q_len - it.q_block * kBlock), rows = group * m;
      const int64_t first_token = starts[r] + it.q_block * kBlock;
      const int64_t first_pos = context_len + it.q_block * kBlock, last_pos = first_pos + m - 1;
      const int64_t lowest = sliding_window > 0 ? std::max<int64_t>(0, first_pos - sliding_window + 1) : 0;
      const bf16* values = v_chunks(it.request, it.kv_head);
      const int64_t chunk_stride = request_keys(it.request) * kBlock;
      // Row i of the item is token (i % m) of query head kv_head * group + i / m.
      for (int64_t i = 0; i < rows; ++i)
        std::memcpy(s.q + i * head_dim,
                    q_data + (first_token + i % m) * q_stride + (it.kv_head * group + i / m) * head_dim,
                    head_dim * sizeof(bf16));
      std::fill(s.acc, s.acc + rows * head_dim, 0.f);
      std::fill(s.max.begin(), s.max.end(), kNegInf);
      std::fill(s.sum.begin(), s.sum.end(), 0.f);

      for (int64_t k0 = lowest / kBlock * kBlock; k0 <= last_pos; k0 += kStepKeys) {
        // S for the key blocks of this step that some row sees; the blocks after last_pos are skipped.
        const int64_t width = (std::min(k0 + kStepKeys, last_pos + 1) - k0 + kBlock - 1) / kBlock * kBlock;
        gemm(rows, width, head_dim, head_dim, request_keys(it.request), kStepKeys, false, s.q,
             k_head(it.request, it.kv_head) + k0 * 2, s.scores);
        for (int64_t i = 0; i < rows; ++i) {
          float* row = s.scores + i * kStepKeys;
          bf16* p = s.probs + i * kStepKeys;
          const int64_t pos = first_pos + i % m;
          // The row sees keys [k0 + lo, k0 + hi) of this step.
          const int64_t hi = std::min(width, pos - k0 + 1);
          const int64_t lo = sliding_window > 0 ? std::max<int64_t>(0, pos - sliding_window + 1 - k0) : 0;
          if (hi <= lo) {  // nothing visible to this row in this step
            std::fill(p, p + width, bf16(0.f));
            continue;
          }
          const float alpha = softmax_step(row, p, lo, hi, width, fscale, s.max[i], s.sum[i]);
          if (alpha != 1.f) {
            float* a = s.acc + i * head_dim;
            for (int64_t c = 0; c < head_dim; c += Vec::size()) (Vec::loadu(a + c) * Vec(alpha)).store(a + c);
          }
        }
        // O += P V over the same keys, one column chunk of V at a time.
        for (int64_t c = 0; c < head_dim; c += kBlock)
          gemm(rows, kBlock, width, kStepKeys, kBlock, head_dim, true, s.probs,
               values + (c / kBlock) * chunk_stride + k0 * kBlock, s.acc + c);
      }
      for (int64_t i = 0; i < rows; ++i) {
        const float inv = s.sum[i] > 0.f ? 1.f / s.sum[i] : 0.f;
        bf16* o = o_data + (first_token + i % m) * o_stride + (it.kv_head * group + i / m) * head_dim;
        float* a = s.acc + i * head_dim;
        for (int64_t c = 0; c < head_dim; c += Vec::size()) (Vec::loadu(a + c) * Vec(inv)).store(a + c);
        at::vec::convert(a, o, head_dim);
      }
    }
    if (amx) at::native::cpublas::brgemm_release();
  });
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(tracevllm, m) {
  m.def("prefill_attention(Tensor(a!) out, Tensor query, Tensor key_cache, Tensor value_cache, "
        "Tensor block_table, Tensor query_start_loc, Tensor seq_lens, Tensor rows, float scale, "
        "int sliding_window, bool amx) -> ()");
}

TORCH_LIBRARY_IMPL(tracevllm, CPU, m) {
  m.impl("prefill_attention", &prefill_attention);
}
