// AVX-512 arithmetic that several attention ops share: an exp for probabilities that are rounded to
// bf16 next (the prefill op, cpu_amx_prefill.cpp, and the decode op on AVX512-BF16, cpu_vec_decode.cpp),
// and the lane sums of 16 vectors at once (that decode op and cpu_paged_decode.cpp). Header-only;
// each op's build compiles it in (cpu_extension.py digests the headers a source includes, so a change
// here rebuilds every op that uses it). Empty where the build is not for AVX-512.

#pragma once

#include <immintrin.h>

#if defined(CPU_CAPABILITY_AVX512)
namespace tracevllm {

// exp(y) for y <= 0, for probabilities that are rounded to bf16 next (8 bits of mantissa): 2^t with
// t = y log2(e), split as 2^k * 2^f with k = round(t) and a degree-3 polynomial for 2^f on
// [-0.5, 0.5] (relative error under 1e-4, against bf16's 4e-3; two fewer FMAs than degree 5). Below
// 2^-126 it gives 0, and exactly 0 for a masked -inf. `t` is passed in, already scaled to base 2.
inline __m512 exp2_for_bf16(__m512 t) {
  const __m512 floor_t = _mm512_set1_ps(-126.f);
  const __mmask16 visible = _mm512_cmp_ps_mask(t, floor_t, _CMP_GT_OQ);
  const __m512 tc = _mm512_max_ps(t, floor_t);
  const __m512 k = _mm512_roundscale_ps(tc, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(tc, k);
  // Fitted to 2^f for the least relative error on [-0.5, 0.5] (at most 7.7e-5; Taylor's would be 8e-4).
  __m512 p = _mm512_set1_ps(0.055088684f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.24260405f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.69327623f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.99992895f));
  return _mm512_maskz_scalef_ps(visible, p, k);
}

// Lane i of the result = the sum of the lanes of v[i], for 16 vectors: a transpose-and-add tree of
// 45 instructions instead of 16 separate reductions of 8 each.
inline __m512 sum_lanes_16(const __m512 (&v)[16]) {
  __m512 a[8], b[4], c[2];
  for (int k = 0; k < 8; ++k)  // per 128-bit lane: [x0+x2, y0+y2, x1+x3, y1+y3] of x = v[2k], y = v[2k + 1]
    a[k] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * k], v[2 * k + 1]), _mm512_unpackhi_ps(v[2 * k], v[2 * k + 1]));
  for (int m = 0; m < 4; ++m)  // per 128-bit lane: the lane's sum of v[4m], v[4m + 1], v[4m + 2], v[4m + 3]
    b[m] = _mm512_add_ps(_mm512_shuffle_ps(a[2 * m], a[2 * m + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(a[2 * m], a[2 * m + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  for (int m = 0; m < 2; ++m)  // 128-bit lanes: the sums of lanes 0+1 and 2+3 of b[2m], then of b[2m + 1]
    c[m] = _mm512_add_ps(_mm512_shuffle_f32x4(b[2 * m], b[2 * m + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(b[2 * m], b[2 * m + 1], _MM_SHUFFLE(3, 1, 3, 1)));
  // 128-bit lane m: the whole sums of v[4m .. 4m + 3], in order.
  return _mm512_add_ps(_mm512_shuffle_f32x4(c[0], c[1], _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(c[0], c[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

}  // namespace tracevllm
#endif
