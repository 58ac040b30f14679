// GPU tier: the process's own device allocations, counted where it asks the CUDA runtime for
// memory, so a test can show that a cached call allocates none while other test processes share
// the GPU (ctest -j): device-wide free memory moves with everyone's allocations, this count only
// with this process's.
#pragma once

#include <functional>

namespace fusedattn {

/// Calls to the runtime's device allocators (cudaMalloc, cudaMallocAsync, cudaMallocFromPoolAsync,
/// cudaMallocManaged, cudaMallocPitch) that `work` makes, from this executable or a library it
/// loaded that imports them from libcudart (libfusedattn does). Not seen: libraries that carry a
/// runtime of their own, as cuDNN does; the device-wide test (Serial*) covers those.
long count_device_allocations(const std::function<void()>& work);

/// As count_device_allocations, with the `nth` of those allocations (1: the first) failing with
/// cudaErrorMemoryAllocation without reaching the runtime; 0 fails none.
long with_failing_device_allocation(long nth, const std::function<void()>& work);

}  // namespace fusedattn
