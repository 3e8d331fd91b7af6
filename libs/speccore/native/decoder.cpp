// One Llama-family decoder layer in one call: the lean decoder's loop body (speccore/decoder.py)
// without a return to Python between its eight kernels (kernels.h).
#include <ATen/Parallel.h>

#include "kernels.h"

namespace speccore {
namespace {

// Matmuls take `threads` threads where the caller runs the rest of a small block on one
// (cpu_kernels.serial_small_ops); 0 leaves the thread count as it is.
at::Tensor linear_on(int64_t threads, const at::Tensor& rows, const at::Tensor& packed, int64_t out_features,
                     const c10::optional<at::Tensor>& bias) {
  if (threads <= 0) return linear(rows, packed, out_features, bias);
  at::set_num_threads(static_cast<int>(threads));
  at::Tensor out = linear(rows, packed, out_features, bias);
  at::set_num_threads(1);
  return out;
}

}  // namespace

at::Tensor decoder_layer(at::Tensor& x, const at::Tensor& normed, const std::vector<at::Tensor>& packed,
                         const std::vector<int64_t>& out_features,
                         const std::vector<c10::optional<at::Tensor>>& biases,
                         const at::Tensor& mlp_norm, double mlp_eps, const at::Tensor& next_norm, double next_eps,
                         const at::Tensor& cos, const at::Tensor& sin, at::Tensor& keys, at::Tensor& values,
                         const at::Tensor& lengths, const at::Tensor& mask, int64_t heads, int64_t kv_heads,
                         double scaling, int64_t matmul_threads) {
  TORCH_CHECK(packed.size() == 4 && out_features.size() == 4 && biases.size() == 4,
              "decoder_layer: the q/k/v, o, gate/up and down weights, their sizes and biases");
  const int64_t t = matmul_threads;
  const at::Tensor qkv = linear_on(t, normed, packed[0], out_features[0], biases[0]);
  const at::Tensor attn = attend(qkv, cos, sin, keys, values, lengths, mask, heads, kv_heads, scaling);
  const at::Tensor mlp_in = add_rms_norm(x, linear_on(t, attn, packed[1], out_features[1], biases[1]), mlp_norm, mlp_eps);
  const at::Tensor gate_up = linear_on(t, mlp_in, packed[2], out_features[2], biases[2]);
  const at::Tensor down = linear_on(t, silu_mul(gate_up), packed[3], out_features[3], biases[3]);
  return add_rms_norm(x, down, next_norm, next_eps);
}

}  // namespace speccore
