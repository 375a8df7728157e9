// The AVX512-BF16 micro-kernel that two C++ ops share: the prefill attention's two products
// (attention/ops/cpu_amx_prefill.cpp, on CPUs without AMX tiles) and the linear layers' GEMMs
// (layers/cpu_vec_gemm.cpp). Header-only; each op's build compiles it in (cpu_extension.py digests
// the headers a source includes, so a change here rebuilds both).
//
// C [M, N] = A B (or C += A B with `add`): A [M, K] bf16 with rows lda apart; B "VNNI-packed" bf16,
// [K / 2][ldb][2], the pairs of B's rows k and k + 1 interleaved column by column (the layout AMX
// tiles read too); C float32 with rows ldc apart. One vdpbf16ps adds, to each of 16 float32 lanes n,
// A[i][k] B[k][n] + A[i][k+1] B[k+1][n]: a pair of A's row, broadcast, against 16 columns' pairs of
// B, which are 16 adjacent 32-bit words of the packed layout. A pass keeps kRows rows by 64 columns
// of C in 4 * kRows registers. N a multiple of 64, K even.

#pragma once

#include <c10/util/BFloat16.h>
#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace tracevllm {

template <int kRows>
__attribute__((target("avx512f,avx512bf16"))) inline void dot_product_rows(int64_t N, int64_t K, int64_t lda,
                                                                            int64_t ldb, int64_t ldc, bool add,
                                                                            const c10::BFloat16* A,
                                                                            const c10::BFloat16* B, float* C,
                                                                            const char* prefetch = nullptr,
                                                                            int64_t prefetch_lines = 0) {
  const int64_t pairs = K / 2;
  for (int64_t n0 = 0; n0 < N; n0 += 64) {
    __m512 acc[kRows][4];
    for (int r = 0; r < kRows; ++r)
      for (int j = 0; j < 4; ++j) acc[r][j] = add ? _mm512_loadu_ps(C + r * ldc + n0 + 16 * j) : _mm512_setzero_ps();
    for (int64_t pair = 0; pair < pairs; ++pair) {
      if (pair < prefetch_lines) __builtin_prefetch(prefetch + 64 * pair);  // a line of the caller's next operand
      const c10::BFloat16* b = B + (pair * ldb + n0) * 2;
      __m512bh cols[4];
      for (int j = 0; j < 4; ++j) cols[j] = (__m512bh)_mm512_loadu_si512(b + 32 * j);
      for (int r = 0; r < kRows; ++r) {
        int32_t a_pair;
        std::memcpy(&a_pair, A + r * lda + 2 * pair, sizeof(a_pair));
        const __m512bh a = (__m512bh)_mm512_set1_epi32(a_pair);
        for (int j = 0; j < 4; ++j) acc[r][j] = _mm512_dpbf16_ps(acc[r][j], a, cols[j]);
      }
    }
    for (int r = 0; r < kRows; ++r)
      for (int j = 0; j < 4; ++j) _mm512_storeu_ps(C + r * ldc + n0 + 16 * j, acc[r][j]);
  }
}

// The rows of C in passes of six (24 accumulators, 4 column registers, one broadcast: 29 of the 32
// registers), the last pass as many as are left. With `prefetch`, the passes also ask for its first
// `prefetch_bytes`, a share each, a cache line per step of a pass's loop (at most K / 2 lines a pass):
// the operand the caller multiplies next, which then arrives from memory while this product
// computes instead of after it (a GEMM of a few dozen rows: its weights).
inline void dot_product_gemm(int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb, int64_t ldc, bool add,
                             const c10::BFloat16* A, const c10::BFloat16* B, float* C,
                             const void* prefetch = nullptr, int64_t prefetch_bytes = 0) {
  constexpr int kRows = 6;
  const int64_t passes = (M + kRows - 1) / kRows;
  const int64_t lines = (prefetch_bytes / 64 + passes - 1) / passes;  // per pass
  const char* next = static_cast<const char*>(prefetch);  // this pass's share
  int64_t i = 0;
  for (; i + kRows <= M; i += kRows, next += 64 * lines)
    dot_product_rows<kRows>(N, K, lda, ldb, ldc, add, A + i * lda, B, C + i * ldc, next, prefetch ? lines : 0);
  const c10::BFloat16* a = A + i * lda;
  float* c = C + i * ldc;
  const int64_t tail = prefetch ? lines : 0;
  switch (M - i) {
    case 5: dot_product_rows<5>(N, K, lda, ldb, ldc, add, a, B, c, next, tail); break;
    case 4: dot_product_rows<4>(N, K, lda, ldb, ldc, add, a, B, c, next, tail); break;
    case 3: dot_product_rows<3>(N, K, lda, ldb, ldc, add, a, B, c, next, tail); break;
    case 2: dot_product_rows<2>(N, K, lda, ldb, ldc, add, a, B, c, next, tail); break;
    case 1: dot_product_rows<1>(N, K, lda, ldb, ldc, add, a, B, c, next, tail); break;
    default: break;
  }
}

}  // namespace tracevllm
