// Paged decode attention on CPU: each decode row's query against the K/V it owns, read in place
// from the paged cache through its block table. No gathered copy, no padding, no mask.
//
// Built at first use by torch.utils.cpp_extension (cpu_paged_decode.py) and registered as
// torch.ops.tracevllm.paged_decode_attention. The plain-PyTorch version of the same computation is
// TorchAttentionImpl._decode: gather the keys through the block table, then SDPA.
//
// One work item is one decode row, all its heads; rows are shared out among torch's threads. A row's
// keys are visited a cache block at a time. A slot holds the rows of every KV head side by side, so
// a block's keys are one contiguous run of memory, read once and converted to float32 once; each
// query head then takes the scores against its KV head's part. An online softmax (running max and
// sum per head, the accumulator rescaled when the max grows) folds the blocks in one by one, so the
// scores of the whole context are never held at once. All arithmetic is float32, whatever the
// cache's dtype.
//
// The head size is a template parameter (in float vectors, `kChunks`), so that a query head and its
// accumulator stay in registers. With AVX-512 the scores of 16 keys are summed across lanes together
// (reduce_16); elsewhere one key at a time.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <torch/library.h>

#include <algorithm>
#include <vector>

#include "cpu_avx512_math.h"
#include "cpu_decode_args.h"

namespace {

using Vec = at::vec::Vectorized<float>;  // 16 floats with AVX-512, 8 with AVX2
constexpr int kKeysPerScoreBatch = 16;

// n elements from `src` as float32 in `dst`.
template <typename scalar_t>
inline void to_float(const scalar_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; i += Vec::size()) {
    Vec x;
    if constexpr (std::is_same_v<scalar_t, float>) {
      x = Vec::loadu(src + i);
    } else {
      at::vec::load_to_float(src + i, x);
    }
    x.store(dst + i);
  }
}

// out[i] = the sum of the lanes of v[i], for 16 vectors: with AVX-512, all at once (sum_lanes_16).
inline void reduce_16(const Vec (&v)[kKeysPerScoreBatch], float* out) {
#if defined(CPU_CAPABILITY_AVX512)
  __m512 lanes[kKeysPerScoreBatch];
  for (int i = 0; i < kKeysPerScoreBatch; ++i) lanes[i] = v[i];
  _mm512_storeu_ps(out, tracevllm::sum_lanes_16(lanes));
#else
  for (int i = 0; i < kKeysPerScoreBatch; ++i)
    out[i] = at::vec::vec_reduce_all<float>([](Vec& x, Vec& y) { return x + y; }, v[i]);
#endif
}

// One thread's float32 working memory for a decode row.
struct Scratch {
  std::vector<float> q, acc, block, probs, max, sum;
  Scratch(int num_heads, int head_dim, int block_size, int slot_width)
      : q(num_heads * head_dim), acc(num_heads * head_dim), block(block_size * slot_width),
        probs(num_heads * (block_size + kKeysPerScoreBatch)), max(num_heads), sum(num_heads) {}
};

// Scores of one query head `q` against the n keys at `k` (rows `slot_width` apart) into `scores`.
template <int kChunks>
inline void head_scores(const float* q, const float* k, int slot_width, int n, float* scores) {
  Vec qv[kChunks];
  for (int c = 0; c < kChunks; ++c) qv[c] = Vec::loadu(q + c * Vec::size());
  for (int t0 = 0; t0 < n; t0 += kKeysPerScoreBatch) {
    Vec partial[kKeysPerScoreBatch];  // per key: the products summed over chunks, not yet over lanes
    for (int t = 0; t < kKeysPerScoreBatch; ++t) {
      if (t0 + t >= n) {
        partial[t] = Vec(0.f);
        continue;
      }
      const float* key = k + (t0 + t) * slot_width;
      Vec s = qv[0] * Vec::loadu(key);
      for (int c = 1; c < kChunks; ++c) s = at::vec::fmadd(qv[c], Vec::loadu(key + c * Vec::size()), s);
      partial[t] = s;
    }
    reduce_16(partial, scores + t0);  // `scores` has room for a whole batch past n
  }
}

