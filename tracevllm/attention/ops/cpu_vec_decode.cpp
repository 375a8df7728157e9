// Decode attention on AVX512-BF16 dot products, for CPUs that have them but no AMX tiles (AMD Zen 4,
// Zen 5): each decode row's query against the K/V it owns, read in place from the paged cache
// through its block table, both products on vdpbf16ps straight from the bf16 cache rows.
//
// Built at first use by torch.utils.cpp_extension (cpu_vec_decode.py) and registered as
// torch.ops.tracevllm.vec_decode_attention, with the arguments of paged_decode_attention
// (cpu_paged_decode.cpp, which widens every key and value to float32 first and multiplies in float32;
// at a decode batch's contexts that arithmetic, not memory, sets its pace).
//
// A work item is one decode row and one KV head: the `group` query heads that read it. Its keys are
// met 16 at a time (a batch), and each batch is done in three parts:
//
//     scores   per query head and key, the head_dim-long dot product of the bf16 query with the key's
//              row as it lies in the cache: 32 dims an instruction (16 lanes of pair sums), then the
//              lanes of the batch's 16 keys summed at once (sum_lanes_16): one vector of 16 scores.
//     softmax  online, per head: the running max and sum, the accumulator rescaled when the max
//              grows; the batch's probabilities rounded to bf16, 16 in a row, so that 32-bit word i
//              holds those of keys 2i and 2i + 1.
//     values   the batch's value rows interleaved in pairs once (vpermt2w): word d of pair i holds
//              dim d of keys 2i and 2i + 1. Each head's word i, broadcast, against pair i adds
//              p[2i] V[2i][d] + p[2i + 1] V[2i + 1][d] to 16 dims of its accumulator an instruction.
//
// Softmax and sums are float32; the probabilities are rounded to bf16 before P V, as on the AMX op
// (cpu_amx_decode.cpp). Keys past the row's end get probability 0, and the value rows that pad the
// last pair are zeros (0 x NaN would be NaN). The next batch's rows are asked for (prefetched) while
// this one is computed: blocks lie anywhere in the cache, where the hardware prefetcher cannot guess.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <immintrin.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <memory>
#include <numeric>
#include <vector>

#include "cpu_avx512_math.h"
#include "cpu_decode_args.h"

