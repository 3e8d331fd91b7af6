// Python bindings of speccore's native CPU kernels (see kernels.h).
#include <torch/extension.h>

#include "kernels.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.attr("lanes") = speccore::VL;
  m.def("pack", &speccore::pack, "a [out, in] weight in linear()'s packed layout");
  m.def("linear", &speccore::linear, "rows [M, in] times a packed weight -> [M, out]");
  m.def("rms_norm", &speccore::rms_norm, "RMSNorm of each row of [M, hidden]");
  m.def("decoder_layer", &speccore::decoder_layer,
        "one Llama-family layer: x += attention and MLP in place; the next norm's input");
}
