// A Llama-family decoder's forward pass over a block in one call and one OpenMP parallel
// region: the lean decoder's loop (speccore/decoder.py). Each layer runs nine steps (the
// q/k/v projection; rotary embedding and the cache write; attention; the output projection;
// the residual add and the MLP's norm; the gate/up projection; the SiLU-gated product; the
// down projection; the residual add and the next norm), each split among the threads, which
// meet at a barrier between steps.
//
// Why one region: where idle OpenMP threads sleep at once (OMP_WAIT_POLICY=PASSIVE, as the
// services run), each parallel region wakes them again, tens of microseconds on a busy host;
// a region per kernel was 121 wake-ups a decoding step and made it 18-40 % slower than with
// threads spinning. Inside the region the threads wait for each other by spinning,
// yielding their core when the wait runs long; between forward passes they sleep as the
// policy says.
#include <ATen/Parallel.h>
#include <omp.h>

#include <atomic>
#include <cstring>
#include <thread>

#include "kernels.h"

namespace speccore {
namespace {

constexpr int SPINS = 1 << 14;  // pauses before a waiting thread starts yielding its core

class Barrier {
 public:
  void join(int count) { count_.store(count, std::memory_order_relaxed); }

  void wait() {
    const int count = count_.load(std::memory_order_relaxed);
    if (count <= 1) return;
    const int phase = phase_.load(std::memory_order_acquire);
    if (arrived_.fetch_add(1, std::memory_order_acq_rel) == count - 1) {
      arrived_.store(0, std::memory_order_relaxed);
      phase_.store(phase + 1, std::memory_order_release);
      return;
    }
    for (int spins = 0; phase_.load(std::memory_order_acquire) == phase; ++spins) {
      if (spins < SPINS) {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
      } else {
        std::this_thread::yield();
      }
    }
  }

 private:
  std::atomic<int> count_{1}, arrived_{0}, phase_{0};
};

void check_norm(const at::Tensor& weight, const at::Tensor& x) {
  TORCH_CHECK(weight.is_contiguous() && weight.scalar_type() == x.scalar_type() && weight.numel() == x.size(1),
              "decoder_forward: a norm's weight must be contiguous, of the block's dtype and width");
}

}  // namespace

std::vector<at::Tensor> decoder_forward(at::Tensor& x, const std::vector<at::Tensor>& packed,
                                        const std::vector<int64_t>& out_features,
                                        const std::vector<c10::optional<at::Tensor>>& biases,
                                        const std::vector<at::Tensor>& norms, const std::vector<double>& eps,
                                        const at::Tensor& cos, const at::Tensor& sin,
                                        const std::vector<at::Tensor>& keys, const std::vector<at::Tensor>& values,
                                        const at::Tensor& lengths, const at::Tensor& mask, int64_t heads,
                                        int64_t kv_heads, double scaling, const std::vector<int64_t>& taps,
                                        int64_t threads) {
  const int64_t L = static_cast<int64_t>(keys.size());
  TORCH_CHECK(L > 0 && values.size() == keys.size() && packed.size() == 4 * keys.size() &&
                  biases.size() == packed.size() && norms.size() == 2 * keys.size() + 1 &&
                  eps.size() == norms.size() && out_features.size() == 4,
              "decoder_forward: per layer four packed weights and biases, two norms and a cache; one final norm");
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), "decoder_forward: x is the contiguous residual stream [rows, hidden]");
  TORCH_CHECK(mask.dim() == 3 && mask.is_contiguous() && mask.scalar_type() == at::kBool,
              "decoder_forward: mask [batch, q, width] bool");
  TORCH_CHECK(lengths.scalar_type() == at::kLong && lengths.numel() == mask.size(0), "decoder_forward: lengths");
  const int64_t M = x.size(0), hidden = x.size(1), B = mask.size(0), q = mask.size(1), D = cos.size(-1);
  TORCH_CHECK(B * q == M, "decoder_forward: the mask's batch * q must be x's rows");
  TORCH_CHECK(out_features[0] == (heads + 2 * kv_heads) * D && out_features[1] == hidden &&
                  out_features[2] % 2 == 0 && out_features[3] == hidden,
              "decoder_forward: q/k/v, o, gate/up and down sizes");
  for (const int64_t tap : taps) TORCH_CHECK(tap >= 0 && tap < L, "decoder_forward: tap ", tap, " is not a layer");

  const auto options = x.options();
  at::Tensor normed = at::empty({M, hidden}, options), qkv = at::empty({M, out_features[0]}, options),
             attn = at::empty({M, heads * D}, options), o = at::empty({M, hidden}, options),
             mlp_in = at::empty({M, hidden}, options), gate_up = at::empty({M, out_features[2]}, options),
             act = at::empty({M, out_features[2] / 2}, options), down = at::empty({M, hidden}, options),
             queries = at::empty({M, heads * D}, options.dtype(at::kFloat));
  const at::Tensor* inputs[4] = {&normed, &attn, &mlp_in, &act};
  at::Tensor* outputs[4] = {&qkv, &o, &gate_up, &down};
  std::vector<at::Tensor> bias_f(packed.size());
  std::vector<const float*> bias_p(packed.size(), nullptr);
  for (size_t i = 0; i < packed.size(); ++i) {
    check_linear(*inputs[i % 4], packed[i], out_features[i % 4], "decoder_forward");
    TORCH_CHECK(packed[i].scalar_type() == x.scalar_type(), "decoder_forward: weights of the block's dtype");
    if (biases[i].has_value() && biases[i]->defined()) {
      bias_f[i] = biases[i]->to(at::kFloat).contiguous();
      TORCH_CHECK(bias_f[i].numel() == out_features[i % 4], "decoder_forward: a bias's size");
      bias_p[i] = bias_f[i].data_ptr<float>();
    }
  }
  for (const at::Tensor& norm : norms) check_norm(norm, x);
  const at::Tensor lens = lengths.contiguous();
  std::vector<Attention> layers;
  for (int64_t l = 0; l < L; ++l) {
    layers.push_back(Attention{qkv, cos, sin, keys[l], values[l], lens.data_ptr<int64_t>(), mask.data_ptr<bool>(), B,
                               q, mask.size(2), heads, kv_heads, static_cast<float>(scaling), queries, attn});
    check_attention(layers.back());
  }
  std::vector<at::Tensor> tapped;
  for (size_t j = 0; j < taps.size(); ++j) tapped.push_back(at::empty({M, hidden}, options));
  const int64_t row_bytes = hidden * x.element_size();

  Barrier barrier;
  const int want = static_cast<int>(threads > 0 ? threads : at::get_num_threads());
