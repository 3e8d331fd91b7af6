// The element-wise and attention parts of a Llama-family decoder layer, fused per row (see
// kernels.h): RMSNorm, the residual add, SiLU-gated product, and rotary embedding + cache
// write + masked softmax attention. Each computes a range of rows (or of attention rows and
// heads) so that the decoder's threads can split one layer among them (decoder.cpp).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels.h"

namespace speccore {
namespace {

template <typename T>
void norm_row(const T* x, const T* weight, double eps, int64_t H, T* out) {
  const float r = 1.0f / std::sqrt(dot(x, x, H) / static_cast<float>(H) + static_cast<float>(eps));
  for (int64_t h = 0; h < H; ++h) {
    const T normed = static_cast<T>(static_cast<float>(x[h]) * r);
    out[h] = static_cast<T>(static_cast<float>(weight[h]) * static_cast<float>(normed));
  }
}

}  // namespace

void rms_norm_rows(const at::Tensor& x, const at::Tensor& weight, double eps, at::Tensor& out, int64_t m0,
                   int64_t m1) {
  const int64_t H = x.size(1);
  SPECCORE_FLOATING(x.scalar_type(), "rms_norm", [&] {
    const scalar_t* xp = x.data_ptr<scalar_t>();
    scalar_t* op = out.data_ptr<scalar_t>();
    for (int64_t m = m0; m < m1; ++m) norm_row(xp + m * H, weight.data_ptr<scalar_t>(), eps, H, op + m * H);
  });
}

void add_rms_norm_rows(at::Tensor& x, const at::Tensor& delta, const at::Tensor& weight, double eps,
                       at::Tensor& out, int64_t m0, int64_t m1) {
  const int64_t H = x.size(1);
  SPECCORE_FLOATING(x.scalar_type(), "add_rms_norm", [&] {
    const scalar_t* dp = delta.data_ptr<scalar_t>();
    for (int64_t m = m0; m < m1; ++m) {
      scalar_t* row = x.data_ptr<scalar_t>() + m * H;
      for (int64_t h = 0; h < H; ++h)
        row[h] = static_cast<scalar_t>(static_cast<float>(row[h]) + static_cast<float>(dp[m * H + h]));
      norm_row(row, weight.data_ptr<scalar_t>(), eps, H, out.data_ptr<scalar_t>() + m * H);
    }
  });
}

void silu_mul_rows(const at::Tensor& gate_up, at::Tensor& out, int64_t m0, int64_t m1) {
  const int64_t I = gate_up.size(1) / 2;
  SPECCORE_FLOATING(gate_up.scalar_type(), "silu_mul", [&] {
    const scalar_t* gp = gate_up.data_ptr<scalar_t>();
    scalar_t* op = out.data_ptr<scalar_t>();
    for (int64_t m = m0; m < m1; ++m)
      for (int64_t i = 0; i < I; ++i) {
        const float g = static_cast<float>(gp[m * 2 * I + i]), u = static_cast<float>(gp[m * 2 * I + I + i]);
        op[m * I + i] = static_cast<scalar_t>(g / (1.0f + std::exp(-g)) * u);
      }
  });
}

namespace {

template <typename T>
void rotate(const T* x, const T* cos, const T* sin, int64_t D, float* out) {
  const int64_t half = D / 2;
  for (int64_t d = 0; d < D; ++d) {
    const float turned = d < half ? -static_cast<float>(x[d + half]) : static_cast<float>(x[d - half]);
    out[d] = static_cast<float>(x[d]) * static_cast<float>(cos[d]) + turned * static_cast<float>(sin[d]);
  }
}

template <typename T>
struct Row {
  const float* query;  // rotated, [head_dim]
  const bool* seen;    // [width]: True = attend
  const T* keys;       // [capacity, head_dim] of the query's key/value head
  const T* values;
  T* out;  // [head_dim]
};

// One query row's masked softmax attention, the head dimension DV whole vectors: scores as
// dot() sums them, the values summed column by column in order, in registers.
template <typename T, int DV>
void attend_row(const Row<T>& r, int64_t width, float scaling, float* scores) {
  constexpr int64_t D = DV * VL;
  vf query[DV];
  for (int c = 0; c < DV; ++c) query[c] = load(r.query + c * VL);
  float top = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < width; ++j)
    if (r.seen[j]) {
      vf sum = {};
      for (int c = 0; c < DV; ++c) sum += query[c] * load(r.keys + j * D + c * VL);
      scores[j] = lanes_sum(sum) * scaling;
      top = std::max(top, scores[j]);
    }
  vf acc[DV] = {};
  float total = 0.0f;
  for (int64_t j = 0; j < width; ++j)
    if (r.seen[j]) {
      const float e = std::exp(scores[j] - top);
      total += e;
      const vf weight = vf{} + e;
      for (int c = 0; c < DV; ++c) acc[c] += weight * load(r.values + j * D + c * VL);
    }
  for (int c = 0; c < DV; ++c)
    for (int l = 0; l < VL; ++l) r.out[c * VL + l] = static_cast<T>(acc[c][l] / total);
}

// The same for any head dimension (scores through dot(), its tail included).
template <typename T>
void attend_row_any(const Row<T>& r, int64_t D, int64_t width, float scaling, float* scores, float* acc) {
  float top = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < width; ++j)
    if (r.seen[j]) {
      scores[j] = dot(r.query, r.keys + j * D, D) * scaling;
      top = std::max(top, scores[j]);
    }
  float total = 0.0f;
  std::fill(acc, acc + D, 0.0f);
  for (int64_t j = 0; j < width; ++j)
    if (r.seen[j]) {
      const float e = std::exp(scores[j] - top);
      total += e;
      for (int64_t d = 0; d < D; ++d) acc[d] += e * static_cast<float>(r.values[j * D + d]);
    }
  for (int64_t d = 0; d < D; ++d) r.out[d] = static_cast<T>(acc[d] / total);
}