namespace {

using bf16 = c10::BFloat16;
constexpr int kBatch = 16;  // keys per batch: one vector of scores
constexpr int kPairs = kBatch / 2;
constexpr int kMaxGroup = 16;
constexpr int kMaxHeadDim = 256;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kLog2e = 1.4426950408889634f;
alignas(64) const bf16 kZeroRow[kMaxHeadDim] = {};

// vpermt2w indices: words j of two rows a and b interleaved as (a[j], b[j]) pairs, for j in 0-15
// (lo) and 16-31 (hi).
alignas(64) const uint16_t kInterleaveLo[32] = {0, 32, 1, 33, 2, 34, 3, 35, 4, 36, 5, 37, 6, 38, 7, 39,
                                                8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
alignas(64) const uint16_t kInterleaveHi[32] = {16, 48, 17, 49, 18, 50, 19, 51, 20, 52, 21, 53, 22, 54, 23, 55,
                                                24, 56, 25, 57, 26, 58, 27, 59, 28, 60, 29, 61, 30, 62, 31, 63};

// One thread's working memory for a work item.
struct alignas(64) Scratch {
  float acc[kMaxGroup][kMaxHeadDim];       // O per head, not yet divided by the sum
  uint32_t p[kMaxGroup][kPairs];           // the batch's probabilities per head, a pair of keys a word
  __m512i v[kPairs][kMaxHeadDim / 16];     // the batch's values in pairs, 16 dims a vector
};

// Where one call's rows lie.
struct Layout {
  const bf16 *key_cache, *value_cache;
  int64_t block_size, slot_width;  // a slot holds one row per KV head, slot_width elements in all
  int group;
};

// A work item: one decode row's keys [first, last), read through `blocks`, of KV head `kv_head`.
struct Item {
  const int32_t* blocks;
  int64_t first, last;
  int kv_head;
};

// An item's rows in either cache, position after position from `pos` on: each row's offset, without
// a division per key (the block size is known only at run time).
class Rows {
 public:
  Rows(const Layout& l, const Item& item, int64_t pos, int head_dim)
      : blocks_(item.blocks), block_size_(l.block_size), slot_width_(l.slot_width),
        head_offset_(static_cast<int64_t>(item.kv_head) * head_dim), block_(pos / l.block_size),
        slot_(pos % l.block_size) {}
  int64_t next() {
    const int64_t offset = (blocks_[block_] * block_size_ + slot_) * slot_width_ + head_offset_;
    if (++slot_ == block_size_) slot_ = 0, ++block_;
    return offset;
  }

 private:
  const int32_t* blocks_;
  int64_t block_size_, slot_width_, head_offset_, block_, slot_;
};

template <int kChunks>  // head_dim / 32: bf16 vectors a row
__attribute__((target("avx512f,avx512bw,avx512bf16"))) void attend(const Layout& l, const Item& item,
                                                                   const bf16* query, float scale, bf16* out,
                                                                   Scratch& s) {
  constexpr int kHeadDim = 32 * kChunks, kSlices = kHeadDim / 16;  // float vectors a row
  const int group = l.group;
  const __m512 to_log2 = _mm512_set1_ps(scale * kLog2e);
  const __m512i lo_idx = _mm512_load_si512(kInterleaveLo), hi_idx = _mm512_load_si512(kInterleaveHi);
  float max[kMaxGroup], sum[kMaxGroup];  // per head, the max in base-2 units
  for (int h = 0; h < group; ++h) {
    max[h] = kNegInf;
    sum[h] = 0.f;
    std::fill(s.acc[h], s.acc[h] + kHeadDim, 0.f);
  }
  const bf16* keys[kBatch];
  const bf16* values[kBatch];
  Rows rows(l, item, item.first, kHeadDim), ahead(l, item, item.first + kBatch, kHeadDim);  // the next batch's
  for (int64_t start = item.first; start < item.last; start += kBatch) {
    const int n = static_cast<int>(std::min<int64_t>(kBatch, item.last - start));
    for (int t = 0; t < n; ++t) {
      const int64_t offset = rows.next();
      keys[t] = l.key_cache + offset;
      values[t] = l.value_cache + offset;
    }
    for (int t = n; t < kBatch; ++t) values[t] = kZeroRow;
    // The next batch's rows, asked for into L2 (asked into L1, 64 lines a batch, the decode ran 1.6x
    // slower: more than its line-fill buffers hold); asked further ahead, no faster.
    for (int64_t pos = start + kBatch; pos < std::min(item.last, start + 2 * kBatch); ++pos) {
      const int64_t offset = ahead.next();
      for (int c = 0; c < kChunks; ++c) {  // a 64-byte line a chunk
        _mm_prefetch(reinterpret_cast<const char*>(l.key_cache + offset + 32 * c), _MM_HINT_T2);
        _mm_prefetch(reinterpret_cast<const char*>(l.value_cache + offset + 32 * c), _MM_HINT_T2);
      }
    }
    const int pairs = (n + 1) / 2;
    for (int i = 0; i < pairs; ++i)
      for (int c = 0; c < kChunks; ++c) {
        const __m512i a = _mm512_loadu_si512(values[2 * i] + 32 * c);
        const __m512i b = _mm512_loadu_si512(values[2 * i + 1] + 32 * c);
        s.v[i][2 * c] = _mm512_permutex2var_epi16(a, lo_idx, b);
        s.v[i][2 * c + 1] = _mm512_permutex2var_epi16(a, hi_idx, b);
      }
    const __mmask16 in = n == kBatch ? 0xffff : static_cast<__mmask16>((1u << n) - 1);
    for (int h = 0; h < group; ++h) {
      const bf16* q = query + h * kHeadDim;
      __m512bh qv[kChunks];
      for (int c = 0; c < kChunks; ++c) qv[c] = (__m512bh)_mm512_loadu_si512(q + 32 * c);
      __m512 partial[kBatch];
      for (int t = 0; t < kBatch; ++t) {
        __m512 dot = _mm512_setzero_ps();
        if (t < n)
          for (int c = 0; c < kChunks; ++c)
            dot = _mm512_dpbf16_ps(dot, (__m512bh)_mm512_loadu_si512(keys[t] + 32 * c), qv[c]);
        partial[t] = dot;
      }
      const __m512 x = _mm512_mask_mul_ps(_mm512_set1_ps(kNegInf), in, tracevllm::sum_lanes_16(partial), to_log2);
      const float new_max = std::max(max[h], _mm512_reduce_max_ps(x));
      const float alpha = std::exp2(max[h] - new_max);  // 0 at the first batch (max is -inf)
      const __m512 e = tracevllm::exp2_for_bf16(_mm512_sub_ps(x, _mm512_set1_ps(new_max)));
      sum[h] = sum[h] * alpha + _mm512_reduce_add_ps(e);
      max[h] = new_max;
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(s.p[h]), (__m256i)_mm512_cvtneps_pbh(e));
      __m512 o[kSlices];
      const __m512 rescale = _mm512_set1_ps(alpha);
      for (int d = 0; d < kSlices; ++d) o[d] = _mm512_mul_ps(_mm512_loadu_ps(s.acc[h] + 16 * d), rescale);
      for (int i = 0; i < pairs; ++i) {
        const __m512bh w = (__m512bh)_mm512_set1_epi32(static_cast<int>(s.p[h][i]));
        for (int d = 0; d < kSlices; ++d) o[d] = _mm512_dpbf16_ps(o[d], (__m512bh)s.v[i][d], w);
      }
      for (int d = 0; d < kSlices; ++d) _mm512_storeu_ps(s.acc[h] + 16 * d, o[d]);
    }
  }
  for (int h = 0; h < group; ++h) {
    const float inv = 1.f / sum[h];
    for (int d = 0; d < kHeadDim; ++d) out[h * kHeadDim + d] = static_cast<bf16>(s.acc[h][d] * inv);
  }
}

// out[tokens[i]] = attention of query[tokens[i]] over the first seq_lens[rows[i]] keys (the last
// `sliding_window` of them if it is > 0) of block-table row rows[i], for every decode row i.
void vec_decode_attention(at::Tensor& out, const at::Tensor& query, const at::Tensor& key_cache,
                          const at::Tensor& value_cache, const at::Tensor& block_table, const at::Tensor& seq_lens,
                          const at::Tensor& rows, const at::Tensor& tokens, double scale, int64_t sliding_window) {
  tracevllm::check_decode_args("vec_decode_attention", out, query, key_cache, value_cache, block_table, seq_lens,
                               rows, tokens);
  TORCH_CHECK(query.scalar_type() == at::kBFloat16, "vec_decode_attention: bfloat16 only");
  TORCH_CHECK(__builtin_cpu_supports("avx512bf16"), "vec_decode_attention: this CPU has no AVX512-BF16");
  const int num_heads = query.size(1), head_dim = query.size(2), num_kv_heads = key_cache.size(2);
  TORCH_CHECK(head_dim % 64 == 0 && head_dim <= kMaxHeadDim, "vec_decode_attention: head_dim 64, 128, 192 or 256");
  const int group = num_heads / num_kv_heads;
  TORCH_CHECK(group <= kMaxGroup, "vec_decode_attention: at most 16 query heads per KV head");
  TORCH_CHECK(query.stride(1) == head_dim && out.stride(1) == head_dim,
              "vec_decode_attention: each token's heads must be contiguous");
  const Layout layout{key_cache.const_data_ptr<bf16>(), value_cache.const_data_ptr<bf16>(), key_cache.size(1),
                      num_kv_heads * head_dim, group};
  const int64_t num_rows = rows.numel(), table_stride = block_table.stride(0);
  const int64_t* row_ids = rows.data_ptr<int64_t>();
  const int64_t* token_ids = tokens.data_ptr<int64_t>();
  const int32_t* lens = seq_lens.data_ptr<int32_t>();
  const int32_t* table = block_table.data_ptr<int32_t>();
  auto item_of = [&](int64_t w) {
    const int64_t i = w / num_kv_heads, seq_len = lens[row_ids[i]];
    const int64_t first = sliding_window > 0 ? std::max<int64_t>(0, seq_len - sliding_window) : 0;
    return Item{table + row_ids[i] * table_stride, first, seq_len, static_cast<int>(w % num_kv_heads)};
  };
  // Work items (a row and a KV head), the longest first, handed out one at a time from a shared
  // counter: a decode batch's rows differ in length, and an even split by count would not be even.
  std::vector<int64_t> order(num_rows * num_kv_heads);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    const Item x = item_of(a), y = item_of(b);
    return x.last - x.first > y.last - y.first;
  });
  const bf16* q = query.const_data_ptr<bf16>();
  bf16* o = out.mutable_data_ptr<bf16>();
  const auto run = [&](auto chunks_tag) {
    constexpr int kChunks = decltype(chunks_tag)::value;
    std::atomic<int64_t> next{0};
    at::parallel_for(0, at::get_num_threads(), 1, [&](int64_t, int64_t) {
      thread_local const std::unique_ptr<Scratch> s = std::make_unique<Scratch>();
      for (int64_t k = next++; k < static_cast<int64_t>(order.size()); k = next++) {
        const Item item = item_of(order[k]);
        const int64_t token = token_ids[order[k] / num_kv_heads], head0 = static_cast<int64_t>(item.kv_head) * group;
        attend<kChunks>(layout, item, q + token * query.stride(0) + head0 * head_dim, static_cast<float>(scale),
                        o + token * out.stride(0) + head0 * head_dim, *s);
      }
    });
  };
  switch (head_dim / 32) {
    case 2: return run(std::integral_constant<int, 2>{});
    case 4: return run(std::integral_constant<int, 4>{});
    case 6: return run(std::integral_constant<int, 6>{});
    default: return run(std::integral_constant<int, 8>{});
  }
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(tracevllm, m) {
  m.def("vec_decode_attention(Tensor(a!) out, Tensor query, Tensor key_cache, Tensor value_cache, "
        "Tensor block_table, Tensor seq_lens, Tensor rows, Tensor tokens, float scale, int sliding_window) -> ()");
}

TORCH_LIBRARY_IMPL(tracevllm, CPU, m) {
  m.impl("vec_decode_attention", &vec_decode_attention);
}
