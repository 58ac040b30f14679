// Internal: lets this thread allocate and synchronize while another stream of the process is
// being captured into a CUDA graph (under the default, global capture mode those calls would
// fail and invalidate that capture). Plan builds and autotuning run inside one: they touch no
// stream of the caller's, so a first call under capture builds its plan and the capture goes on.
#pragma once

#include <cuda_runtime_api.h>

namespace fusedattn::detail {

class RelaxedCapture {
 public:
  RelaxedCapture() { cudaThreadExchangeStreamCaptureMode(&mode_); }
  ~RelaxedCapture() { cudaThreadExchangeStreamCaptureMode(&mode_); }
  RelaxedCapture(const RelaxedCapture&) = delete;
  RelaxedCapture& operator=(const RelaxedCapture&) = delete;

 private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;  // the previous mode while inside
};

}  // namespace fusedattn::detail
