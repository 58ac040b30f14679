// fusedattn._jax_ffi: XLA FFI handlers (the typed FFI API, headers from the installed jaxlib) that
// run fusedattn plans inside XLA programs on CUDA devices.
//
// Stages, and why each does what it does:
// - INSTANTIATE (once per compiled call, while XLA emits the program): parses and validates the
//   spec attribute. XLA gives that stage no stream and no device, so there is no plan yet.
// - INITIALIZE (on the host before each execution, the device known): makes sure the call has a
//   plan for that device. The first execution on a device builds it (or finds it in the plan
//   cache); later ones find it in the call's own table.
// - EXECUTE: only enqueues that plan on XLA's stream, its workspace a result buffer of the call
//   that XLA planned for: no lookup by key, no allocation, no synchronization, so the handlers
//   declare themselves safe for command buffers (CUDA graphs).
#include <nanobind/nanobind.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include <cuda_runtime_api.h>

#include "fusedattn/attention.h"
#include "fusedattn/errors.h"
#include "fusedattn/tensor_slots.h"
#include "xla/ffi/api/ffi.h"

namespace nb = nanobind;
namespace ffi = xla::ffi;
namespace fa = fusedattn;

namespace {

constexpr int kMaxDevices = 64;

void check_cuda(cudaError_t status, const char* call) {
  if (status != cudaSuccess) throw fa::CudaError(std::string(call) + " failed: " + cudaGetErrorString(status));
}

// What an instantiated call keeps: its spec and pass, and one plan per device it has run on.
struct PlanState {
  static ffi::TypeId id;
  PlanState(fa::ValidatedSpec spec, fa::Pass pass) : spec(std::move(spec)), pass(pass) {}

  const fa::ValidatedSpec spec;  // validated once, at instantiation: get_plan does not again
  const fa::Pass pass;

  // Built with `device` current (the caller's device is restored); a no-op once built.
  void ensure_plan(int device) {
    if (device < 0 || device >= kMaxDevices) {
      throw fa::InvalidArgument("device", std::to_string(device), "0 .. " + std::to_string(kMaxDevices - 1));
    }
    if (plan(device)) return;
    std::lock_guard<std::mutex> lock(building_);
    if (owned_[device]) return;
    int previous = 0;
    check_cuda(cudaGetDevice(&previous), "cudaGetDevice");
    check_cuda(cudaSetDevice(device), "cudaSetDevice");
    std::shared_ptr<const fa::Plan> built;
    try {
      built = fa::get_plan(spec, pass);
    } catch (...) {
      cudaSetDevice(previous);
      throw;
    }
    check_cuda(cudaSetDevice(previous), "cudaSetDevice");
    owned_[device] = std::move(built);
    by_device_[device].store(owned_[device].get(), std::memory_order_release);
  }

  // The device's plan, or null before INITIALIZE built it. Lock-free: EXECUTE reads it.
  const fa::Plan* plan(int device) const {
    return device >= 0 && device < kMaxDevices ? by_device_[device].load(std::memory_order_acquire) : nullptr;
  }

