// testing/kernel_timing.h — GPU time of a call measured with CUDA events, launch cost left out.
#pragma once

#include <functional>

#include <cuda_runtime_api.h>

namespace fusedattn::check {

/// Kernel time of `call` on `stream`: `warmup` untimed calls, then `iters` calls each between a
/// pair of CUDA events, enqueued back to back behind a short host-side hold of the stream and
/// synchronized once at the end, so the calls run back to back and each pair measures GPU time,
/// not launch cost (which matters at small shapes). Returns the median in milliseconds.
double median_kernel_ms(const std::function<void()>& call, int warmup, int iters, cudaStream_t stream);

}  // namespace fusedattn::check
