// speccore's native CPU kernels: what the translation units share (see native_kernels.py).
//
// Each kernel computes every output from its own row only, in one fixed order, so a row's
// result does not depend on how many rows share the call, on the tile that computes it or on
// the thread that runs it: the row invariance speculative decoding needs (a draft block
// verified in one pass gets the bits of decoding its tokens one at a time). Sums run in
// float32 whatever the tensors' dtype and are rounded once to it. The vector width is the
// build host's (-march=native): 16 float lanes with AVX-512, else 8.
#pragma once

#include <ATen/ATen.h>
#include <c10/util/BFloat16.h>

#include <cstdint>
#include <vector>

namespace speccore {

#if defined(__AVX512F__)
constexpr int VL = 16;
#else
constexpr int VL = 8;
#endif

typedef float vf __attribute__((vector_size(VL * 4)));
typedef uint16_t vh __attribute__((vector_size(VL * 2)));
typedef uint32_t vu __attribute__((vector_size(VL * 4)));

inline vf load(const float* p) {
  vf v;
  __builtin_memcpy(&v, p, sizeof(v));
  return v;
}

inline vf load(const c10::BFloat16* p) {  // bfloat16 is the top half of a float32
  vh h;
  __builtin_memcpy(&h, p, sizeof(h));
  vu u = __builtin_convertvector(h, vu) << 16;
  vf f;
  __builtin_memcpy(&f, &u, sizeof(f));
  return f;
}

inline float lanes_sum(vf v) {
  float s = v[0];
  for (int i = 1; i < VL; ++i) s += v[i];
  return s;
}

// Dot product of n floats in the one order every kernel uses: VL-wide partial sums over
// whole vectors, their lanes left to right, then the tail one by one.
template <typename A, typename B>
inline float dot(const A* a, const B* b, int64_t n) {
  const int64_t whole = n - n % VL;
  vf acc = {};
  for (int64_t k = 0; k < whole; k += VL) acc += load(a + k) * load(b + k);
  float s = lanes_sum(acc);
  for (int64_t k = whole; k < n; ++k) s += static_cast<float>(a[k]) * static_cast<float>(b[k]);
  return s;
}

// Dispatch on float32 / bfloat16 (the dtypes speccore's CPU kernels run).
#define SPECCORE_FLOATING(TYPE, NAME, ...)                                    \
  [&] {                                                                       \
    if ((TYPE) == at::kFloat) {                                               \
      using scalar_t = float;                                                 \
      return __VA_ARGS__();                                                   \
    }                                                                         \
    TORCH_CHECK((TYPE) == at::kBFloat16, NAME, ": float32 or bfloat16 only"); \
    using scalar_t = c10::BFloat16;                                           \
    return __VA_ARGS__();                                                     \
  }()

at::Tensor pack(const at::Tensor& weight);
at::Tensor linear(const at::Tensor& rows, const at::Tensor& packed, int64_t out_features,
                  const c10::optional<at::Tensor>& bias);
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);
at::Tensor add_rms_norm(at::Tensor& x, const at::Tensor& delta, const at::Tensor& weight, double eps);
at::Tensor silu_mul(const at::Tensor& gate_up);
at::Tensor attend(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin, at::Tensor& keys,
                  at::Tensor& values, const at::Tensor& lengths, const at::Tensor& mask, int64_t heads,
                  int64_t kv_heads, double scaling);
at::Tensor decoder_layer(at::Tensor& x, const at::Tensor& normed, const std::vector<at::Tensor>& packed,
                         const std::vector<int64_t>& out_features,
                         const std::vector<c10::optional<at::Tensor>>& biases,
                         const at::Tensor& mlp_norm, double mlp_eps, const at::Tensor& next_norm, double next_eps,
                         const at::Tensor& cos, const at::Tensor& sin, at::Tensor& keys, at::Tensor& values,
                         const at::Tensor& lengths, const at::Tensor& mask, int64_t heads, int64_t kv_heads,
                         double scaling, int64_t matmul_threads);

}  // namespace speccore
