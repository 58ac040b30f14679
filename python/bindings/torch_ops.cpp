// fusedattn._torch_ops: fusedattn.torch's per-call work for eager inference in C++, where Python
// costs more than the attention itself at small sizes. Built where PyTorch (with CUDA) is
// installed; fusedattn.torch uses it when it is there and does the same in Python when not.
//
// options_id(layout, options) -> int names a call's layout (bshd, sbhd or bhsd) and spec options
// once; forward(q, k, v, options_id, scale) -> o then runs dense q, k, v (any strides) with no
// bias, sink, dropout, lengths or statistics (the caller sends only those calls), or returns
// NotImplemented for a call that needs PyTorch's machinery (autograd, a tensor subclass or
// wrapper, a dispatch mode, a tensor not on a GPU): the caller then takes its general path.
// forward is a plain CPython fast call, not a pybind11 one: its argument matching costs more than
// the rest. Per call: a lookup of the plan by the tensors' sizes, strides, dtype, device and the
// options id (the spec is built once per such signature), O from PyTorch's caching allocator, a
// workspace (kept per stream while small), and the plan enqueued on the current stream (a repeated
// call replays, src/exec/replay.h).
#include <ATen/ATen.h>
#include <ATen/cuda/EmptyTensor.h>
#include <c10/core/GradMode.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "fusedattn/attention.h"
#include "fusedattn/errors.h"
#include "fusedattn/plan_cache.h"
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

// A call's layout and spec options, named once by options_id.
struct CallOptions {
  int layout;
  std::string text;
};

// Append-only, so ids stay valid; bounded by the distinct option sets a program uses, and capped
// (a program that makes up new windows on every call gets -1 and the Python path past the cap).
constexpr std::size_t kMaxOptionSets = 4096;
std::mutex g_options_mutex;
std::deque<CallOptions> g_options;

int options_id(const std::string& layout_name, const std::string& text) {
  const int layout = layout_index(layout_name);
  std::lock_guard<std::mutex> lock(g_options_mutex);
  for (std::size_t i = 0; i < g_options.size(); ++i) {
    if (g_options[i].layout == layout && g_options[i].text == text) return static_cast<int>(i);
  }
  if (g_options.size() == kMaxOptionSets) return -1;
  g_options.push_back(CallOptions{layout, text});
  return static_cast<int>(g_options.size() - 1);
}

const CallOptions& options_of(long id) {
  std::lock_guard<std::mutex> lock(g_options_mutex);
  if (id < 0 || static_cast<std::size_t>(id) >= g_options.size()) {
    throw fa::InvalidArgument("options_id", std::to_string(id), "an id from options_id()");
  }
  return g_options[static_cast<std::size_t>(id)];
}

// What fixes a call's plan: device, dtype, options id, the three inputs' sizes and strides.
struct Signature {
  std::array<std::int64_t, 27> numbers{};
  bool operator==(const Signature& other) const { return numbers == other.numbers; }
};

struct SignatureHash {
  std::size_t operator()(const Signature& s) const noexcept {
    std::size_t h = 0;
    for (std::int64_t n : s.numbers) h = h * 1000003u ^ std::hash<std::int64_t>()(n);
    return h;
  }
};

Signature signature_of(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, long id) {
  Signature s;
  s.numbers[0] = q.get_device();
  s.numbers[1] = static_cast<std::int64_t>(q.scalar_type());
  s.numbers[2] = id;
  std::size_t next = 3;
  for (const at::Tensor* t : {&q, &k, &v}) {
    for (int axis = 0; axis < 4; ++axis) {
      s.numbers[next++] = t->size(axis);
      s.numbers[next++] = t->stride(axis);
    }
  }
  return s;
}

