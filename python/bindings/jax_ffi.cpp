// fusedattn._jax_ffi: XLA FFI handlers (the typed FFI API, headers from the installed jaxlib) that
// run fusedattn plans inside XLA programs on CUDA devices.
//
// The plan is built once per instantiation of the call (the INSTANTIATE stage, from the spec
// string attribute), never on the execute path, which only enqueues the plan on XLA's stream
// with a workspace from XLA's scratch allocator: no allocation of ours, no synchronization, so
// the handlers declare themselves safe for command buffers (CUDA graphs).
#include <nanobind/nanobind.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include <cuda_runtime_api.h>

#include "fusedattn/attention.h"
#include "fusedattn/errors.h"
#include "xla/ffi/api/ffi.h"

namespace nb = nanobind;
namespace ffi = xla::ffi;
namespace fa = fusedattn;

namespace {

// What an instantiated call keeps: its plan (held, so the cache may evict it meanwhile).
struct PlanState {
  static ffi::TypeId id;
  std::shared_ptr<const fa::Plan> plan;
};
ffi::TypeId PlanState::id = {};

ffi::ErrorOr<std::unique_ptr<PlanState>> instantiate(std::int32_t device, std::string_view spec, bool backward) {
  try {
    if (cudaSetDevice(device) != cudaSuccess) return ffi::Unexpected(ffi::Error::Internal("cudaSetDevice failed"));
    auto state = std::make_unique<PlanState>();
    state->plan = fa::get_plan(fa::parse_spec(std::string(spec)), backward ? fa::Pass::backward : fa::Pass::forward);
    return state;
  } catch (const fa::Error& error) {
    return ffi::Unexpected(ffi::Error::InvalidArgument(error.what()));
  }
}

ffi::ErrorOr<std::unique_ptr<PlanState>> instantiate_forward(std::int32_t device, std::string_view spec) {
  return instantiate(device, spec, false);
}
ffi::ErrorOr<std::unique_ptr<PlanState>> instantiate_backward(std::int32_t device, std::string_view spec) {
  return instantiate(device, spec, true);
}

// Workspace from XLA's scratch allocator (stream-ordered, part of the program's memory plan).
ffi::ErrorOr<fa::Workspace> workspace(ffi::ScratchAllocator& scratch, const fa::Plan& plan) {
  const std::size_t bytes = plan.workspace_bytes();
  if (bytes == 0) return fa::Workspace{};
  std::optional<void*> data = scratch.Allocate(bytes, 256);
  if (!data) {
    return ffi::Unexpected(
        ffi::Error::Internal("fusedattn: XLA's scratch allocator refused " + std::to_string(bytes) + " bytes"));
  }
  return fa::Workspace{*data, bytes};
}

ffi::Error run_forward(cudaStream_t stream, ffi::ScratchAllocator scratch, PlanState* state, ffi::AnyBuffer q,
                       ffi::AnyBuffer k, ffi::AnyBuffer v, ffi::Result<ffi::AnyBuffer> o,
                       ffi::Result<ffi::AnyBuffer> stats, float scale) {
  auto ws = workspace(scratch, *state->plan);
  if (ws.has_error()) return ws.error();
  try {
    fa::ForwardTensors t;
    t.q = q.untyped_data();
    t.k = k.untyped_data();
    t.v = v.untyped_data();
    t.o = o->untyped_data();
    t.stats = state->plan->spec().stats ? static_cast<float*>(stats->untyped_data()) : nullptr;
    state->plan->run(t, scale, stream, ws.value());
    return ffi::Error::Success();
  } catch (const fa::Error& error) {
    return ffi::Error::Internal(error.what());
  }
}

ffi::Error run_backward(cudaStream_t stream, ffi::ScratchAllocator scratch, PlanState* state, ffi::AnyBuffer q,
                        ffi::AnyBuffer k, ffi::AnyBuffer v, ffi::AnyBuffer o, ffi::AnyBuffer d_o, ffi::AnyBuffer stats,
                        ffi::Result<ffi::AnyBuffer> d_q, ffi::Result<ffi::AnyBuffer> d_k,
                        ffi::Result<ffi::AnyBuffer> d_v, float scale) {
  auto ws = workspace(scratch, *state->plan);
  if (ws.has_error()) return ws.error();
  try {
    fa::BackwardTensors t;
    t.q = q.untyped_data();
    t.k = k.untyped_data();
    t.v = v.untyped_data();
    t.o = o.untyped_data();
    t.d_o = d_o.untyped_data();
    t.stats = static_cast<const float*>(stats.untyped_data());
    t.d_q = d_q->untyped_data();
    t.d_k = d_k->untyped_data();
    t.d_v = d_v->untyped_data();
    state->plan->run(t, scale, stream, ws.value());
    return ffi::Error::Success();
  } catch (const fa::Error& error) {
    return ffi::Error::Internal(error.what());
  }
}

// What both execute stages take first: XLA's stream, its scratch memory, the instantiated plan.
auto execute_binding() {
  return ffi::Ffi::Bind()
      .Ctx<ffi::PlatformStream<cudaStream_t>>()
      .Ctx<ffi::ScratchAllocator>()
      .Ctx<ffi::State<PlanState>>();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER(kForwardInstantiate, instantiate_forward,
                       ffi::Ffi::BindInstantiate().Ctx<ffi::DeviceOrdinal>().Attr<std::string_view>("spec"));
XLA_FFI_DEFINE_HANDLER(kBackwardInstantiate, instantiate_backward,
                       ffi::Ffi::BindInstantiate().Ctx<ffi::DeviceOrdinal>().Attr<std::string_view>("spec"));
XLA_FFI_DEFINE_HANDLER(kForwardExecute, run_forward,
                       execute_binding()
                           .Arg<ffi::AnyBuffer>()
                           .Arg<ffi::AnyBuffer>()
                           .Arg<ffi::AnyBuffer>()
                           .Ret<ffi::AnyBuffer>()
                           .Ret<ffi::AnyBuffer>()
                           .Attr<float>("scale"),
                       {ffi::Traits::kCmdBufferCompatible});
XLA_FFI_DEFINE_HANDLER(kBackwardExecute, run_backward,
                       execute_binding()
                           .Arg<ffi::AnyBuffer>()
                           .Arg<ffi::AnyBuffer>()
                           .Arg<ffi::AnyBuffer>()
                           .Arg<ffi::AnyBuffer>()
                           .Arg<ffi::AnyBuffer>()
                           .Arg<ffi::AnyBuffer>()
                           .Ret<ffi::AnyBuffer>()
                           .Ret<ffi::AnyBuffer>()
                           .Ret<ffi::AnyBuffer>()
                           .Attr<float>("scale"),
                       {ffi::Traits::kCmdBufferCompatible});

namespace {

template <class T>
nb::capsule capsule(T* pointer) {
  return nb::capsule(reinterpret_cast<void*>(pointer));
}

const XLA_FFI_TypeInfo kPlanStateInfo = ffi::MakeTypeInfo<PlanState>();

}  // namespace

NB_MODULE(_jax_ffi, m) {
  m.doc() = "XLA FFI handlers for fusedattn.jax (CUDA platform).";
  m.def("handlers", [] {
    nb::dict out;
    nb::dict forward, backward;
    forward["instantiate"] = capsule(kForwardInstantiate);
    forward["execute"] = capsule(kForwardExecute);
    backward["instantiate"] = capsule(kBackwardInstantiate);
    backward["execute"] = capsule(kBackwardExecute);
    out["fusedattn_forward"] = forward;
    out["fusedattn_backward"] = backward;
    return out;
  });
  m.def("plan_state_type", [] {
    nb::dict out;
    out["type_id"] = capsule(&PlanState::id);
    out["type_info"] = capsule(const_cast<XLA_FFI_TypeInfo*>(&kPlanStateInfo));
    return out;
  });
}