// Attention of one decode row (all its query heads) over its keys at positions [first, last).
template <typename scalar_t, int kChunks>
void attend_row(const scalar_t* query, int64_t query_head_stride, const scalar_t* key_cache,
                const scalar_t* value_cache, const int32_t* blocks, int block_size, int first,
                int last, int num_heads, int num_kv_heads, float scale, scalar_t* out, int64_t out_head_stride,
                Scratch& s) {
  constexpr int head_dim = kChunks * Vec::size();
  const int slot_width = num_kv_heads * head_dim;  // a slot holds one key (or value) row per KV head
  const int group = num_heads / num_kv_heads;      // query head j reads KV head j / group
  const int probs_stride = block_size + kKeysPerScoreBatch;
  for (int j = 0; j < num_heads; ++j) {
    to_float(query + j * query_head_stride, &s.q[j * head_dim], head_dim);
    for (int d = 0; d < head_dim; ++d) {
      s.q[j * head_dim + d] *= scale;
      s.acc[j * head_dim + d] = 0.f;
    }
    s.max[j] = -3.0e38f;
    s.sum[j] = 0.f;
  }
  for (int pos = first; pos < last;) {
    const int offset = pos % block_size;
    const int n = std::min(block_size - offset, last - pos);
    const int64_t block = blocks[pos / block_size];  // checked by the caller, outside the threads
    // The block's n slots are adjacent: its keys (and values) are n * slot_width elements in a row.
    const int64_t start = (block * block_size + offset) * slot_width;
    if (pos + n < last) {
      // The next block may lie anywhere in the cache, where the hardware prefetcher cannot guess
      // it: ask for it now, so that it arrives while this block is computed.
      const int64_t next = static_cast<int64_t>(blocks[(pos + n) / block_size]) * block_size * slot_width;
      const int64_t bytes = std::min(block_size, last - pos - n) * slot_width * sizeof(scalar_t);
      for (int64_t b = 0; b < bytes; b += 64) {
        __builtin_prefetch(reinterpret_cast<const char*>(key_cache + next) + b);
        __builtin_prefetch(reinterpret_cast<const char*>(value_cache + next) + b);
      }
    }
    // Scores: every query head against the keys of its KV head.
    to_float(key_cache + start, s.block.data(), n * slot_width);
    for (int j = 0; j < num_heads; ++j)
      head_scores<kChunks>(&s.q[j * head_dim], s.block.data() + (j / group) * head_dim, slot_width, n,
                           &s.probs[j * probs_stride]);
    // Online softmax: fold the block into each head's running max and sum, rescaling what came before.
    for (int j = 0; j < num_heads; ++j) {
      float* p = &s.probs[j * probs_stride];
      const float block_max = std::max(s.max[j], *std::max_element(p, p + n));
      const float rescale = std::exp(s.max[j] - block_max);
      Vec total(0.f);
      for (int t = 0; t < n; t += Vec::size()) {
        const int count = std::min<int>(Vec::size(), n - t);
        const Vec e = (Vec::loadu(p + t, count) - Vec(block_max)).exp_u20();
        e.store(p + t, count);
        total = total + Vec::set(Vec(0.f), e, count);
      }
      s.sum[j] = s.sum[j] * rescale + at::vec::vec_reduce_all<float>([](Vec& x, Vec& y) { return x + y; }, total);
      s.max[j] = block_max;
      for (int d = 0; d < head_dim; d += Vec::size())
        (Vec::loadu(&s.acc[j * head_dim + d]) * Vec(rescale)).store(&s.acc[j * head_dim + d]);
    }
    // The values, weighted by the probabilities, into each head's accumulator.
    to_float(value_cache + start, s.block.data(), n * slot_width);
    for (int j = 0; j < num_heads; ++j) {
      const float* v = s.block.data() + (j / group) * head_dim;
      const float* p = &s.probs[j * probs_stride];
      Vec acc[kChunks];
      for (int c = 0; c < kChunks; ++c) acc[c] = Vec::loadu(&s.acc[j * head_dim + c * Vec::size()]);
      for (int t = 0; t < n; ++t) {
        const Vec weight(p[t]);
        for (int c = 0; c < kChunks; ++c)
          acc[c] = at::vec::fmadd(weight, Vec::loadu(v + t * slot_width + c * Vec::size()), acc[c]);
      }
      for (int c = 0; c < kChunks; ++c) acc[c].store(&s.acc[j * head_dim + c * Vec::size()]);
    }
    pos += n;
  }
  for (int j = 0; j < num_heads; ++j) {
    const float inv = 1.f / s.sum[j];
    for (int d = 0; d < head_dim; ++d) out[j * out_head_stride + d] = static_cast<scalar_t>(s.acc[j * head_dim + d] * inv);
  }
}

