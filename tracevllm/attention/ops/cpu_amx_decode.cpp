// Decode attention on CPU with AMX tiles: each decode row's query against the K/V it owns, read in
// place from the paged cache through its block table, both matrix products on the tile unit.
//
// Built at first use by torch.utils.cpp_extension (cpu_amx_decode.py) and registered as
// torch.ops.tracevllm.amx_decode_attention, with the arguments of paged_decode_attention (the
// AVX-512 version in cpu_paged_decode.cpp, which does the same on float32 vector registers).
//
// This file is the op: it checks its arguments, cuts the batch into work items (a decode row and a
// head tile of up to 16 of its query heads) and hands them to torch's threads, longest first. What
// one work item computes, and how, is RowAttention in cpu_amx_row_attention.h.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <numeric>
#include <vector>

#include "cpu_amx_row_attention.h"
#include "cpu_decode_args.h"

namespace {

// out[tokens[i]] = attention of query[tokens[i]] over the first seq_lens[rows[i]] keys (the last
// `sliding_window` of them if it is > 0) of block-table row rows[i], for every decode row i.
void amx_decode_attention(at::Tensor& out, const at::Tensor& query, const at::Tensor& key_cache,
                          const at::Tensor& value_cache, const at::Tensor& block_table, const at::Tensor& seq_lens,
                          const at::Tensor& rows, const at::Tensor& tokens, double scale, int64_t sliding_window) {
  TORCH_CHECK(request_amx(), "amx_decode_attention: the kernel refused this process the AMX tile state");
  tracevllm::check_decode_args("amx_decode_attention", out, query, key_cache, value_cache, block_table, seq_lens,
                               rows, tokens);
  TORCH_CHECK(query.scalar_type() == at::kBFloat16, "amx_decode_attention: bfloat16 only");
  const int num_heads = query.size(1), head_dim = query.size(2);
  const int block_size = key_cache.size(1), num_kv_heads = key_cache.size(2);
  TORCH_CHECK(head_dim % 64 == 0 && head_dim <= kMaxHeadDim, "amx_decode_attention: head_dim 64, 128, 192 or 256");
  TORCH_CHECK(block_size % kRows == 0, "amx_decode_attention: block_size a multiple of 16");
  const int group = num_heads / num_kv_heads;
  TORCH_CHECK(group <= kRows, "amx_decode_attention: at most 16 query heads per KV head");
  TORCH_CHECK(query.stride(1) == head_dim && out.stride(1) == head_dim,
              "amx_decode_attention: each token's heads must be contiguous");
  const int64_t num_rows = rows.numel(), table_stride = block_table.stride(0);
  const int64_t* row_ids = rows.data_ptr<int64_t>();
  const int64_t* token_ids = tokens.data_ptr<int64_t>();
  const int32_t* lens = seq_lens.data_ptr<int32_t>();
  const int32_t* table = block_table.data_ptr<int32_t>();
  // A head tile: the most whole KV-head groups that fit 16 rows and divide the KV heads evenly.
  int kv_per_tile = kRows / group;
  while (num_kv_heads % kv_per_tile) --kv_per_tile;
  const Layout layout{key_cache.const_data_ptr<bf16>(), value_cache.const_data_ptr<bf16>(), block_size, head_dim,
                      num_kv_heads * head_dim, group, kv_per_tile};
  const int tiles_per_row = num_kv_heads / kv_per_tile;
  const bf16* q = query.const_data_ptr<bf16>();
  bf16* o = out.mutable_data_ptr<bf16>();
  const float fscale = static_cast<float>(scale);
  // Work items (a row and a head tile), the longest first, handed out one at a time from a shared
  // counter: a decode batch's rows differ in length, and an even split by count would not be even.
  std::vector<int64_t> items(num_rows * tiles_per_row);
  std::iota(items.begin(), items.end(), 0);
  auto keys_of = [&](int64_t w) {
    const int64_t i = w / tiles_per_row, seq_len = lens[row_ids[i]];
    const int64_t first = sliding_window > 0 ? std::max<int64_t>(0, seq_len - sliding_window) : 0;
    return Keys{table + row_ids[i] * table_stride, first, seq_len, static_cast<int>(w % tiles_per_row) * kv_per_tile};
  };
  std::stable_sort(items.begin(), items.end(), [&](int64_t a, int64_t b) {
    return keys_of(a).last - keys_of(a).first > keys_of(b).last - keys_of(b).first;
  });
  std::atomic<int64_t> next{0};
  const int64_t num_items = items.size();
  at::parallel_for(0, at::get_num_threads(), 1, [&](int64_t, int64_t) {
    thread_local const std::unique_ptr<Scratch> s = std::make_unique<Scratch>();  // kept: 0.4 MB, page-faulted once
    TileConfig config;
    _tile_loadconfig(&config);
    // The item after this one is taken before this one runs, so that its first keys can be prefetched.
    int64_t w = next++;
    Keys keys = w < num_items ? keys_of(items[w]) : Keys{};
    while (w < num_items) {
      const int64_t w_next = next++;
      const Keys following = w_next < num_items ? keys_of(items[w_next]) : Keys{};
      const int64_t token = token_ids[items[w] / tiles_per_row], head0 = keys.kv0 * group;
      RowAttention(layout, q + token * query.stride(0) + head0 * head_dim, keys,
                   w_next < num_items ? &following : nullptr, fscale, *s)
          .run(o + token * out.stride(0) + head0 * head_dim);
      w = w_next;
      keys = following;
    }
    _tile_release();
  });
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(tracevllm, m) {
  m.def("amx_decode_attention(Tensor(a!) out, Tensor query, Tensor key_cache, Tensor value_cache, "
        "Tensor block_table, Tensor seq_lens, Tensor rows, Tensor tokens, float scale, int sliding_window) -> ()");
}

TORCH_LIBRARY_IMPL(tracevllm, CPU, m) {
  m.impl("amx_decode_attention", &amx_decode_attention);
}
