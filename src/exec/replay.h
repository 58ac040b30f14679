// Internal: replays a plan's cuDNN work from CUDA graphs recorded for calls seen before.
//
// cuDNN's execute spends most of a small call's host time building a variant pack and the
// kernels' arguments anew on every call, even when nothing but the pointers could have changed:
// 7.5–8.0 µs at a tiny shape on an H200 host, where a replayed call cost 3.2, what launching the
// recording alone costs (README, "Checking and measuring"). The price is on the GPU: back to
// back, a tiny recorded call takes 1–3 µs longer there than the same kernels launched on the
// stream, which matters only where the GPU rather than the host limits a stream of tiny calls.
// A loop over the same buffers,
// which PyTorch's caching allocator makes the common case, hands a plan the same pointers again
// and again: such a call is recorded into a CUDA graph the second time it is seen and replayed
// from then on. What a recording fixes is all in its key: every pointer, the workspace and the
// scale's value (cuDNN's only pass-by-value scalar here).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <mutex>

#include <cuda_runtime_api.h>
#include <cudnn.h>

#include "fusedattn/attention.h"
#include "graph/sdpa_graph.h"

namespace fusedattn::detail {

/// Everything a recorded graph bakes in.
struct ReplayKey {
  void* pointers[graph::kUidEnd] = {};  // in the graph's UID order; the scale's slot holds nullptr
  int count = 0;
  void* workspace = nullptr;
  std::uint32_t scale_bits = 0;

  friend bool operator==(const ReplayKey& a, const ReplayKey& b) noexcept {
    return a.count == b.count && a.workspace == b.workspace && a.scale_bits == b.scale_bits &&
           std::memcmp(a.pointers, b.pointers, sizeof(void*) * static_cast<std::size_t>(a.count)) == 0;
  }
};

struct ReplayKeyHash {
  std::size_t operator()(const ReplayKey& key) const noexcept;
};

/// Bounded per-plan store of recorded calls: fixed slots, so a call allocates nothing. Thread-safe;
/// one lock per plan.
class ReplayCache {
 public:
  /// Calls remembered per plan, recorded or seen once. A model calls one plan with one pointer set
  /// per layer; 64 covers the layers of today's large models. Least recently used goes first.
  static constexpr int kSlots = 64;

  ReplayCache() = default;
  ReplayCache(const ReplayCache&) = delete;
  ReplayCache& operator=(const ReplayCache&) = delete;
  ~ReplayCache();

  /// Launches the call's recorded graph on `stream` and returns true; or, for a call seen once
  /// before, records `graph` with `sorted_pointers` and `workspace` and launches that. False
  /// when the caller must execute the call itself: first sightings, calls that cannot be
  /// recorded, and plans whose recordings stopped paying (see replay.cpp).
  bool launch(const ReplayKey& key, cudaStream_t stream, const graph::CompiledGraph& graph, cudnnHandle_t handle,
              void** sorted_pointers, void* workspace);
  /// Counts a call the plan executed without asking (stream capture, replay switched off).
  void note_executed();
  ReplayStats stats() const;

 private:
  int find(const ReplayKey& key, std::size_t hash) const noexcept;
  int victim() const noexcept;
  bool recording_pays() const noexcept;
  static cudaGraphExec_t record(const graph::CompiledGraph& graph, cudnnHandle_t handle, void** sorted_pointers,
                                void* workspace) noexcept;

  mutable std::mutex mutex_;
  std::uint64_t clock_ = 0;                 // ticks once per lookup; orders the slots' last use
  std::uint64_t last_use_[kSlots] = {};     // 0: an empty slot
  std::size_t hashes_[kSlots] = {};         // scanned first, so most slots are never compared in full
  ReplayKey keys_[kSlots];
  cudaGraphExec_t execs_[kSlots] = {};      // null: seen once, not recorded
  ReplayStats stats_;
  bool disabled_ = false;  // recording failed once: this plan executes through cuDNN from then on
};

/// The switch set_replay() turns; FUSEDATTN_REPLAY=0 starts it off.
bool replay_enabled() noexcept;

}  // namespace fusedattn::detail
