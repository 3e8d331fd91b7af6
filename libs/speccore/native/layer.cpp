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

// One query row's masked softmax attention for any head dimension (scores through dot(), its tail
// included; attend_tile's arithmetic where the head dimension is whole vectors).
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

// Up to N query rows that read one key/value head (the heads of a group, at one or more block
// positions), attended together: each key and value is loaded once for all of them. Every row's
// arithmetic is its own alone: its scores summed as dot() sums them (lanes_sum4 gives lanes_sum's
// bits), its maximum, exponentials, total and values summed column by column in order, in
// registers; so a row gets the same bits in any tile, whichever rows share it.
template <typename T, int DV, int N>
void attend_tile(const Row<T>* rows, int64_t width, float scaling, float* scores) {
  constexpr int64_t D = DV * VL;
  vf query[N][DV];
  float top[N];
  for (int r = 0; r < N; ++r) {
    for (int c = 0; c < DV; ++c) query[r][c] = load(rows[r].query + c * VL);
    top[r] = -std::numeric_limits<float>::infinity();
  }
  for (int64_t j = 0; j < width; ++j) {
    bool any = false;
    for (int r = 0; r < N; ++r) any |= rows[r].seen[j];
    if (!any) continue;
    const T* key = rows[0].keys + j * D;
    vf sum[4] = {};
    for (int r = 0; r < N; ++r)
      for (int c = 0; c < DV; ++c) sum[r] += query[r][c] * load(key + c * VL);
    float s[4];
    lanes_sum4(sum[0], sum[1], sum[2], sum[3], s);
    for (int r = 0; r < N; ++r)
      if (rows[r].seen[j]) {
        scores[r * width + j] = s[r] * scaling;
        top[r] = std::max(top[r], scores[r * width + j]);
      }
  }
  vf acc[N][DV] = {};
  float total[N] = {};
  for (int64_t j = 0; j < width; ++j) {
    bool any = false;
    for (int r = 0; r < N; ++r) any |= rows[r].seen[j];
    if (!any) continue;
    const T* value = rows[0].values + j * D;
    for (int r = 0; r < N; ++r)
      if (rows[r].seen[j]) {
        const float e = std::exp(scores[r * width + j] - top[r]);
        total[r] += e;
        const vf weight = vf{} + e;
        for (int c = 0; c < DV; ++c) acc[r][c] += weight * load(value + c * VL);
      }
  }
  for (int r = 0; r < N; ++r)
    for (int c = 0; c < DV; ++c)
      for (int l = 0; l < VL; ++l) rows[r].out[c * VL + l] = static_cast<T>(acc[r][c][l] / total[r]);
}

template <typename T, int DV>
void attend_tile_of(const Row<T>* rows, int n, int64_t width, float scaling, float* scores) {
  switch (n) {
    case 1: return attend_tile<T, DV, 1>(rows, width, scaling, scores);
    case 2: return attend_tile<T, DV, 2>(rows, width, scaling, scores);
    case 3: return attend_tile<T, DV, 3>(rows, width, scaling, scores);
    default: return attend_tile<T, DV, 4>(rows, width, scaling, scores);
  }
}

// A key/value head's query rows: heads h of its group at block positions i, position-major
// (r = i * groups + the head's place in the group), so a tile's rows mostly share one mask row.
template <typename T>
Row<T> group_row(const Attention& a, int64_t b, int64_t g, int64_t r) {
  const int64_t H = a.heads, D = a.cos.size(2), cap = a.keys.size(2), groups = H / a.kv_heads, q = a.q;
  const int64_t i = r / groups, h = g * groups + r % groups;
  return Row<T>{a.queries.data_ptr<float>() + ((b * q + i) * H + h) * D, a.mask + (b * q + i) * a.width,
                a.keys.data_ptr<T>() + (b * a.kv_heads + g) * cap * D,
                a.values.data_ptr<T>() + (b * a.kv_heads + g) * cap * D,
                a.out.data_ptr<T>() + (b * q + i) * H * D + h * D};
}

template <typename T>
void attend_typed(const Attention& a, int64_t t0, int64_t t1, int parts) {
  const int64_t D = a.cos.size(2), width = a.width, rows_per_head = a.heads / a.kv_heads * a.q;
  const int64_t tile = attention_tile(a, parts), tiles = (rows_per_head + tile - 1) / tile;
  std::vector<float> scores(kMaxTile * width), acc(D);
  Row<T> rows[kMaxTile];
  for (int64_t t = t0; t < t1; ++t) {  // t = (b * kv_heads + g) * tiles + the tile
    const int64_t bg = t / tiles, first = t % tiles * tile, b = bg / a.kv_heads, g = bg % a.kv_heads;
    const int n = static_cast<int>(std::min(tile, rows_per_head - first));
    for (int r = 0; r < n; ++r) rows[r] = group_row<T>(a, b, g, first + r);
    if (D == 4 * VL) {
      attend_tile_of<T, 4>(rows, n, width, a.scaling, scores.data());
    } else if (D == 8 * VL) {
      attend_tile_of<T, 8>(rows, n, width, a.scaling, scores.data());
    } else {
      for (int r = 0; r < n; ++r) attend_row_any(rows[r], D, width, a.scaling, scores.data(), acc.data());
    }
  }
}

}  // namespace

void rotate_rows(const Attention& a, int64_t r0, int64_t r1) {
  SPECCORE_FLOATING(a.qkv.scalar_type(), "attend", [&] { rotate_typed<scalar_t>(a, r0, r1); });
}

int64_t attention_tile(const Attention& a, int parts) {
  // The tile that makes the busiest thread's work least, a tile costing its rows plus about two
  // rows' worth for reading its keys and values (a decoding step of one sequence has only
  // kv_heads groups of a few rows to share among the threads).
  const int64_t rows_per_head = a.heads / a.kv_heads * a.q, heads = a.batch * a.kv_heads;
  int64_t best = 1, best_cost = std::numeric_limits<int64_t>::max();
  for (int64_t tile = 1; tile <= kMaxTile; ++tile) {
    const int64_t tiles = heads * ((rows_per_head + tile - 1) / tile);
    const int64_t cost = (tiles + parts - 1) / parts * (2 + std::min(tile, rows_per_head));
    if (cost < best_cost) best = tile, best_cost = cost;
  }
  return best;
}

int64_t attention_tiles(const Attention& a, int parts) {
  const int64_t tile = attention_tile(a, parts), rows_per_head = a.heads / a.kv_heads * a.q;
  return a.batch * a.kv_heads * ((rows_per_head + tile - 1) / tile);
}

void attend_rows(const Attention& a, int64_t t0, int64_t t1, int parts) {
  SPECCORE_FLOATING(a.qkv.scalar_type(), "attend", [&] { attend_typed<scalar_t>(a, t0, t1, parts); });
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
