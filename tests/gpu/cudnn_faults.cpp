// GPU tier: cuDNN's backend calls, wrapped so that one of them can be made to fail (cudnn_faults.h).
#include "cudnn_faults.h"

#include <dlfcn.h>

#include <atomic>
#include <string>

#include <cudnn_graph.h>

#include "fusedattn/errors.h"

namespace {

struct Arming {
  std::atomic<long> calls{0};
  std::atomic<long> fail_at{0};  // 0: none
  std::atomic<int> status{CUDNN_STATUS_SUCCESS};
};
std::atomic<bool> g_watching{false};
Arming g_finalize, g_execute;

// Counts this call and says whether it is the one to fail (then with which status).
bool fails(Arming& arming, cudnnStatus_t& status) {
  if (!g_watching.load(std::memory_order_relaxed)) return false;
  const long call = arming.calls.fetch_add(1) + 1;
  if (call != arming.fail_at.load()) return false;
  status = static_cast<cudnnStatus_t>(arming.status.load());
  return true;
}

template <class Function>
Function next(const char* name) {
  return reinterpret_cast<Function>(dlsym(RTLD_NEXT, name));
}

}  // namespace

extern "C" {

cudnnStatus_t cudnnBackendFinalize(cudnnBackendDescriptor_t descriptor) {
  static const auto real = next<cudnnStatus_t (*)(cudnnBackendDescriptor_t)>("cudnnBackendFinalize");
  cudnnStatus_t status;
  if (fails(g_finalize, status)) return status;
  return real ? real(descriptor) : CUDNN_STATUS_NOT_INITIALIZED;
}

cudnnStatus_t cudnnBackendExecute(cudnnHandle_t handle, cudnnBackendDescriptor_t plan, cudnnBackendDescriptor_t pack) {
  static const auto real =
      next<cudnnStatus_t (*)(cudnnHandle_t, cudnnBackendDescriptor_t, cudnnBackendDescriptor_t)>("cudnnBackendExecute");
  cudnnStatus_t status;
  if (fails(g_execute, status)) return status;
  return real ? real(handle, plan, pack) : CUDNN_STATUS_NOT_INITIALIZED;
}

}  // extern "C"

namespace fusedattn {

long with_cudnn_failure(CudnnCall call, long nth, int status, const std::function<void()>& work) {
  const char* name = call == CudnnCall::finalize ? "cudnnBackendFinalize" : "cudnnBackendExecute";
  const void* ours = call == CudnnCall::finalize ? reinterpret_cast<const void*>(&cudnnBackendFinalize)
                                                 : reinterpret_cast<const void*>(&cudnnBackendExecute);
  if (dlsym(RTLD_DEFAULT, name) != ours) {
    throw Error(ErrorKind::setup, std::string("with_cudnn_failure: ") + name +
                                      " resolves past the test's wrapper, so no fault would be injected");
  }
  Arming& arming = call == CudnnCall::finalize ? g_finalize : g_execute;
  arming.calls = 0;
  arming.status = status;
  arming.fail_at = nth;
  g_watching = true;
  struct Done {
    Arming& arming;
    ~Done() {
      g_watching = false;
      arming.fail_at = 0;
    }
  } done{arming};
  work();
  return arming.calls.load();
}

}  // namespace fusedattn
