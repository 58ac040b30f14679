// fusedattn._torch_ops's workspaces and enqueue (torch_ops.cpp): a call's cuDNN workspace from
// PyTorch's caching allocator, kept per stream while small, and a plan run on the current stream.
// A header of the module's one translation unit, so that compiling it for a user's PyTorch stays
// one compiler run (fusedattn/torch/_fast_path_compile.py).
#pragma once

#include <ATen/ATen.h>
#include <ATen/cuda/EmptyTensor.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <cstddef>
#include <mutex>
#include <vector>

#include "fusedattn/attention.h"

namespace fusedattn_torch {

namespace fa = fusedattn;

// --- workspaces ----------------------------------------------------------------------------------

// A call's workspace. Small ones are kept per stream and reused by every later call on that stream,
// which the stream runs in order: no trip through the caching allocator's lock and bookkeeping on
// every call, and a stable address lets repeated calls replay. PyTorch keeps cuBLAS's workspaces
// the same way. A capturing stream gets fresh memory from the allocator (from the graph's own pool),
// since a captured graph may later run beside anything else that uses the stream's workspace;
// so do large workspaces (their kernels outlast an allocation many times over) and streams past
// the first few dozen. `per_call` holds fresh memory until the work is enqueued.
constexpr std::size_t kKeptWorkspaceBytes = std::size_t{4} << 20;
constexpr std::size_t kKeptWorkspaceStreams = 32;

inline void* call_workspace(std::size_t bytes, int device, cudaStream_t stream, c10::DataPtr& per_call) {
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

// Runs `plan` with `tensors` on the device's current stream.
template <class Tensors>
void enqueue(const fa::Plan& plan, const Tensors& tensors, float scale, int device) {
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device).stream();
  const std::size_t bytes = plan.workspace_bytes();
  c10::DataPtr per_call;
  void* workspace = call_workspace(bytes, device, stream, per_call);
  plan.run(tensors, scale, stream, fa::Workspace{workspace, bytes});
}

inline at::Tensor empty_like_strided(const at::Tensor& t) {
  return at::detail::empty_strided_cuda(t.sizes(), t.strides(), t.scalar_type(), t.device());
}

}  // namespace fusedattn_torch
