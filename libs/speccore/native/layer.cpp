// The element-wise and attention parts of a Llama-family decoder layer, fused per row (see
// kernels.h): RMSNorm, the residual add, SiLU-gated product, and rotary embedding + cache
// write + masked softmax attention in one call. Python-level torch ops cost a few
// microseconds each and a decoder layer runs a few dozen of them; at batch 1 on a CPU that
// is a good part of a decoding step.
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels.h"

namespace speccore {
namespace {

// Rows per parallel chunk: small blocks (decoding, verifying drafts) stay on one thread.
constexpr int64_t ROW_GRAIN = 32;

template <typename T>
void norm_row(const T* x, const T* weight, double eps, int64_t H, T* out) {
  const float r = 1.0f / std::sqrt(dot(x, x, H) / static_cast<float>(H) + static_cast<float>(eps));
  for (int64_t h = 0; h < H; ++h) {
    const T normed = static_cast<T>(static_cast<float>(x[h]) * r);
    out[h] = static_cast<T>(static_cast<float>(weight[h]) * static_cast<float>(normed));
  }
}

void check_rows(const at::Tensor& x, const char* name) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), name, ": contiguous [rows, features]");
}

}  // namespace

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  check_rows(x, "rms_norm");
  TORCH_CHECK(weight.scalar_type() == x.scalar_type() && weight.numel() == x.size(1), "rms_norm: weight");
  auto out = at::empty_like(x);
  const int64_t H = x.size(1);
  SPECCORE_FLOATING(x.scalar_type(), "rms_norm", [&] {
    const scalar_t* xp = x.data_ptr<scalar_t>();
    const scalar_t* wp = weight.contiguous().data_ptr<scalar_t>();
    scalar_t* op = out.data_ptr<scalar_t>();
    at::parallel_for(0, x.size(0), ROW_GRAIN, [&](int64_t m0, int64_t m1) {
      for (int64_t m = m0; m < m1; ++m) norm_row(xp + m * H, wp, eps, H, op + m * H);
    });
  });
  return out;
}

at::Tensor add_rms_norm(at::Tensor& x, const at::Tensor& delta, const at::Tensor& weight, double eps) {
  check_rows(x, "add_rms_norm");
  TORCH_CHECK(delta.sizes() == x.sizes() && delta.scalar_type() == x.scalar_type(), "add_rms_norm: delta");
  TORCH_CHECK(weight.scalar_type() == x.scalar_type() && weight.numel() == x.size(1), "add_rms_norm: weight");
  auto d = delta.contiguous();
  auto out = at::empty_like(x);
  const int64_t H = x.size(1);
  SPECCORE_FLOATING(x.scalar_type(), "add_rms_norm", [&] {
    scalar_t* xp = x.data_ptr<scalar_t>();
    const scalar_t* dp = d.data_ptr<scalar_t>();
    const scalar_t* wp = weight.contiguous().data_ptr<scalar_t>();
    scalar_t* op = out.data_ptr<scalar_t>();
    at::parallel_for(0, x.size(0), ROW_GRAIN, [&](int64_t m0, int64_t m1) {
      for (int64_t m = m0; m < m1; ++m) {
        scalar_t* row = xp + m * H;
        for (int64_t h = 0; h < H; ++h)
          row[h] = static_cast<scalar_t>(static_cast<float>(row[h]) + static_cast<float>(dp[m * H + h]));
        norm_row(row, wp, eps, H, op + m * H);
      }
    });
  });
  return out;
}

