// bf16 GEMMs on AVX512-BF16 dot products, for CPUs that have them but no AMX tiles (AMD Zen 4, Zen 5):
// a linear layer's x W^T (+ b), and the gated MLP's silu(x W_gate^T) * (x W_up^T) in one pass. Built
// once per machine (cpu_vec_gemm.py, through attention/ops/cpu_extension.py) and registered as
// torch.ops.tracevllm.vec_linear and .vec_silu_and_mul_linear. The plain PyTorch code is F.linear
// (layers/linear.py) and silu_and_mul (layers/activation.py). Built with -mavx512bf16: it is loaded
// only on CPUs that have the instructions.
//
// The weight is packed once, at load, into groups of 64 output features, each group VNNI-packed on
// its own ([K / 2][64][2]: the layout dot_product_gemm reads, layers/cpu_dot_product.h), so that a
// group's weights are one contiguous run of memory:
//
//     packed [groups][K / 2][64][2]     group g holds output features 64 g .. 64 g + 63
//                                       (the gated MLP's: gate features 32 g .. 32 g + 31, then the
//                                        same features of up; see cpu_vec_gemm.py's pack functions)
//
// A work item is one group against up to kRowBlock rows of x; items are shared out among torch's
// threads, rows first (a thread keeps its rows' x in cache while the weights stream past). A decode
// step (a few rows) is one pass over the weights from memory; a prefill chunk is as many passes as
// it has row blocks, each over weights that a whole layer keeps in the L3 cache.
//
// Results are accumulated in float32 and rounded to bf16 once, as a bf16 F.linear rounds them (the
// bias, if any, added first). The gated MLP rounds where the plain code does: the gate and up
// projections, the SiLU, and the product.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/cpu/vec/vec.h>
#include <ATen/ops/empty.h>
#include <immintrin.h>
#include <torch/library.h>

#include <algorithm>
#include <limits>
#include <optional>

#include "cpu_dot_product.h"

namespace {

using bf16 = c10::BFloat16;
using Vec = at::vec::Vectorized<float>;  // 16 floats: this file is built for AVX-512
constexpr int64_t kGroup = 64;           // output features per packed group
constexpr int64_t kRowBlock = 64;        // rows of x per work item

// The 16 floats of v rounded to bf16 (to nearest, ties to even, as torch rounds), and widened back:
// the value a bf16 tensor would hold.
inline __m512 round_bf16(__m512 v) { return _mm512_cvtpbh_ps(_mm512_cvtneps_pbh(v)); }

// silu(g) = g / (1 + e^-g), to within a few ulp of float32: e^-g as 2^k 2^f with f in [-0.5, 0.5] and
// 2^f a degree-6 polynomial, the division as a reciprocal estimate and one Newton step: cheaper than
// Sleef's exp and a division (Vec's, which the plain code's silu uses), with as few bf16 results
// differing from the plain MLP's (docs/perf-log.md#polynomial-silu).
inline __m512 silu_f32(__m512 g) {
  const __m512 t = _mm512_mul_ps(g, _mm512_set1_ps(-1.4426950408889634f));  // -g log2(e)
  const __m512 k = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(t, k);
  __m512 p = _mm512_set1_ps(1.5403530e-4f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3333558e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6181291e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5504109e-2f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022651e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f));
  const __m512 d = _mm512_add_ps(_mm512_set1_ps(1.f), _mm512_scalef_ps(p, k));  // 1 + e^-g, inf past 2^128
  const __mmask16 finite = _mm512_cmp_ps_mask(d, _mm512_set1_ps(std::numeric_limits<float>::max()), _CMP_LE_OQ);
  __m512 r = _mm512_rcp14_ps(d);  // 0 where d is inf, as g / inf is: the Newton step would make it NaN
  r = _mm512_mask_mul_ps(r, finite, r, _mm512_fnmadd_ps(d, r, _mm512_set1_ps(2.f)));  // r (2 - d r)
  return _mm512_mul_ps(g, r);
}

// The first n <= 16 bf16 at p, widened to float32.
inline __m512 load_bf16(const bf16* p, int64_t n) {
  const __mmask16 mask = n >= 16 ? 0xffff : static_cast<__mmask16>((1u << n) - 1);
  return _mm512_cvtpbh_ps((__m256bh)_mm256_maskz_loadu_epi16(mask, p));
}

// The first n <= 16 lanes of v, rounded, at out.
inline void store_bf16(bf16* out, __m512 v, int64_t n) {
  const __m256i packed = (__m256i)_mm512_cvtneps_pbh(v);
  if (n >= 16) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), packed);
  } else if (n > 0) {
    _mm256_mask_storeu_epi16(out, static_cast<__mmask16>((1u << n) - 1), packed);
  }
}

