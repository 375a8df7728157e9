// A decoder layer's element-wise chains on CPU, each one pass over memory: RMSNorm with its residual
// add, SiLU-and-mul, and the RoPE rotation. Built once per machine (cpu_norm_act.py, through
// attention/ops/cpu_extension.py) and registered as torch.ops.tracevllm.fused_rms_norm,
// .silu_and_mul and .rotate_neox. The plain PyTorch code of each is rms_norm (layernorm.py),
// silu_and_mul (activation.py) and rotate (rotary_embedding.py).
//
// Every value is rounded to the activations' dtype (bfloat16, float16; float32 is never rounded)
// exactly where the plain code rounds it: after the residual add, after the normalisation and after
// the weight; after the SiLU and after the product; after each of RoPE's two products and after
// their sum. So a reduced-precision model sees the plain code's activations, except where two float32
// computations differ in their last bit: the order of the RMS sum, and exp inside the SiLU.
//
// Rows (tokens) are shared out among torch's threads, each row's elements go through float vectors
// `kStep` at a time (two float vectors: one vector of bfloat16). A row of the input may be a strided
// view (q and k are slices of the qkv projection); the outputs are new contiguous tensors.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <tuple>
#include <type_traits>

namespace {

using Vec = at::vec::Vectorized<float>;  // 16 floats with AVX-512, 8 with AVX2
constexpr int64_t kStep = 2 * Vec::size();

// Rows per thread task: enough elements that a thread's share outweighs waking it.
inline int64_t grain(int64_t row_width) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(row_width, 1)); }

struct Pair {
  Vec lo, hi;
};

// The n <= kStep elements at p, as float32.
template <typename T>
inline Pair load(const T* p, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    const int64_t first = std::min<int64_t>(n, Vec::size());
    return {Vec::loadu(p, first), n > first ? Vec::loadu(p + first, n - first) : Vec(0.f)};
  } else {
    auto [lo, hi] = at::vec::convert_to_float<T>(at::vec::Vectorized<T>::loadu(p, n));
    return {lo, hi};
  }
}

// The n <= kStep elements of v, rounded to T, at p.
template <typename T>
inline void store(T* p, const Pair& v, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    const int64_t first = std::min<int64_t>(n, Vec::size());
    v.lo.store(p, first);
    if (n > first) v.hi.store(p + first, n - first);
  } else {
    at::vec::convert_from_float<T>(v.lo, v.hi).store(p, n);
  }
}

// v rounded to T and back: what the plain code holds after an operation on T tensors.
template <typename T>
inline Pair round(const Pair& v) {
  if constexpr (std::is_same_v<T, float>) {
    return v;
  } else {
    auto [lo, hi] = at::vec::convert_to_float<T>(at::vec::convert_from_float<T>(v.lo, v.hi));
    return {lo, hi};
  }
}

inline Pair operator+(const Pair& a, const Pair& b) { return {a.lo + b.lo, a.hi + b.hi}; }
inline Pair operator*(const Pair& a, const Pair& b) { return {a.lo * b.lo, a.hi * b.hi}; }
inline Pair operator*(const Pair& a, const Vec& b) { return {a.lo * b, a.hi * b}; }

// ---- RMSNorm -------------------------------------------------------------------------------------

