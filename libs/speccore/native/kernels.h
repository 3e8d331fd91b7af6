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
#include <utility>
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

// The lanes of a vector summed in halves: lane i plus lane i + VL/2, then the same over the
// first half of those, down to one (a tree, the same order for every output).
inline float lanes_sum(vf v) {
  float h[VL];
  __builtin_memcpy(h, &v, sizeof(v));
  for (int width = VL / 2; width > 0; width /= 2)
    for (int i = 0; i < width; ++i) h[i] += h[i + width];
  return h[0];
}

// lanes_sum of four vectors at once, in registers: each level adds the lanes lanes_sum adds,
// so every sum has its bits.
inline void lanes_sum4(vf a, vf b, vf c, vf d, float* out) {
  typedef float v8 __attribute__((vector_size(32)));
  typedef float v4 __attribute__((vector_size(16)));
#if defined(__AVX512F__)
  const vf ab = __builtin_shufflevector(a, b, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
                __builtin_shufflevector(a, b, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
  const vf cd = __builtin_shufflevector(c, d, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
                __builtin_shufflevector(c, d, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
  // [a a a a b b b b c c c c d d d d], each lane i (< 4) plus lane i + 4 of its half
  const vf q = __builtin_shufflevector(ab, cd, 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
               __builtin_shufflevector(ab, cd, 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
  const v8 pairs = __builtin_shufflevector(q, q, 0, 1, 4, 5, 8, 9, 12, 13) +
                   __builtin_shufflevector(q, q, 2, 3, 6, 7, 10, 11, 14, 15);
#else
  const vf ab = __builtin_shufflevector(a, b, 0, 1, 2, 3, 8, 9, 10, 11) +
                __builtin_shufflevector(a, b, 4, 5, 6, 7, 12, 13, 14, 15);
  const vf cd = __builtin_shufflevector(c, d, 0, 1, 2, 3, 8, 9, 10, 11) +
                __builtin_shufflevector(c, d, 4, 5, 6, 7, 12, 13, 14, 15);
  const v8 pairs = __builtin_shufflevector(ab, cd, 0, 1, 4, 5, 8, 9, 12, 13) +
                   __builtin_shufflevector(ab, cd, 2, 3, 6, 7, 10, 11, 14, 15);
#endif
  // [a a b b c c d d]: even lane plus odd lane
  const v4 sums = __builtin_shufflevector(pairs, pairs, 0, 2, 4, 6) + __builtin_shufflevector(pairs, pairs, 1, 3, 5, 7);
  __builtin_memcpy(out, &sums, sizeof(sums));
}

// Dot product of n floats in the one order every kernel uses: VL-wide partial sums over
// whole vectors, their lanes summed by lanes_sum, then the tail one by one.
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

// Part `part` of `parts` equal contiguous shares of n items: [first, last).
inline std::pair<int64_t, int64_t> share(int64_t n, int part, int parts) {
  return {n * part / parts, n * (part + 1) / parts};
}

at::Tensor pack(const at::Tensor& weight);
at::Tensor linear(const at::Tensor& rows, const at::Tensor& packed, int64_t out_features,
                  const c10::optional<at::Tensor>& bias);
void check_linear(const at::Tensor& rows, const at::Tensor& packed, int64_t out_features, const char* name);
// Share `part` of `parts` of linear()'s output tiles, into `out` [M, N].
void linear_part(const at::Tensor& x, const at::Tensor& packed, const float* bias, at::Tensor& out, int64_t N,
                 int part, int parts);

// Rows m0..m1 of: RMSNorm; x += delta then RMSNorm; silu(gate) * up of [M, 2I] gate|up.
void rms_norm_rows(const at::Tensor& x, const at::Tensor& weight, double eps, at::Tensor& out, int64_t m0,
                   int64_t m1);
void add_rms_norm_rows(at::Tensor& x, const at::Tensor& delta, const at::Tensor& weight, double eps,
                       at::Tensor& out, int64_t m0, int64_t m1);
void silu_mul_rows(const at::Tensor& gate_up, at::Tensor& out, int64_t m0, int64_t m1);

// One layer's attention over a block of q rows for each of `batch` sequences.
struct Attention {
  at::Tensor qkv;          // [batch * q, (heads + 2 kv_heads) * head_dim]
  at::Tensor cos, sin;     // [batch, q, head_dim]
  at::Tensor keys, values;  // the layer's cache [slots, kv_heads, capacity, head_dim]
  const int64_t* lengths;  // [batch]: where each sequence's block is written
  const bool* mask;        // [batch, q, width]: True = attend
  int64_t batch, q, width, heads, kv_heads;
  float scaling;
  at::Tensor queries;  // float32 [batch * q, heads * head_dim]: the rotated queries
  at::Tensor out;      // [batch * q, heads * head_dim]
};
void check_attention(const Attention& a);
// Rows r0..r1 (b * q + i): rotary embedding, queries kept, keys and values written to the cache.
void rotate_rows(const Attention& a, int64_t r0, int64_t r1);
// Attention is computed in tiles of up to kMaxTile query rows that read one key/value head
// (layer.cpp): attention_tile rows a tile for `parts` threads, attention_tiles counts them, and
// attend_rows computes tiles t0..t1 ((b * kv_heads + g) * tiles + the tile), after every row's
// rotate_rows.
constexpr int kMaxTile = 4;
int64_t attention_tile(const Attention& a, int parts);
int64_t attention_tiles(const Attention& a, int parts);
void attend_rows(const Attention& a, int64_t t0, int64_t t1, int parts);

// A Llama-family decoder over a block, all layers in one parallel region (decoder.cpp).
std::vector<at::Tensor> decoder_forward(at::Tensor& x, const std::vector<at::Tensor>& packed,
                                        const std::vector<int64_t>& out_features,
                                        const std::vector<c10::optional<at::Tensor>>& biases,
                                        const std::vector<at::Tensor>& norms, const std::vector<double>& eps,
                                        const at::Tensor& cos, const at::Tensor& sin,
                                        const std::vector<at::Tensor>& keys, const std::vector<at::Tensor>& values,
                                        const at::Tensor& lengths, const at::Tensor& mask, int64_t heads,
                                        int64_t kv_heads, double scaling, const std::vector<int64_t>& taps,
                                        int64_t threads);

}  // namespace speccore