// The plan of a signature, built on first use; later calls find it here (the core's cache would
// find it too, but only from a full spec, which costs more to form than this lookup). Bounded
// like the core's cache: past its capacity the map starts again (plans stay in the core's cache).
std::shared_ptr<const fa::Plan> plan_for(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                         const at::Tensor& o, long id) {
  static std::mutex mutex;
  static std::unordered_map<Signature, std::shared_ptr<const fa::Plan>, SignatureHash> plans;
  Signature key = signature_of(q, k, v, id);
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto found = plans.find(key);
    if (found != plans.end()) return found->second;
  }
  const CallOptions& options = options_of(id);
  const std::string text = "q=" + describe(q, options.layout) + " k=" + describe(k, options.layout) +
                           " v=" + describe(v, options.layout) + " o=" + describe(o, options.layout) + " " +
                           options.text + " stats=0";
  auto plan = fa::get_plan(fa::parse_spec(text), fa::Pass::forward);
  std::lock_guard<std::mutex> lock(mutex);
  if (plans.size() >= fa::kDefaultPlanCacheCapacity) plans.clear();
  plans.emplace(std::move(key), plan);
  return plan;
}

// k and v as the spec needs them beside q: same rank, device and dtype (the dtype is checked here
// so that a wrong one is named as k's or v's, not q's).
void require_like_q(const at::Tensor& q, const at::Tensor& t, const char* name) {
  if (t.dim() != 4) throw fa::InvalidArgument(std::string(name) + ".dim", std::to_string(t.dim()), "4, like q");
  if (t.device() != q.device()) {
    throw fa::InvalidArgument(std::string(name) + ".device", t.device().str(), "q's device, " + q.device().str());
  }
  if (t.scalar_type() != q.scalar_type()) {
    throw fa::InvalidArgument(std::string(name) + ".dtype", std::string(c10::toString(t.scalar_type())),
                              std::string("q's dtype, ") + c10::toString(q.scalar_type()));
  }
}

// A call's workspace. Small ones are kept per stream and reused by every later call on that stream,
// which the stream runs in order: no trip through the caching allocator's lock and bookkeeping on
// every call, and a stable address lets repeated calls replay. PyTorch keeps cuBLAS's workspaces
// the same way. A capturing stream gets fresh memory from the allocator (from the graph's own pool),
// since a captured graph may later run beside anything else that uses the stream's workspace;
// so do large workspaces (their kernels outlast an allocation many times over) and streams past
// the first few dozen. `per_call` holds fresh memory until the work is enqueued.
constexpr std::size_t kKeptWorkspaceBytes = std::size_t{4} << 20;
constexpr std::size_t kKeptWorkspaceStreams = 32;

void* call_workspace(std::size_t bytes, int device, cudaStream_t stream, c10::DataPtr& per_call) {
  if (bytes == 0) return nullptr;
  c10::cuda::CUDACachingAllocator::CUDAAllocator* allocator = c10::cuda::CUDACachingAllocator::get();
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (bytes <= kKeptWorkspaceBytes && cudaStreamIsCapturing(stream, &capture) == cudaSuccess &&
      capture == cudaStreamCaptureStatusNone) {
    struct Kept {
      int device;  // every device's legacy default stream has the same handle
      cudaStream_t stream;
      std::size_t bytes;
      c10::DataPtr memory;
    };
    static std::mutex mutex;
    // Never destroyed: at exit the allocator may already be gone; the memory goes with the process.
    static auto* kept = new std::vector<Kept>();
    std::lock_guard<std::mutex> lock(mutex);
    auto found = std::find_if(kept->begin(), kept->end(),
                              [&](const Kept& k) { return k.stream == stream && k.device == device; });
    if (found == kept->end() && kept->size() < kKeptWorkspaceStreams) {
      found = kept->insert(kept->end(), Kept{device, stream, 0, c10::DataPtr()});
    }
    if (found != kept->end()) {
      if (found->bytes < bytes) {  // the old block goes back to this stream's pool, in stream order
        std::size_t grown = std::max<std::size_t>(found->bytes, 64 << 10);
        while (grown < bytes) grown *= 2;
        found->memory = allocator->allocate(grown);
        found->bytes = grown;
      }
      return found->memory.get();
    }
  }
  (void)cudaGetLastError();  // a failed capture query is cuDNN's to meet and report, not ours
  per_call = allocator->allocate(bytes);
  return per_call.get();
}

