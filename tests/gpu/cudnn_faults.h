// GPU tier: faults injected into cuDNN's backend calls, so a test can show what a failure in the
// middle of a plan build or an execution leaves behind. The executable defines the two backend
// entry points the frontend calls (cudnnBackendFinalize for every descriptor of a build,
// cudnnBackendExecute for a run); the dynamic linker finds them before libcudnn's, as with the
// allocators of device_allocations.h, and each forwards to libcudnn's own unless told to fail.
#pragma once

#include <functional>

namespace fusedattn {

enum class CudnnCall { finalize, execute };

/// Runs `work` with the `nth` call to `call` (1: the first) answered by `status` (a cudnnStatus_t)
/// without reaching cuDNN; nth = 0 fails none. Returns how many calls to `call` `work` made.
long with_cudnn_failure(CudnnCall call, long nth, int status, const std::function<void()>& work);

}  // namespace fusedattn
