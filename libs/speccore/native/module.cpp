// Python bindings of speccore's native CPU kernels (see kernels.h).
#include <torch/extension.h>

#include "kernels.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.attr("lanes") = speccore::VL;
  m.def("pack", &speccore::pack, "a [out, in] weight in linear()'s packed layout");
  m.def("linear", &speccore::linear, "rows [M, in] times a packed weight -> [M, out]");
  m.def("decoder_forward", &speccore::decoder_forward,
        "a Llama-family decoder over a block: x += every layer in place; [final-normed x, tapped layers' x...]");
}
