// Row-invariant matrix products: out[m, n] = dot(x[m], w[n]) (+ bias[n]) for weights packed
// once at load time; each output summed as kernels.h's dot() sums, whatever the tiling.
//
// Packed layout: [ceil(N / NB)][K / VL][NB][VL], outputs padded with zero rows to a multiple
// of NB. A tile of NB outputs reads one contiguous stream, so decoding (a row or a few:
// memory-bound) reads the weights once per call at close to the host's read bandwidth.
// bfloat16 weights are widened in registers: half the bytes read.
#include <ATen/Parallel.h>

#include <algorithm>
#include <type_traits>
#include <vector>

#include "kernels.h"

namespace speccore {
namespace {

#if defined(__AVX512F__)
constexpr int MB = 4;  // rows per tile: 32 vector registers hold MB * NB sums and NB weights
#else
constexpr int MB = 3;  // 16 registers
#endif
constexpr int NB = 4;           // outputs per tile
constexpr int64_t MCHUNK = 48;  // rows whose inputs stay in cache while the weights pass

template <typename X, typename W, typename O, int R>
void tile(const X* x, int64_t K, const W* w, const float* bias, O* out, int64_t N, int64_t n) {
  vf acc[R][NB] = {};
  const int64_t steps = K / VL;
  for (int64_t k = 0; k < steps; ++k, w += NB * VL) {
    vf wv[NB];
    for (int j = 0; j < NB; ++j) wv[j] = load(w + j * VL);
    for (int i = 0; i < R; ++i) {
      const vf xv = load(x + i * K + k * VL);
      for (int j = 0; j < NB; ++j) acc[i][j] += xv * wv[j];
    }
  }
  static_assert(NB == 4, "the tile's sums are taken four at a time");
  const int outs = static_cast<int>(std::min<int64_t>(NB, N - n));
  for (int i = 0; i < R; ++i) {
    float sums[NB];
    lanes_sum4(acc[i][0], acc[i][1], acc[i][2], acc[i][3], sums);
    for (int j = 0; j < outs; ++j) {
      float s = sums[j];
      if (bias != nullptr) s += bias[n + j];
      out[i * N + n + j] = static_cast<O>(s);
    }
  }
}

// Rows m0..m1 of output tiles t0..t1. With more rows than one tile takes (a prefill), bfloat16
// rows and weights are widened to float32 once per chunk and tile instead of once per use:
// widening is exact, so the bits are those of the one-row path.
template <typename X, typename W>
void tiles(const X* x, int64_t M, int64_t K, const W* w, const float* bias, X* out, int64_t N, int64_t t0,
           int64_t t1) {
  constexpr bool wide_x = std::is_same_v<X, float>, wide_w = std::is_same_v<W, float>;
  std::vector<float> x_buf, w_buf;
  for (int64_t m0 = 0; m0 < M; m0 += MCHUNK) {
    const int64_t m1 = std::min(M, m0 + MCHUNK);
    const bool widen = m1 - m0 > MB;
    const float* xs = nullptr;
    if (widen && !wide_x) {
      x_buf.resize((m1 - m0) * K);
      for (int64_t e = 0; e < (m1 - m0) * K; ++e) x_buf[e] = static_cast<float>(x[m0 * K + e]);
      xs = x_buf.data() - m0 * K;  // indexed by absolute row below
    }
    for (int64_t t = t0; t < t1; ++t) {
      const W* wt = w + t * NB * K;
      const float* wf = nullptr;
      if (widen && !wide_w) {
        w_buf.resize(NB * K);
        for (int64_t e = 0; e < NB * K; ++e) w_buf[e] = static_cast<float>(wt[e]);
        wf = w_buf.data();
      }
      int64_t m = m0;
      for (; m + MB <= m1; m += MB) {
        X* o = out + m * N;
        if (xs != nullptr && wf != nullptr) tile<float, float, X, MB>(xs + m * K, K, wf, bias, o, N, t * NB);
        else if (xs != nullptr) tile<float, W, X, MB>(xs + m * K, K, wt, bias, o, N, t * NB);
        else if (wf != nullptr) tile<X, float, X, MB>(x + m * K, K, wf, bias, o, N, t * NB);
        else tile<X, W, X, MB>(x + m * K, K, wt, bias, o, N, t * NB);
      }
      for (; m < m1; ++m) tile<X, W, X, 1>(x + m * K, K, wt, bias, out + m * N, N, t * NB);
    }
  }
}

// Output tiles t0..t1 of rows x times a packed weight (dtypes checked by the caller).
void linear_tiles(const at::Tensor& x, const at::Tensor& packed, const float* bias, at::Tensor& out, int64_t N,
                  int64_t t0, int64_t t1) {
  SPECCORE_FLOATING(x.scalar_type(), "linear", [&] {
    using X = scalar_t;
    SPECCORE_FLOATING(packed.scalar_type(), "linear", [&] {
      tiles<X, scalar_t>(x.data_ptr<X>(), x.size(0), x.size(1), packed.data_ptr<scalar_t>(), bias,
                         out.data_ptr<X>(), N, t0, t1);
    });
  });
}

}  // namespace

void linear_part(const at::Tensor& x, const at::Tensor& packed, const float* bias, at::Tensor& out, int64_t N,
                 int part, int parts) {
  const auto [t0, t1] = share((N + NB - 1) / NB, part, parts);
  linear_tiles(x, packed, bias, out, N, t0, t1);
}

at::Tensor pack(const at::Tensor& weight) {
  TORCH_CHECK(weight.dim() == 2, "pack: a [out, in] weight");
  const int64_t N = weight.size(0), K = weight.size(1);
  TORCH_CHECK(K % VL == 0, "pack: in_features must be a multiple of ", VL);
  const int64_t padded = (N + NB - 1) / NB * NB;
  auto w = weight.detach().contiguous();
  if (padded != N) w = at::cat({w, w.new_zeros({padded - N, K})});
  return w.reshape({padded / NB, NB, K / VL, VL}).transpose(1, 2).contiguous();
}

void check_linear(const at::Tensor& rows, const at::Tensor& packed, int64_t out_features, const char* name) {
  TORCH_CHECK(rows.dim() == 2 && packed.dim() == 4 && packed.is_contiguous(), name,
              ": [rows, in] times a packed weight");
  const int64_t K = packed.size(1) * VL;
  TORCH_CHECK(rows.size(1) == K, name, ": rows have ", rows.size(1), " features, the weight ", K);
  TORCH_CHECK(packed.size(0) * NB >= out_features, name, ": the packed weight has fewer outputs");
  for (const auto t : {rows.scalar_type(), packed.scalar_type()})
    TORCH_CHECK(t == at::kFloat || t == at::kBFloat16, name, ": float32 or bfloat16 only");
}

at::Tensor linear(const at::Tensor& rows, const at::Tensor& packed, int64_t out_features,
                  const c10::optional<at::Tensor>& bias) {
  check_linear(rows, packed, out_features, "linear");
  auto x = rows.contiguous();
  auto out = at::empty({x.size(0), out_features}, x.options());
  at::Tensor b;
  const float* bp = nullptr;
  if (bias.has_value() && bias->defined()) {
    b = bias->to(at::kFloat).contiguous();
    bp = b.data_ptr<float>();
  }
  const int64_t n_tiles = (out_features + NB - 1) / NB;
  at::parallel_for(0, n_tiles, 8, [&](int64_t t0, int64_t t1) { linear_tiles(x, packed, bp, out, out_features, t0, t1); });
  return out;
}

}  // namespace speccore
