// fusedattn._torch_ops: fusedattn.torch's per-call work for eager inference in C++, where Python
// costs more than the attention itself at small sizes. Built where PyTorch (with CUDA) is
// installed; fusedattn.torch uses it when it is there and does the same in Python when not.
//
// forward(q, k, v, layout, options, scale) -> o: dense q, k, v in one of bshd, sbhd, bhsd (any
// strides), no bias, sink, dropout, lengths or statistics (the caller sends only those calls).
// Per call: a lookup of the plan by the tensors' sizes, strides, dtype, device and the options
// (the spec is built once per such signature), O from PyTorch's caching allocator, the workspace
// too, and the plan enqueued on the current stream.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/utils/pybind.h>

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "fusedattn/attention.h"
#include "fusedattn/errors.h"
#include "fusedattn/spec.h"
#include "python_errors.h"

namespace fa = fusedattn;
namespace py = pybind11;

namespace {

// Per layout, the tensor axis that holds each logical axis (batch, heads, sequence, head dim),
// as in fusedattn/_layouts.py.
int layout_index(const std::string& layout) {
  if (layout == "bshd") return 0;
  if (layout == "sbhd") return 1;
  if (layout == "bhsd") return 2;
  throw fa::InvalidArgument("layout", layout, "one of bshd, sbhd, bhsd");
}
constexpr std::array<std::array<int, 4>, 3> kAxes = {{{0, 2, 1, 3}, {1, 2, 0, 3}, {0, 1, 2, 3}}};

const char* dtype_name(at::ScalarType type) {
  if (type == at::kHalf) return "f16";
  if (type == at::kBFloat16) return "bf16";
  throw fa::InvalidArgument("q.dtype", std::string(c10::toString(type)), "torch.float16 or torch.bfloat16");
}

// A tensor in the spec string's form: dtype[dims]/[strides], logical [b, h, s, d].
std::string describe(const at::Tensor& t, int layout) {
  std::string dims, strides;
  for (int logical = 0; logical < 4; ++logical) {
    const int axis = kAxes[layout][logical];
    dims += (logical ? "," : "") + std::to_string(t.size(axis));
    strides += (logical ? "," : "") + std::to_string(t.stride(axis));
  }
  return std::string(dtype_name(t.scalar_type())) + "[" + dims + "]/[" + strides + "]";
}

// What fixes a call's plan: device, dtype, layout, the three inputs' sizes and strides, options.
struct Signature {
  std::array<std::int64_t, 27> numbers{};
  std::string options;
  bool operator==(const Signature& other) const { return numbers == other.numbers && options == other.options; }
};

struct SignatureHash {
  std::size_t operator()(const Signature& s) const noexcept {
    std::size_t h = std::hash<std::string>()(s.options);
    for (std::int64_t n : s.numbers) h = h * 1000003u ^ std::hash<std::int64_t>()(n);
    return h;
  }
};

Signature signature_of(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int layout,
                       const std::string& options) {
  Signature s;
  s.numbers[0] = q.get_device();
  s.numbers[1] = static_cast<std::int64_t>(q.scalar_type());
  s.numbers[2] = layout;
  std::size_t next = 3;
  for (const at::Tensor* t : {&q, &k, &v}) {
    for (int axis = 0; axis < 4; ++axis) {
      s.numbers[next++] = t->size(axis);
      s.numbers[next++] = t->stride(axis);
    }
  }
  s.options = options;
  return s;
}

// The plan of a signature, built on first use; later calls find it here (the core's cache would
// find it too, but only from a full spec, which costs more to form than this lookup).
std::shared_ptr<const fa::Plan> plan_for(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                         const at::Tensor& o, int layout, const std::string& options) {
  static std::mutex mutex;
  static std::unordered_map<Signature, std::shared_ptr<const fa::Plan>, SignatureHash> plans;
  Signature key = signature_of(q, k, v, layout, options);
  std::lock_guard<std::mutex> lock(mutex);
  auto found = plans.find(key);
  if (found != plans.end()) return found->second;
  const std::string text = "q=" + describe(q, layout) + " k=" + describe(k, layout) + " v=" + describe(v, layout) +
                           " o=" + describe(o, layout) + " " + options + " stats=0";
  auto plan = fa::get_plan(fa::parse_spec(text), fa::Pass::forward);
  plans.emplace(std::move(key), plan);
  return plan;
}

at::Tensor forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const std::string& layout_name,
                   const std::string& options, double scale) {
  if (!q.is_cuda()) throw fa::InvalidArgument("q.device", q.device().str(), "a CUDA device");
  if (q.dim() != 4 || k.dim() != 4 || v.dim() != 4) {
    throw fa::InvalidArgument("q.dim", std::to_string(q.dim()), "4-dimensional q, k and v in " + layout_name);
  }
  const int layout = layout_index(layout_name);
  const c10::cuda::CUDAGuard device(q.device());
  std::vector<std::int64_t> o_sizes = q.sizes().vec();
  o_sizes[3] = v.size(3);
  at::Tensor o = at::empty(o_sizes, q.options());
  const std::shared_ptr<const fa::Plan> plan = plan_for(q, k, v, o, layout, options);
  const std::size_t bytes = plan->workspace_bytes();
  at::Tensor workspace = bytes ? at::empty({static_cast<std::int64_t>(bytes)}, q.options().dtype(at::kByte))
                               : at::Tensor();
  fa::ForwardTensors t;
  t.q = q.data_ptr();
  t.k = k.data_ptr();
  t.v = v.data_ptr();
  t.o = o.data_ptr();
  plan->run(t, static_cast<float>(scale), c10::cuda::getCurrentCUDAStream(q.get_device()).stream(),
            fa::Workspace{bytes ? workspace.data_ptr() : nullptr, bytes});
  return o;
}

}  // namespace

PYBIND11_MODULE(_torch_ops, m) {
  m.doc() = "fusedattn.torch's eager-inference fast path in C++.";
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const fa::Error& error) {
      fa::python::set_python_error(error);
    }
  });
  m.def("forward", &forward, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("layout"), py::arg("options"),
        py::arg("scale"),
        "O of a plain dense inference call (no bias, sink, dropout, lengths or statistics), on the current stream.");
}
