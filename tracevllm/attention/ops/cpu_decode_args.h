// The arguments every decode op takes (paged_decode_attention's, cpu_paged_decode.cpp), checked in
// one place before the op's threads start: from then on its kernel trusts every index (the rows, the
// tokens, each block id a row reads), and no error is ever raised inside at::parallel_for. Each op
// adds its own checks (its dtypes, head sizes, block sizes) beside these.

#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace tracevllm {

inline void check_decode_args(const char* op, const at::Tensor& out, const at::Tensor& query,
                              const at::Tensor& key_cache, const at::Tensor& value_cache,
                              const at::Tensor& block_table, const at::Tensor& seq_lens, const at::Tensor& rows,
                              const at::Tensor& tokens) {
  TORCH_CHECK(query.dim() == 3 && out.sizes() == query.sizes(), op,
              ": query and out: [num_tokens, num_heads, head_dim]");
  TORCH_CHECK(key_cache.dim() == 4 && key_cache.is_contiguous() && value_cache.is_contiguous() &&
                  key_cache.sizes() == value_cache.sizes(),
              op, ": key_cache, value_cache: contiguous [num_blocks, block_size, num_kv_heads, head_dim]");
  TORCH_CHECK(query.scalar_type() == key_cache.scalar_type() && value_cache.scalar_type() == key_cache.scalar_type() &&
                  out.scalar_type() == query.scalar_type(),
              op, ": query, out and the cache must share a dtype");
  TORCH_CHECK(query.stride(2) == 1 && out.stride(2) == 1, op, ": query and out: head_dim must be contiguous");
  TORCH_CHECK(key_cache.size(3) == query.size(2) && query.size(1) % key_cache.size(2) == 0,
              op, ": head counts or head_dim mismatch");
  TORCH_CHECK(block_table.scalar_type() == at::kInt && seq_lens.scalar_type() == at::kInt &&
                  block_table.stride(1) == 1 && seq_lens.is_contiguous(),
              op, ": block_table and seq_lens: int32");
  TORCH_CHECK(rows.scalar_type() == at::kLong && tokens.scalar_type() == at::kLong && rows.numel() == tokens.numel() &&
                  rows.is_contiguous() && tokens.is_contiguous(),
              op, ": rows and tokens: int64 of one length");
  const int64_t block_size = key_cache.size(1), table_stride = block_table.stride(0);
  const int64_t* row_ids = rows.data_ptr<int64_t>();
  const int64_t* token_ids = tokens.data_ptr<int64_t>();
  const int32_t* lens = seq_lens.data_ptr<int32_t>();
  const int32_t* table = block_table.data_ptr<int32_t>();
  for (int64_t i = 0; i < rows.numel(); ++i) {
    TORCH_CHECK(row_ids[i] >= 0 && row_ids[i] < seq_lens.numel() && token_ids[i] >= 0 && token_ids[i] < query.size(0),
                op, ": row or token index out of range");
    const int64_t len = lens[row_ids[i]];
    TORCH_CHECK(len >= 1 && len <= block_table.size(1) * block_size, op, ": a row's seq_len exceeds its block table");
    for (int64_t b = 0; b < (len + block_size - 1) / block_size; ++b) {
      const int32_t block = table[row_ids[i] * table_stride + b];
      TORCH_CHECK(block >= 0 && block < key_cache.size(0), op, ": block id ", block, " out of range");
    }
  }
}

}  // namespace tracevllm