 private:
  std::array<std::atomic<const fa::Plan*>, kMaxDevices> by_device_{};
  std::mutex building_;
  std::array<std::shared_ptr<const fa::Plan>, kMaxDevices> owned_;  // held: the cache may evict them
};
ffi::TypeId PlanState::id = {};

// XLA reports a handler's error with its message; the Python adapter checks support and
// validity while tracing, so these are the rare late ones.
ffi::Error to_ffi_error(const fa::Error& error) {
  switch (error.kind()) {
    case fa::ErrorKind::invalid_argument:
      return ffi::Error::InvalidArgument(error.what());
    case fa::ErrorKind::not_supported:
      return ffi::Error(ffi::ErrorCode::kUnimplemented, error.what());
    default:
      return ffi::Error::Internal(error.what());
  }
}

ffi::ErrorOr<std::unique_ptr<PlanState>> instantiate(std::string_view spec_text, fa::Pass pass) {
  try {
    return std::make_unique<PlanState>(fa::ValidatedSpec(fa::parse_spec(std::string(spec_text))), pass);
  } catch (const fa::Error& error) {
    return ffi::Unexpected(to_ffi_error(error));
  }
}

// Every stage that binds attributes must bind all of the call's (XLA checks the count), so the
// instantiate stages take the sequence count, the scale and query_lengths too, unused.
ffi::ErrorOr<std::unique_ptr<PlanState>> instantiate_forward(std::string_view spec, std::int64_t, float, bool) {
  return instantiate(spec, fa::Pass::forward);
}
ffi::ErrorOr<std::unique_ptr<PlanState>> instantiate_backward(std::string_view spec, std::int64_t, float, bool) {
  return instantiate(spec, fa::Pass::backward);
}

ffi::Error initialize(std::int32_t device, PlanState* state) {
  try {
    state->ensure_plan(device);
    return ffi::Error::Success();
  } catch (const fa::Error& error) {
    return to_ffi_error(error);
  }
}

// The device's plan and its workspace: the call's last result, a uint8 buffer XLA planned for
// (sized while tracing, from the plan), or, where that was not known (a program traced without a
// GPU), memory from XLA's scratch allocator.
struct Launch {
  const fa::Plan* plan = nullptr;
  fa::Workspace workspace;
};

ffi::ErrorOr<Launch> prepare_launch(std::int32_t device, PlanState* state, ffi::ScratchAllocator& scratch,
                                    ffi::AnyBuffer workspace) {
  Launch launch;
  launch.plan = state->plan(device);
  if (!launch.plan) {
    return ffi::Unexpected(ffi::Error::Internal("fusedattn: no plan for device " + std::to_string(device) +
                                                " (the INITIALIZE stage did not run)"));
  }
  const std::size_t bytes = launch.plan->workspace_bytes();
  if (bytes == 0) return launch;
  if (workspace.size_bytes() >= bytes) {
    launch.workspace = fa::Workspace{workspace.untyped_data(), workspace.size_bytes()};
    return launch;
  }
  std::optional<void*> data = scratch.Allocate(bytes, 256);
  if (!data) {
    return ffi::Unexpected(ffi::Error::Internal(
        "fusedattn: the plan needs " + std::to_string(bytes) + " bytes of workspace; the call's workspace result has " +
        std::to_string(workspace.size_bytes()) + " and XLA's scratch allocator refused (trace the program where a "
        "GPU is visible, so that fusedattn.jax sizes the workspace result)"));
  }
  launch.workspace = fa::Workspace{*data, bytes};
  return launch;
}

// How many executions found their stream capturing (recorded into a CUDA graph, as XLA does for
// command buffers): tests read it to see that a command buffer really took the call.
std::atomic<long long> captured_executions{0};

void count_capture(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &status) == cudaSuccess && status == cudaStreamCaptureStatusActive) {
    captured_executions.fetch_add(1, std::memory_order_relaxed);
  }
}

// The operands and results of a call, in this order (fusedattn/jax/_calls.py's Call.inputs and
// Call.outputs give the same order); which optional ones are there follows from the spec:
//   forward:  q, k, v, [bias], [sink], [rng], [[seq_len_q], seq_len_kv], [cu_seqlens_q, cu_seqlens_kv],
//             [page_table_k, page_table_v], [mod_scalars], [mod_t0 ..] -> o, [stats], [max_logit], workspace
//   backward: q, k, v, o, stats, d_o, then the same optional ones (never paged)
//             -> d_q, d_k, d_v, [d_bias], [d_sink], workspace
// rng is uint32[4]: Philox seed and offset as two int64 (JAX has no 64-bit integers by default).
// A padded dense call passes seq_len_q only where its query_lengths attribute says so: without it
// every sequence has all of q's rows (the core takes a null seq_len_q so), which spares a decode
// step an array to fill.
// An FP8 spec (q in E4M3 or E5M2) adds float32 scalars after all operands and the amaxes its
// kernels write after all results, before the workspace, each in the order of its pass's table in
// fusedattn/tensor_slots.h (which fusedattn.jax reads through _core.fp8_scale_slots); an FP8 K/V
// cache adds its two descales alone (tensor_slots.h's takes_slot), scalars or [h_kv] arrays.
class Operands {
 public:
  Operands(const ffi::RemainingArgs& args, const ffi::RemainingRets& rets) : args_(args), rets_(rets) {}

  const void* arg() { return next_arg(); }
  void* ret() { return next_ret(); }
  const float* scalar() { return static_cast<const float*>(next_arg()); }
  float* amax() { return static_cast<float*>(next_ret()); }
  const void* arg_if(bool present) { return present ? next_arg() : nullptr; }
  void* ret_if(bool present) { return present ? next_ret() : nullptr; }
  ffi::AnyBuffer workspace() const {  // always the last result
    return rets_.get<ffi::AnyBuffer>(rets_.size() - 1).value().operator*();
  }
  // Whether every operand and result was taken (the workspace aside): the call and the spec agree.
  bool all_taken() const { return arg_ == args_.size() && ret_ + 1 == rets_.size(); }

 private:
  const void* next_arg() {
    auto buffer = args_.get<ffi::AnyBuffer>(arg_++);
    return buffer.has_value() ? buffer.value().untyped_data() : nullptr;
  }
  void* next_ret() {
    auto buffer = rets_.get<ffi::AnyBuffer>(ret_++);
    return buffer.has_value() ? buffer.value()->untyped_data() : nullptr;
  }
  const ffi::RemainingArgs& args_;
  const ffi::RemainingRets& rets_;
  std::size_t arg_ = 0, ret_ = 0;
};