// Whether a call is one forward() runs itself: no gradient to record, plain strided CUDA tensors
// (no subclass, nested tensor, functorch or functionalization wrapper) and no dispatch mode to
// see the call.
bool runs_here(PyObject* const* tensors) {
  constexpr c10::DispatchKeySet kWrappers({c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot,
                                           c10::DispatchKey::Functionalize, c10::DispatchKey::FuncTorchBatched,
                                           c10::DispatchKey::FuncTorchGradWrapper});
  if (c10::impl::TorchDispatchModeTLS::any_modes_set()) return false;
  const bool grad_mode = c10::GradMode::is_enabled();
  for (int i = 0; i < 3; ++i) {
    if (!THPVariable_CheckExact(tensors[i])) return false;
    const at::Tensor& t = THPVariable_Unpack(tensors[i]);
    if (!t.is_cuda() || t.layout() != at::kStrided || t.is_nested() || t.key_set().has_any(kWrappers) ||
        (grad_mode && t.requires_grad())) {
      return false;
    }
  }
  return true;
}

// `scale`: None for the spec's default, 1/sqrt(d_qk).
at::Tensor forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, long id, PyObject* scale) {
  if (q.dim() != 4) throw fa::InvalidArgument("q.dim", std::to_string(q.dim()), "4");
  require_like_q(q, k, "k");
  require_like_q(q, v, "v");
  const c10::cuda::CUDAGuard device(q.device());
  // empty_cuda: straight to the caching allocator, without a trip through the dispatcher.
  const std::array<std::int64_t, 4> o_sizes = {q.size(0), q.size(1), q.size(2), v.size(3)};
  at::Tensor o = at::detail::empty_cuda(o_sizes, q.scalar_type(), q.device(), std::nullopt);
  const std::shared_ptr<const fa::Plan> plan = plan_for(q, k, v, o, id);
  float scale_value = fa::default_scale(plan->spec());
  if (scale != Py_None) {
    scale_value = static_cast<float>(PyFloat_AsDouble(scale));
    if (PyErr_Occurred()) throw py::error_already_set();
  }
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(q.get_device()).stream();
  const std::size_t bytes = plan->workspace_bytes();
  c10::DataPtr per_call;
  void* workspace = call_workspace(bytes, q.get_device(), stream, per_call);
  fa::ForwardTensors t;
  t.q = q.data_ptr();
  t.k = k.data_ptr();
  t.v = v.data_ptr();
  t.o = o.data_ptr();
  plan->run(t, scale_value, stream, fa::Workspace{workspace, bytes});
  return o;
}

const at::Tensor& tensor_argument(PyObject* object, const char* name) {
  if (!THPVariable_Check(object)) {
    throw fa::InvalidArgument(name, Py_TYPE(object)->tp_name, "a torch.Tensor");
  }
  return THPVariable_Unpack(object);
}

// forward(q, k, v, options_id, scale) as a CPython fast call.
PyObject* forward_call(PyObject* /*module*/, PyObject* const* args, Py_ssize_t count) {
  HANDLE_TH_ERRORS
  try {
    if (count != 5) throw fa::InvalidArgument("arguments", std::to_string(count), "5: q, k, v, options_id, scale");
    const at::Tensor& q = tensor_argument(args[0], "q");
    const at::Tensor& k = tensor_argument(args[1], "k");
    const at::Tensor& v = tensor_argument(args[2], "v");
    const long id = PyLong_AsLong(args[3]);
    if (PyErr_Occurred()) return nullptr;
    if (!runs_here(args)) Py_RETURN_NOTIMPLEMENTED;
    return THPVariable_Wrap(forward(q, k, v, id, args[4]));
  } catch (const fa::Error& error) {
    fa::python::set_python_error(error);
    return nullptr;
  }
  END_HANDLE_TH_ERRORS
}

PyMethodDef forward_method = {"forward", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&forward_call)),
                              METH_FASTCALL,
                              "forward(q, k, v, options_id, scale) -> O of a plain dense inference call (no bias, "
                              "sink, dropout, lengths or statistics; scale None: 1/sqrt(d)) on the current stream, "
                              "or NotImplemented for a call it leaves to the general path."};

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
  m.def("options_id", &options_id, py::arg("layout"), py::arg("options"),
        "An id for a layout (bshd, sbhd or bhsd) and the spec's options, for forward(); -1 past 4096 such sets.");
  m.add_object("forward", py::reinterpret_steal<py::object>(PyCFunction_New(&forward_method, nullptr)));
}