at::Tensor silu_mul(const at::Tensor& gate_up) {
  check_rows(gate_up, "silu_mul");
  const int64_t I = gate_up.size(1) / 2;
  auto out = at::empty({gate_up.size(0), I}, gate_up.options());
  SPECCORE_FLOATING(gate_up.scalar_type(), "silu_mul", [&] {
    const scalar_t* gp = gate_up.data_ptr<scalar_t>();
    scalar_t* op = out.data_ptr<scalar_t>();
    at::parallel_for(0, gate_up.size(0), ROW_GRAIN, [&](int64_t m0, int64_t m1) {
      for (int64_t m = m0; m < m1; ++m)
        for (int64_t i = 0; i < I; ++i) {
          const float g = static_cast<float>(gp[m * 2 * I + i]), u = static_cast<float>(gp[m * 2 * I + I + i]);
          op[m * I + i] = static_cast<scalar_t>(g / (1.0f + std::exp(-g)) * u);
        }
    });
  });
  return out;
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
void attend_typed(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin, at::Tensor& keys,
                  at::Tensor& values, const int64_t* lengths, const bool* mask, int64_t B, int64_t q,
                  int64_t width, int64_t H, int64_t KV, float scaling, at::Tensor& out) {
  const int64_t D = cos.size(2), row = (H + 2 * KV) * D, cap = keys.size(2), groups = H / KV;
  const T* src = qkv.data_ptr<T>();
  const T* cp = cos.data_ptr<T>();
  const T* sp = sin.data_ptr<T>();
  T* kp = keys.data_ptr<T>();
  T* vp = values.data_ptr<T>();
  T* op = out.data_ptr<T>();
  std::vector<float> queries(B * q * H * D), turned(D);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < q; ++i) {
      const T* x = src + (b * q + i) * row;
      const T* c = cp + (b * q + i) * D;
      const T* s = sp + (b * q + i) * D;
      for (int64_t h = 0; h < H; ++h) rotate(x + h * D, c, s, D, queries.data() + ((b * q + i) * H + h) * D);
      for (int64_t g = 0; g < KV; ++g) {
        const int64_t slot = ((b * KV + g) * cap + lengths[b] + i) * D;
        rotate(x + (H + g) * D, c, s, D, turned.data());
        for (int64_t d = 0; d < D; ++d) {
          kp[slot + d] = static_cast<T>(turned[d]);
          vp[slot + d] = x[(H + KV + g) * D + d];
        }
      }
    }
  const int64_t tasks = B * H * q;
  const int64_t grain = tasks * width * D < (1 << 20) ? tasks : 1;  // small work: one thread
  at::parallel_for(0, tasks, grain, [&](int64_t t0, int64_t t1) {
    std::vector<float> scores(width), acc(D);
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t b = t / (H * q), h = t / q % H, i = t % q, g = h / groups;
      const Row<T> row{queries.data() + ((b * q + i) * H + h) * D, mask + (b * q + i) * width,
                       kp + (b * KV + g) * cap * D, vp + (b * KV + g) * cap * D, op + (b * q + i) * H * D + h * D};
      if (D == 4 * VL) {
        attend_row<T, 4>(row, width, scaling, scores.data());
      } else if (D == 8 * VL) {
        attend_row<T, 8>(row, width, scaling, scores.data());
      } else {
        attend_row_any(row, D, width, scaling, scores.data(), acc.data());
      }
    }
  });
}

}  // namespace

at::Tensor attend(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin, at::Tensor& keys,
                  at::Tensor& values, const at::Tensor& lengths, const at::Tensor& mask, int64_t heads,
                  int64_t kv_heads, double scaling) {
  const int64_t B = mask.size(0), q = mask.size(1), width = mask.size(2);
  TORCH_CHECK(mask.dim() == 3 && mask.is_contiguous() && mask.scalar_type() == at::kBool, "attend: mask");
  TORCH_CHECK(cos.dim() == 3 && cos.size(0) == B && cos.size(1) == q && cos.is_contiguous() && sin.is_contiguous(),
              "attend: cos/sin [batch, q, head_dim]");
  const int64_t D = cos.size(2);
  check_rows(qkv, "attend");
  TORCH_CHECK(qkv.size(0) == B * q && qkv.size(1) == (heads + 2 * kv_heads) * D, "attend: qkv rows");
  TORCH_CHECK(keys.is_contiguous() && values.is_contiguous() && keys.sizes() == values.sizes() &&
                  keys.size(0) >= B && keys.size(1) == kv_heads && keys.size(3) == D && keys.size(2) >= width,
              "attend: cache buffers [slots, kv_heads, capacity, head_dim]");
  TORCH_CHECK(lengths.scalar_type() == at::kLong && lengths.numel() == B, "attend: lengths");
  const at::ScalarType t = qkv.scalar_type();
  TORCH_CHECK(cos.scalar_type() == t && sin.scalar_type() == t && keys.scalar_type() == t &&
                  values.scalar_type() == t, "attend: one dtype");
  auto lens = lengths.contiguous();
  for (int64_t b = 0; b < B; ++b)
    TORCH_CHECK(lens.data_ptr<int64_t>()[b] + q <= width, "attend: the block runs past the mask's width");
  auto out = at::empty({B * q, heads * D}, qkv.options());
  SPECCORE_FLOATING(t, "attend", [&] {
    attend_typed<scalar_t>(qkv, cos, sin, keys, values, lens.data_ptr<int64_t>(), mask.data_ptr<bool>(), B, q, width,
                           heads, kv_heads, static_cast<float>(scaling), out);
  });
  return out;
}

}  // namespace speccore