// Runs `epilogue(rows, first_row, group, acc)` for every work item, acc being the item's
// [rows][kGroup] float32 products (rows <= kRowBlock), items shared out among the threads.
template <typename Epilogue>
void for_each_item(const at::Tensor& x, const at::Tensor& packed, Epilogue epilogue) {
  const int64_t M = x.size(0), K = x.size(1), groups = packed.size(0);
  const int64_t row_blocks = (M + kRowBlock - 1) / kRowBlock;
  const bf16* a = x.const_data_ptr<bf16>();
  const bf16* w = packed.const_data_ptr<bf16>();
  const int64_t lda = x.stride(0), group_stride = K * kGroup;
  at::parallel_for(0, row_blocks * groups, 1, [&](int64_t begin, int64_t end) {
    alignas(64) float acc[kRowBlock * kGroup];
    for (int64_t item = begin; item < end; ++item) {
      const int64_t first_row = (item / groups) * kRowBlock, g = item % groups;
      const int64_t rows = std::min(kRowBlock, M - first_row);
      // The next item's weights are fetched while this one computes, from 16 rows. With fewer, the
      // product goes at memory's pace anyway, the hardware prefetcher streams the weights, and lines
      // asked for too only compete with it (docs/perf-log.md#avx512-bf16-gemms).
      const bf16* next = rows >= 16 && item + 1 < end ? w + ((item + 1) % groups) * group_stride : nullptr;
      tracevllm::dot_product_gemm(rows, kGroup, K, lda, kGroup, kGroup, false, a + first_row * lda,
                                  w + g * group_stride, acc, next, next ? group_stride * 2 : 0);
      epilogue(rows, first_row, g, acc);
    }
  });
}

void check(const at::Tensor& x, const at::Tensor& packed, const char* op) {
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1 && x.scalar_type() == at::kBFloat16,
              op, ": x must be bf16 [rows, in_features] with unit stride");
  TORCH_CHECK(packed.dim() == 4 && packed.is_contiguous() && packed.scalar_type() == at::kBFloat16 &&
                  packed.size(1) * 2 == x.size(1) && packed.size(2) == kGroup && packed.size(3) == 2,
              op, ": packed must be bf16 [groups, in_features / 2, 64, 2] (cpu_vec_gemm.py's pack)");
}

// x [M, K] W^T (+ bias) -> [M, N], W packed by cpu_vec_gemm.py's pack_linear (N <= 64 groups).
at::Tensor vec_linear(const at::Tensor& x, const at::Tensor& packed, int64_t N, const std::optional<at::Tensor>& bias) {
  check(x, packed, "vec_linear");
  TORCH_CHECK(N > 0 && N <= packed.size(0) * kGroup && N > (packed.size(0) - 1) * kGroup,
              "vec_linear: out_features does not match the packed weight");
  TORCH_CHECK(!bias || (bias->is_contiguous() && bias->numel() == N && bias->scalar_type() == at::kBFloat16),
              "vec_linear: bias must be bf16 [out_features]");
  at::Tensor out = at::empty({x.size(0), N}, x.options());
  bf16* o = out.mutable_data_ptr<bf16>();
  const bf16* b = bias ? bias->const_data_ptr<bf16>() : nullptr;
  for_each_item(x, packed, [&](int64_t rows, int64_t first_row, int64_t g, const float* acc) {
    for (int64_t j = 0; j < kGroup; j += 16) {
      const int64_t col = g * kGroup + j, n = std::min<int64_t>(16, N - col);
      if (n <= 0) break;
      const Vec bias16 = b ? Vec(load_bf16(b + col, n)) : Vec(0.f);
      for (int64_t r = 0; r < rows; ++r)
        store_bf16(o + (first_row + r) * N + col, Vec::loadu(acc + r * kGroup + j) + bias16, n);
    }
  });
  return out;
}

// silu(x W_gate^T) * (x W_up^T) -> [M, I], gate and up packed together by pack_gated (I a multiple of 32).
at::Tensor vec_silu_and_mul_linear(const at::Tensor& x, const at::Tensor& packed, int64_t I) {
  check(x, packed, "vec_silu_and_mul_linear");
  constexpr int64_t half = kGroup / 2;  // a group: 32 gate features, then the same 32 of up
  TORCH_CHECK(I > 0 && I % half == 0 && I == packed.size(0) * half,
              "vec_silu_and_mul_linear: intermediate size does not match the packed weight");
  at::Tensor out = at::empty({x.size(0), I}, x.options());
  bf16* o = out.mutable_data_ptr<bf16>();
  const Vec one(1.f);
  for_each_item(x, packed, [&](int64_t rows, int64_t first_row, int64_t g, const float* acc) {
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < half; j += 16) {
        const Vec gate = round_bf16(Vec::loadu(acc + r * kGroup + j));
        const Vec up = round_bf16(Vec::loadu(acc + r * kGroup + half + j));
        const Vec silu = round_bf16(silu_f32(gate));
        store_bf16(o + (first_row + r) * I + g * half + j, silu * up, 16);
      }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(tracevllm, m) {
  m.def("vec_linear(Tensor x, Tensor packed, int out_features, Tensor? bias) -> Tensor");
  m.def("vec_silu_and_mul_linear(Tensor x, Tensor packed, int intermediate_size) -> Tensor");
}

TORCH_LIBRARY_IMPL(tracevllm, CPU, m) {
  m.impl("vec_linear", &vec_linear);
  m.impl("vec_silu_and_mul_linear", &vec_silu_and_mul_linear);
}