// out[tokens[i]] = attention of query[tokens[i]] over the first seq_lens[rows[i]] keys (the last
// `sliding_window` of them if it is > 0) of block-table row rows[i], for every decode row i.
void paged_decode_attention(at::Tensor& out, const at::Tensor& query, const at::Tensor& key_cache,
                            const at::Tensor& value_cache, const at::Tensor& block_table,
                            const at::Tensor& seq_lens, const at::Tensor& rows, const at::Tensor& tokens,
                            double scale, int64_t sliding_window) {
  tracevllm::check_decode_args("paged_decode_attention", out, query, key_cache, value_cache, block_table, seq_lens,
                               rows, tokens);
  const int num_heads = query.size(1), head_dim = query.size(2);
  const int block_size = key_cache.size(1), num_kv_heads = key_cache.size(2);
  const int64_t num_rows = rows.numel();
  const int64_t* row_ids = rows.data_ptr<int64_t>();
  const int64_t* token_ids = tokens.data_ptr<int64_t>();
  const int32_t* lens = seq_lens.data_ptr<int32_t>();
  const int32_t* table = block_table.data_ptr<int32_t>();
  const int64_t table_stride = block_table.stride(0);

  const auto run = [&](auto dtype_tag, auto chunks_tag) {
    using scalar_t = decltype(dtype_tag);
    constexpr int kChunks = decltype(chunks_tag)::value;
    const scalar_t* q = query.const_data_ptr<scalar_t>();
    const scalar_t* kc = key_cache.const_data_ptr<scalar_t>();
    const scalar_t* vc = value_cache.const_data_ptr<scalar_t>();
    scalar_t* o = out.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, num_rows, 1, [&](int64_t begin, int64_t end) {
      Scratch scratch(num_heads, head_dim, block_size, num_kv_heads * head_dim);
      for (int64_t i = begin; i < end; ++i) {
        const int64_t row = row_ids[i], token = token_ids[i];
        const int seq_len = lens[row];
        const int first = sliding_window > 0 ? std::max<int64_t>(0, seq_len - sliding_window) : 0;
        attend_row<scalar_t, kChunks>(q + token * query.stride(0), query.stride(1), kc, vc,
                                      table + row * table_stride, block_size, first, seq_len, num_heads,
                                      num_kv_heads, static_cast<float>(scale), o + token * out.stride(0),
                                      out.stride(1), scratch);
      }
    });
  };
  const auto run_dtype = [&](auto chunks_tag) {
    switch (query.scalar_type()) {
      case at::kFloat: return run(float{}, chunks_tag);
      case at::kBFloat16: return run(c10::BFloat16{}, chunks_tag);
      case at::kHalf: return run(c10::Half{}, chunks_tag);
      default: TORCH_CHECK(false, "paged_decode_attention: float32, bfloat16 or float16, not ", query.scalar_type());
    }
  };
  // head_dim 16 to 256, a power of two (cpu_paged_decode.supports), in float vectors of 16 or 8.
  switch (head_dim / Vec::size()) {
    case 1: return run_dtype(std::integral_constant<int, 1>{});
    case 2: return run_dtype(std::integral_constant<int, 2>{});
    case 4: return run_dtype(std::integral_constant<int, 4>{});
    case 8: return run_dtype(std::integral_constant<int, 8>{});
    case 16: return run_dtype(std::integral_constant<int, 16>{});
    case 32: return run_dtype(std::integral_constant<int, 32>{});
  }
  TORCH_CHECK(false, "paged_decode_attention: head_dim must be a power of two from 16 to 256, not ", head_dim);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(tracevllm, m) {
  m.def("paged_decode_attention(Tensor(a!) out, Tensor query, Tensor key_cache, Tensor value_cache, "
        "Tensor block_table, Tensor seq_lens, Tensor rows, Tensor tokens, float scale, int sliding_window) -> ()");
}

TORCH_LIBRARY_IMPL(tracevllm, CPU, m) {
  m.impl("paged_decode_attention", &paged_decode_attention);
}