// out = weight * norm(s), s = x (+ residual); with a residual, s is written to `sum` too.
template <typename T>
void rms_norm_rows(const at::Tensor& x, const at::Tensor& weight, double eps, const at::Tensor* residual,
                   at::Tensor& out, at::Tensor* sum) {
  const int64_t rows = x.size(0), width = x.size(1);
  const T* xp = x.data_ptr<T>();
  const T* wp = weight.data_ptr<T>();
  const T* rp = residual ? residual->data_ptr<T>() : nullptr;
  T* op = out.data_ptr<T>();
  T* sp = sum ? sum->data_ptr<T>() : nullptr;
  const int64_t x_stride = x.stride(0), r_stride = residual ? residual->stride(0) : 0;
  at::parallel_for(0, rows, grain(width), [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const T* xr = xp + row * x_stride;
      const T* rr = rp ? rp + row * r_stride : nullptr;
      T* sr = sp ? sp + row * width : nullptr;
      T* orow = op + row * width;
      Vec squares(0.f);
      for (int64_t i = 0; i < width; i += kStep) {
        const int64_t n = std::min(kStep, width - i);
        Pair s = load(xr + i, n);
        if (rr) {
          s = round<T>(s + load(rr + i, n));  // the residual stream, in the activations' dtype
          store(sr + i, s, n);
        }
        // Each square rounded before it is added, as pow(2).mean() does. Lanes past n hold zeros
        // (loadu of n elements), so they add nothing.
        squares = squares + s.lo * s.lo + s.hi * s.hi;
      }
      const float sum_of_squares = at::vec::vec_reduce_all<float>([](Vec& a, Vec& b) { return a + b; }, squares);
      const Vec scale(1.f / std::sqrt(sum_of_squares / static_cast<float>(width) + static_cast<float>(eps)));
      const T* src = rr ? sr : xr;
      for (int64_t i = 0; i < width; i += kStep) {
        const int64_t n = std::min(kStep, width - i);
        const Pair normed = round<T>(load(src + i, n) * scale);
        store(orow + i, load(wp + i, n) * normed, n);
      }
    }
  });
}

std::tuple<at::Tensor, at::Tensor> fused_rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps,
                                                  const std::optional<at::Tensor>& residual) {
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1, "fused_rms_norm: x must be [tokens, hidden] with unit stride");
  TORCH_CHECK(weight.is_contiguous() && weight.numel() == x.size(1) && weight.scalar_type() == x.scalar_type(),
              "fused_rms_norm: weight must be [hidden], contiguous, of x's dtype");
  if (residual) {
    TORCH_CHECK(residual->sizes() == x.sizes() && residual->stride(1) == 1 &&
                    residual->scalar_type() == x.scalar_type(),
                "fused_rms_norm: residual must be like x");
  }
  at::Tensor out = at::empty(x.sizes(), x.options());
  at::Tensor sum = residual ? at::empty(x.sizes(), x.options()) : at::Tensor();
  const at::Tensor* r = residual ? &*residual : nullptr;
  at::Tensor* s = residual ? &sum : nullptr;
  switch (x.scalar_type()) {
    case at::kFloat: rms_norm_rows<float>(x, weight, eps, r, out, s); break;
    case at::kBFloat16: rms_norm_rows<c10::BFloat16>(x, weight, eps, r, out, s); break;
    case at::kHalf: rms_norm_rows<c10::Half>(x, weight, eps, r, out, s); break;
    default: TORCH_CHECK(false, "fused_rms_norm: float32, bfloat16 or float16, not ", x.scalar_type());
  }
  return {out, sum};
}

// ---- SiLU-and-mul --------------------------------------------------------------------------------

// [tokens, 2d] (gate | up) -> silu(gate) * up, [tokens, d].
template <typename T>
void silu_and_mul_rows(const at::Tensor& x, at::Tensor& out) {
  const int64_t rows = x.size(0), d = out.size(1), x_stride = x.stride(0);
  const T* xp = x.data_ptr<T>();
  T* op = out.data_ptr<T>();
  const Vec one(1.f);
  at::parallel_for(0, rows, grain(2 * d), [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const T* gate = xp + row * x_stride;
      const T* up = gate + d;
      T* orow = op + row * d;
      for (int64_t i = 0; i < d; i += kStep) {
        const int64_t n = std::min(kStep, d - i);
        const Pair g = load(gate + i, n);
        const Pair silu = round<T>(Pair{g.lo / (one + g.lo.neg().exp()), g.hi / (one + g.hi.neg().exp())});
        store(orow + i, silu * load(up + i, n), n);
      }
    }
  });
}

at::Tensor silu_and_mul(const at::Tensor& x) {
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1 && x.size(1) % 2 == 0,
              "silu_and_mul: x must be [tokens, 2 * d] with unit stride");
  at::Tensor out = at::empty({x.size(0), x.size(1) / 2}, x.options());
  switch (x.scalar_type()) {
    case at::kFloat: silu_and_mul_rows<float>(x, out); break;
    case at::kBFloat16: silu_and_mul_rows<c10::BFloat16>(x, out); break;
    case at::kHalf: silu_and_mul_rows<c10::Half>(x, out); break;
    default: TORCH_CHECK(false, "silu_and_mul: float32, bfloat16 or float16, not ", x.scalar_type());
  }
  return out;
}