template <typename T>
void rotate_typed(const Attention& a, int64_t r0, int64_t r1) {
  const int64_t H = a.heads, KV = a.kv_heads, D = a.cos.size(2), row = (H + 2 * KV) * D, cap = a.keys.size(2);
  const T* src = a.qkv.data_ptr<T>();
  T* kp = a.keys.data_ptr<T>();
  T* vp = a.values.data_ptr<T>();
  float* queries = a.queries.data_ptr<float>();
  std::vector<float> turned(D);
  for (int64_t r = r0; r < r1; ++r) {  // r = b * q + i
    const int64_t b = r / a.q, i = r % a.q;
    const T* x = src + r * row;
    const T* c = a.cos.data_ptr<T>() + r * D;
    const T* s = a.sin.data_ptr<T>() + r * D;
    for (int64_t h = 0; h < H; ++h) rotate(x + h * D, c, s, D, queries + (r * H + h) * D);
    for (int64_t g = 0; g < KV; ++g) {
      const int64_t slot = ((b * KV + g) * cap + a.lengths[b] + i) * D;
      rotate(x + (H + g) * D, c, s, D, turned.data());
      for (int64_t d = 0; d < D; ++d) {
        kp[slot + d] = static_cast<T>(turned[d]);
        vp[slot + d] = x[(H + KV + g) * D + d];
      }
    }
  }
}

template <typename T>
void attend_typed(const Attention& a, int64_t t0, int64_t t1) {
  const int64_t H = a.heads, D = a.cos.size(2), cap = a.keys.size(2), groups = H / a.kv_heads, q = a.q;
  const int64_t width = a.width, KV = a.kv_heads;
  const float* queries = a.queries.data_ptr<float>();
  const T* kp = a.keys.data_ptr<T>();
  const T* vp = a.values.data_ptr<T>();
  T* op = a.out.data_ptr<T>();
  std::vector<float> scores(width), acc(D);
  for (int64_t t = t0; t < t1; ++t) {  // t = (b * H + h) * q + i
    const int64_t b = t / (H * q), h = t / q % H, i = t % q, g = h / groups;
    const Row<T> row{queries + ((b * q + i) * H + h) * D, a.mask + (b * q + i) * width,
                     kp + (b * KV + g) * cap * D, vp + (b * KV + g) * cap * D, op + (b * q + i) * H * D + h * D};
    if (D == 4 * VL) {
      attend_row<T, 4>(row, width, a.scaling, scores.data());
    } else if (D == 8 * VL) {
      attend_row<T, 8>(row, width, a.scaling, scores.data());
    } else {
      attend_row_any(row, D, width, a.scaling, scores.data(), acc.data());
    }
  }
}

}  // namespace

void rotate_rows(const Attention& a, int64_t r0, int64_t r1) {
  SPECCORE_FLOATING(a.qkv.scalar_type(), "attend", [&] { rotate_typed<scalar_t>(a, r0, r1); });
}

void attend_rows(const Attention& a, int64_t t0, int64_t t1) {
  SPECCORE_FLOATING(a.qkv.scalar_type(), "attend", [&] { attend_typed<scalar_t>(a, t0, t1); });
}

void check_attention(const Attention& a) {
  const int64_t B = a.batch, q = a.q, width = a.width, D = a.cos.size(2);
  TORCH_CHECK(a.cos.dim() == 3 && a.cos.size(0) == B && a.cos.size(1) == q && a.cos.is_contiguous() &&
                  a.sin.sizes() == a.cos.sizes() && a.sin.is_contiguous(),
              "attention: cos/sin [batch, q, head_dim]");
  TORCH_CHECK(a.qkv.size(0) == B * q && a.qkv.size(1) == (a.heads + 2 * a.kv_heads) * D, "attention: qkv rows");
  TORCH_CHECK(a.heads % a.kv_heads == 0, "attention: heads must be a multiple of kv_heads");
  TORCH_CHECK(a.keys.is_contiguous() && a.values.is_contiguous() && a.keys.sizes() == a.values.sizes() &&
                  a.keys.dim() == 4 && a.keys.size(0) >= B && a.keys.size(1) == a.kv_heads && a.keys.size(3) == D &&
                  a.keys.size(2) >= width,
              "attention: cache buffers [slots, kv_heads, capacity, head_dim]");
  const at::ScalarType t = a.qkv.scalar_type();
  TORCH_CHECK(a.cos.scalar_type() == t && a.sin.scalar_type() == t && a.keys.scalar_type() == t &&
                  a.values.scalar_type() == t, "attention: one dtype");
  for (int64_t b = 0; b < B; ++b)
    TORCH_CHECK(a.lengths[b] >= 0 && a.lengths[b] + q <= width, "attention: the block runs past the mask's width");
}

}  // namespace speccore
