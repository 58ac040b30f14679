// Internal: what the decode kernels share (the split decode's, the merge, fusedattn's decode kernel):
// the early launch of a kernel behind the one before it (in clusters of blocks where asked), and the
// rows of a call's sequences.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

#include "exec/decode_merge.h"

namespace fusedattn::detail {

// Programmatic dependent launch (SM 9.0): a kernel is launched while the kernel before it on the
// stream is still running, and waits here, at its first instruction, until that one has finished
// and its writes are visible; what is saved is the launch's latency between the two. Called before
// any read or write, so it overlaps nothing of the previous kernel's work.
__device__ __forceinline__ void wait_for_the_previous_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Lets the next kernel on the stream be launched (it still waits for this one to finish before it
// reads anything): called once a block's reading is done, so the next launch overlaps the writes.
__device__ __forceinline__ void let_the_next_kernel_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Sequence i's queries: the caller's seq_len_q[i], or every one of s_q without it (attention.h).
__device__ __forceinline__ int queries_of(const std::int32_t* len_q, std::int64_t i, int all) {
  return len_q != nullptr ? len_q[i] : all;
}

// A ragged sequence's count from its cumulative offsets; entries from `sequences` on are empty.
__device__ __forceinline__ int count_of(const std::int32_t* cumulative, std::int64_t i, int sequences) {
  return i < sequences ? cumulative[i + 1] - cumulative[i] : 0;
}

// kernel<<<blocks, threads, shared, stream>>>(args...), launched early where `early`
// (decode_early_launch), in clusters of `cluster` blocks along x where cluster > 1 (SM 9.0 and newer;
// blocks.x a multiple of it).
template <class... Params, class... Args>
cudaError_t launch_in_clusters(void (*kernel)(Params...), bool early, unsigned cluster, dim3 blocks,
                               unsigned int threads, std::size_t shared, cudaStream_t stream, Args&&... args) {
  cudaLaunchAttribute attributes[2] = {};
  unsigned count = 0;
  if (early) {
    attributes[count].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attributes[count++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (cluster > 1) {
    attributes[count].id = cudaLaunchAttributeClusterDimension;
    attributes[count++].val.clusterDim = {cluster, 1, 1};
  }
  cudaLaunchConfig_t config{};
  config.gridDim = blocks;
  config.blockDim = dim3(threads);
  config.dynamicSmemBytes = shared;
  config.stream = stream;
  config.attrs = count > 0 ? attributes : nullptr;
  config.numAttrs = count;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

// The same, one block at a time (no clusters).
template <class... Params, class... Args>
cudaError_t launch(void (*kernel)(Params...), bool early, dim3 blocks, unsigned int threads, std::size_t shared,
                   cudaStream_t stream, Args&&... args) {
  return launch_in_clusters(kernel, early, 1, blocks, threads, shared, stream, std::forward<Args>(args)...);
}

}  // namespace fusedattn::detail