bool has_sink(const fa::AttentionSpec& spec) { return spec.softmax == fa::Softmax::sink; }
bool is_ragged(const fa::AttentionSpec& spec) { return spec.ragged_q() || spec.ragged_kv(); }

// The optional inputs both passes take, after their fixed ones.
template <class Tensors>
void take_optional_inputs(const fa::AttentionSpec& spec, Operands& in, Tensors& t, std::int64_t sequences,
                          bool query_lengths) {
  t.bias = in.arg_if(spec.bias != fa::Bias::none);
  t.sink = static_cast<const float*>(in.arg_if(has_sink(spec)));
  if (const auto* rng = static_cast<const std::int64_t*>(in.arg_if(spec.dropout > 0.0))) {
    t.dropout_seed = rng;
    t.dropout_offset = rng + 1;
  }
  if (spec.padding && !is_ragged(spec)) {
    t.seq_len_q = static_cast<const std::int32_t*>(in.arg_if(query_lengths));
    t.seq_len_kv = static_cast<const std::int32_t*>(in.arg());
  }
  if (is_ragged(spec)) {
    t.ragged.sequences = sequences;
    t.ragged.cu_seqlens_q = static_cast<const std::int32_t*>(in.arg());
    t.ragged.cu_seqlens_kv = static_cast<const std::int32_t*>(in.arg());
  }
}

// A score modifier's scalars (float32 [n]) and tensors, after every other input of the pass.
template <class Tensors>
void take_score_mod(const fa::AttentionSpec& spec, Operands& in, Tensors& t) {
  if (spec.score_mod.scalars() > 0) t.score_mod.scalars = in.scalar();
  for (int i = 0; i < spec.score_mod.tensors(); ++i) t.score_mod.tensors[static_cast<std::size_t>(i)] = in.scalar();
}

// An FP8 call's scales (operands) and amaxes (results), in its pass's table order: every operand
// and every result comes after all of the pass's others, so the two interleave freely here.
template <class Scales>
void take_fp8_scales(const fa::AttentionSpec& spec, Operands& io, Scales& scales) {
  for (const fa::Fp8Slot<Scales>& slot : fa::fp8_slots<Scales>()) {
    if (!fa::takes_slot(spec, slot)) continue;
    if (slot.role == fa::SlotRole::fp8_scale_read) {
      scales.*slot.read = io.scalar();
    } else {
      scales.*slot.written = io.amax();
    }
  }
}

ffi::Error mismatch(const fa::AttentionSpec& spec) {
  return ffi::Error::InvalidArgument("fusedattn: the call's operands do not match its spec [" + fa::to_string(spec) +
                                     "]");
}

// One execution: the pass's tensors taken from the operands by `take`, checked against the spec,
// then the plan enqueued with its workspace.
template <class Tensors, class Take>
ffi::Error run_pass(cudaStream_t stream, ffi::ScratchAllocator& scratch, std::int32_t device, PlanState* state,
                    const ffi::RemainingArgs& args, const ffi::RemainingRets& rets, float scale, Take take) {
  count_capture(stream);
  try {
    Operands io(args, rets);
    Tensors t;
    const fa::AttentionSpec& spec = state->spec.spec();
    take(spec, io, t);
    if (!io.all_taken()) return mismatch(spec);
    auto launch = prepare_launch(device, state, scratch, io.workspace());
    if (launch.has_error()) return launch.error();
    launch->plan->run(t, scale, stream, launch->workspace);
    return ffi::Error::Success();
  } catch (const fa::Error& error) {
    return to_ffi_error(error);
  }
}

ffi::Error run_forward(cudaStream_t stream, ffi::ScratchAllocator scratch, std::int32_t device, PlanState* state,
                       ffi::RemainingArgs args, ffi::RemainingRets rets, std::string_view /*spec*/,
                       std::int64_t sequences, float scale, bool query_lengths) {
  return run_pass<fa::ForwardTensors>(
      stream, scratch, device, state, args, rets, scale,
      [sequences, query_lengths](const fa::AttentionSpec& spec, Operands& io, fa::ForwardTensors& t) {
        t.q = io.arg();
        t.k = io.arg();
        t.v = io.arg();
        take_optional_inputs(spec, io, t, sequences, query_lengths);
        t.page_table_k = static_cast<const std::int32_t*>(io.arg_if(spec.kv_pages > 0));
        t.page_table_v = static_cast<const std::int32_t*>(io.arg_if(spec.kv_pages > 0));
        take_score_mod(spec, io, t);
        t.o = io.ret();
        t.stats = static_cast<float*>(io.ret_if(spec.stats));
        t.max_logit = static_cast<float*>(io.ret_if(spec.max_logit != fa::MaxLogit::none));
        take_fp8_scales(spec, io, t.fp8);
      });
}