// ---- RoPE ----------------------------------------------------------------------------------------

// Each head of x [tokens, heads * head_dim] rotated the "neox" way: x * cos + rotate_half(x) * sin,
// rotate_half([a, b]) = [-b, a]; cos and sin [tokens, head_dim], contiguous.
template <typename T>
at::Tensor rotate_rows(const at::Tensor& x, const T* cos, const T* sin, int64_t head_dim) {
  const int64_t rows = x.size(0), width = x.size(1), half = head_dim / 2, x_stride = x.stride(0);
  at::Tensor out = at::empty({rows, width}, x.options());
  const T* xp = x.data_ptr<T>();
  T* op = out.data_ptr<T>();
  at::parallel_for(0, rows, grain(width), [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const T* c = cos + row * head_dim;
      const T* s = sin + row * head_dim;
      for (int64_t head = 0; head < width; head += head_dim) {
        const T* a = xp + row * x_stride + head;  // the head's first half; its second half is a + half
        T* o = op + row * width + head;
        for (int64_t i = 0; i < half; i += kStep) {
          const int64_t n = std::min(kStep, half - i);
          const Pair x1 = load(a + i, n), x2 = load(a + half + i, n);
          // First half: x1 * cos - x2 * sin; second half: x2 * cos + x1 * sin (each product rounded).
          const Pair first_cos = round<T>(x1 * load(c + i, n)), first_sin = round<T>(x2 * load(s + i, n));
          store(o + i, Pair{first_cos.lo - first_sin.lo, first_cos.hi - first_sin.hi}, n);
          const Pair second_cos = round<T>(x2 * load(c + half + i, n));
          const Pair second_sin = round<T>(x1 * load(s + half + i, n));
          store(o + half + i, second_cos + second_sin, n);
        }
      }
    }
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor> rotate_neox(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                                               const at::Tensor& sin, int64_t head_dim) {
  TORCH_CHECK(head_dim % 2 == 0, "rotate_neox: head_dim must be even");
  for (const at::Tensor* x : {&q, &k}) {
    TORCH_CHECK(x->dim() == 2 && x->stride(1) == 1 && x->size(1) % head_dim == 0 && x->size(0) == q.size(0) &&
                    x->scalar_type() == q.scalar_type(),
                "rotate_neox: q and k must be [tokens, heads * head_dim] with unit stride, of one dtype");
  }
  for (const at::Tensor* t : {&cos, &sin}) {
    TORCH_CHECK(t->is_contiguous() && t->numel() == q.size(0) * head_dim && t->scalar_type() == q.scalar_type(),
                "rotate_neox: cos and sin must be contiguous [tokens, 1, head_dim] of q's dtype");
  }
  switch (q.scalar_type()) {
#define TRACEVLLM_ROTATE(T)                                                                                \
  return {rotate_rows<T>(q, cos.data_ptr<T>(), sin.data_ptr<T>(), head_dim),                              \
          rotate_rows<T>(k, cos.data_ptr<T>(), sin.data_ptr<T>(), head_dim)};
    case at::kFloat: TRACEVLLM_ROTATE(float)
    case at::kBFloat16: TRACEVLLM_ROTATE(c10::BFloat16)
    case at::kHalf: TRACEVLLM_ROTATE(c10::Half)
#undef TRACEVLLM_ROTATE
    default: TORCH_CHECK(false, "rotate_neox: float32, bfloat16 or float16, not ", q.scalar_type());
  }
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(tracevllm, m) {
  m.def("fused_rms_norm(Tensor x, Tensor weight, float eps, Tensor? residual) -> (Tensor, Tensor)");
  m.def("silu_and_mul(Tensor x) -> Tensor");
  m.def("rotate_neox(Tensor q, Tensor k, Tensor cos, Tensor sin, int head_dim) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(tracevllm, CPU, m) {
  m.impl("fused_rms_norm", &fused_rms_norm);
  m.impl("silu_and_mul", &silu_and_mul);
  m.impl("rotate_neox", &rotate_neox);
}