#pragma omp parallel num_threads(want)
  {
    const int parts = omp_get_num_threads(), part = omp_get_thread_num();
    barrier.join(parts);
    const auto [r0, r1] = share(M, part, parts);
    rms_norm_rows(x, norms[0], eps[0], normed, r0, r1);
    barrier.wait();
    for (int64_t l = 0; l < L; ++l) {
      const Attention& a = layers[l];
      linear_part(normed, packed[4 * l], bias_p[4 * l], qkv, out_features[0], part, parts);
      barrier.wait();
      rotate_rows(a, r0, r1);
      barrier.wait();
      const auto [t0, t1] = share(attention_tiles(a, parts), part, parts);
      attend_rows(a, t0, t1, parts);
      barrier.wait();
      linear_part(attn, packed[4 * l + 1], bias_p[4 * l + 1], o, out_features[1], part, parts);
      barrier.wait();
      add_rms_norm_rows(x, o, norms[2 * l + 1], eps[2 * l + 1], mlp_in, r0, r1);
      barrier.wait();
      linear_part(mlp_in, packed[4 * l + 2], bias_p[4 * l + 2], gate_up, out_features[2], part, parts);
      barrier.wait();
      silu_mul_rows(gate_up, act, r0, r1);
      barrier.wait();
      linear_part(act, packed[4 * l + 3], bias_p[4 * l + 3], down, out_features[3], part, parts);
      barrier.wait();
      add_rms_norm_rows(x, down, norms[2 * l + 2], eps[2 * l + 2], normed, r0, r1);
      for (size_t j = 0; j < taps.size(); ++j)
        if (taps[j] == l && r1 > r0)
          std::memcpy(static_cast<char*>(tapped[j].data_ptr()) + r0 * row_bytes,
                      static_cast<const char*>(x.data_ptr()) + r0 * row_bytes, (r1 - r0) * row_bytes);
      barrier.wait();
    }
  }
  tapped.insert(tapped.begin(), normed);
  return tapped;
}

}  // namespace speccore