ffi::Error run_backward(cudaStream_t stream, ffi::ScratchAllocator scratch, std::int32_t device, PlanState* state,
                        ffi::RemainingArgs args, ffi::RemainingRets rets, std::string_view /*spec*/,
                        std::int64_t sequences, float scale, bool query_lengths) {
  return run_pass<fa::BackwardTensors>(
      stream, scratch, device, state, args, rets, scale,
      [sequences, query_lengths](const fa::AttentionSpec& spec, Operands& io, fa::BackwardTensors& t) {
        t.q = io.arg();
        t.k = io.arg();
        t.v = io.arg();
        t.o = io.arg();
        t.stats = static_cast<const float*>(io.arg());
        t.d_o = io.arg();
        take_optional_inputs(spec, io, t, sequences, query_lengths);
        take_score_mod(spec, io, t);
        t.d_q = io.ret();
        t.d_k = io.ret();
        t.d_v = io.ret();
        t.d_bias = io.ret_if(spec.bias_grad);
        t.d_sink = static_cast<float*>(io.ret_if(has_sink(spec)));
        take_fp8_scales(spec, io, t.fp8);
      });
}

// What both execute stages take: XLA's stream, its scratch memory, the device, the state, the
// operands and results (as above), and the attributes.
auto execute_binding() {
  return ffi::Ffi::Bind()
      .Ctx<ffi::PlatformStream<cudaStream_t>>()
      .Ctx<ffi::ScratchAllocator>()
      .Ctx<ffi::DeviceOrdinal>()
      .Ctx<ffi::State<PlanState>>()
      .RemainingArgs()
      .RemainingRets()
      .Attr<std::string_view>("spec")
      .Attr<std::int64_t>("sequences")
      .Attr<float>("scale")
      .Attr<bool>("query_lengths");
}

}  // namespace

XLA_FFI_DEFINE_HANDLER(kForwardInstantiate, instantiate_forward,
                       ffi::Ffi::BindInstantiate()
                           .Attr<std::string_view>("spec")
                           .Attr<std::int64_t>("sequences")
                           .Attr<float>("scale")
                           .Attr<bool>("query_lengths"));
XLA_FFI_DEFINE_HANDLER(kBackwardInstantiate, instantiate_backward,
                       ffi::Ffi::BindInstantiate()
                           .Attr<std::string_view>("spec")
                           .Attr<std::int64_t>("sequences")
                           .Attr<float>("scale")
                           .Attr<bool>("query_lengths"));
// Binds no attributes, which XLA allows (it checks the count only where some are bound).
XLA_FFI_DEFINE_HANDLER(kInitialize, initialize,
                       ffi::Ffi::BindInitialize().Ctx<ffi::DeviceOrdinal>().Ctx<ffi::State<PlanState>>());
XLA_FFI_DEFINE_HANDLER(kForwardExecute, run_forward, execute_binding(), {ffi::Traits::kCmdBufferCompatible});
XLA_FFI_DEFINE_HANDLER(kBackwardExecute, run_backward, execute_binding(), {ffi::Traits::kCmdBufferCompatible});

namespace {

nb::capsule capsule(const void* pointer) { return nb::capsule(const_cast<void*>(pointer)); }

const XLA_FFI_TypeInfo kPlanStateInfo = ffi::MakeTypeInfo<PlanState>();

nb::dict stages(const void* instantiate, const void* execute) {
  nb::dict out;
  out["instantiate"] = capsule(instantiate);
  out["initialize"] = capsule(reinterpret_cast<const void*>(kInitialize));
  out["execute"] = capsule(execute);
  return out;
}

}  // namespace

NB_MODULE(_jax_ffi, m) {
  m.doc() = "XLA FFI handlers for fusedattn.jax (CUDA platform).";
  m.def("handlers", [] {
    nb::dict out;
    out["fusedattn_forward"] =
        stages(reinterpret_cast<const void*>(kForwardInstantiate), reinterpret_cast<const void*>(kForwardExecute));
    out["fusedattn_backward"] =
        stages(reinterpret_cast<const void*>(kBackwardInstantiate), reinterpret_cast<const void*>(kBackwardExecute));
    return out;
  });
  m.def(
      "captured_executions", [] { return captured_executions.load(); },
      "How many executions ran while their stream was being captured (XLA command buffers).");
  m.def("plan_state_type", [] {
    nb::dict out;
    out["type_id"] = capsule(&PlanState::id);
    out["type_info"] = capsule(&kPlanStateInfo);
    return out;
  });
}
