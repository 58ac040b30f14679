// GPU tier: the runtime's device allocators, wrapped so that their calls are counted while a test
// asks (and one of them refused, if it says so). The executable's definitions come first in the
// dynamic linker's lookup, so libfusedattn's calls reach them too (as a replaced operator new
// does); each forwards to libcudart's own.
#include "device_allocations.h"

#include <dlfcn.h>

#include <atomic>
#include <string>

#include <cuda_runtime_api.h>

#include "fusedattn/errors.h"

namespace {

std::atomic<bool> g_counting{false};
std::atomic<long> g_device_allocations{0};
std::atomic<long> g_fail_at{0};  // the counted allocation to refuse (1: the first), 0: none

// Counts the allocation while a test asks; true when it is the one to refuse.
bool refused_allocation() {
  if (!g_counting.load(std::memory_order_relaxed)) return false;
  return g_device_allocations.fetch_add(1, std::memory_order_relaxed) + 1 == g_fail_at.load();
}

// The next definition of `name` after this executable's: libcudart's.
template <class Function>
Function next(const char* name) {
  void* symbol = dlsym(RTLD_NEXT, name);
  return reinterpret_cast<Function>(symbol);
}

}  // namespace

extern "C" {

cudaError_t CUDARTAPI cudaMalloc(void** pointer, size_t bytes) {
  static const auto real = next<cudaError_t (*)(void**, size_t)>("cudaMalloc");
  if (refused_allocation()) return cudaErrorMemoryAllocation;
  return real ? real(pointer, bytes) : cudaErrorNotSupported;
}

cudaError_t CUDARTAPI cudaMallocAsync(void** pointer, size_t bytes, cudaStream_t stream) {
  static const auto real = next<cudaError_t (*)(void**, size_t, cudaStream_t)>("cudaMallocAsync");
  if (refused_allocation()) return cudaErrorMemoryAllocation;
  return real ? real(pointer, bytes, stream) : cudaErrorNotSupported;
}

cudaError_t CUDARTAPI cudaMallocFromPoolAsync(void** pointer, size_t bytes, cudaMemPool_t pool, cudaStream_t stream) {
  static const auto real = next<cudaError_t (*)(void**, size_t, cudaMemPool_t, cudaStream_t)>("cudaMallocFromPoolAsync");
  if (refused_allocation()) return cudaErrorMemoryAllocation;
  return real ? real(pointer, bytes, pool, stream) : cudaErrorNotSupported;
}

cudaError_t CUDARTAPI cudaMallocManaged(void** pointer, size_t bytes, unsigned int flags) {
  static const auto real = next<cudaError_t (*)(void**, size_t, unsigned int)>("cudaMallocManaged");
  if (refused_allocation()) return cudaErrorMemoryAllocation;
  return real ? real(pointer, bytes, flags) : cudaErrorNotSupported;
}

cudaError_t CUDARTAPI cudaMallocPitch(void** pointer, size_t* pitch, size_t width, size_t height) {
  static const auto real = next<cudaError_t (*)(void**, size_t*, size_t, size_t)>("cudaMallocPitch");
  if (refused_allocation()) return cudaErrorMemoryAllocation;
  return real ? real(pointer, pitch, width, height) : cudaErrorNotSupported;
}

}  // extern "C"

namespace fusedattn {

long count_device_allocations(const std::function<void()>& work) { return with_failing_device_allocation(0, work); }

long with_failing_device_allocation(long nth, const std::function<void()>& work) {
  // The count means something only if the process's lookup finds these wrappers first: then
  // libfusedattn, which imports the allocators, calls them too.
  struct Wrapper {
    const char* name;
    const void* address;
  };
  const Wrapper wrappers[] = {{"cudaMalloc", reinterpret_cast<const void*>(&cudaMalloc)},
                              {"cudaMallocAsync", reinterpret_cast<const void*>(&cudaMallocAsync)}};
  for (const Wrapper& wrapper : wrappers) {
    if (dlsym(RTLD_DEFAULT, wrapper.name) != wrapper.address) {
      throw Error(ErrorKind::setup, std::string("count_device_allocations: ") + wrapper.name +
                                        " resolves past the test's wrapper, so allocations would go uncounted");
    }
  }
  g_device_allocations = 0;
  g_fail_at = nth;
  g_counting = true;
  struct Done {
    ~Done() {
      g_counting = false;
      g_fail_at = 0;
    }
  } done;
  work();
  return g_device_allocations.load();
}

}  // namespace fusedattn
