// ReplayCache: CUDA graphs of calls seen before, launched in place of cuDNN's execute.
#include "exec/replay.h"

#include <atomic>
#include <exception>

#include "exec/cuda_check.h"
#include "exec/environment_switch.h"

namespace fusedattn::detail {
namespace {

// A recording costs a few hundred microseconds (cuDNN fills the graph, CUDA instantiates it), so
// it must be replayed often enough to repay that. The first recordings of a plan are free to try;
// after them a plan goes on recording only while its graphs have been launched four times per
// recording on average. A workload whose pointers repeat only once (A A B B C C ...) thus stops
// after 8 recordings, at a cost of a few milliseconds in all, instead of paying on every call.
constexpr std::uint64_t kFreeRecordings = 8;
constexpr std::uint64_t kLaunchesPerRecording = 4;

void destroy(cudaGraphExec_t exec) noexcept {
  if (exec != nullptr) cudaGraphExecDestroy(exec);
}

}  // namespace

std::size_t ReplayKeyHash::operator()(const ReplayKey& key) const noexcept {
  // The usual hash_combine over the words that identify the call.
  std::uint64_t h = 0;
  auto mix = [&h](std::uint64_t word) {
    h ^= word + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  };
  for (int i = 0; i < key.count; ++i) mix(reinterpret_cast<std::uintptr_t>(key.pointers[i]));
  mix(reinterpret_cast<std::uintptr_t>(key.workspace));
  mix(key.scale_bits);
  return static_cast<std::size_t>(h);
}

ReplayCache::~ReplayCache() {
  for (cudaGraphExec_t exec : execs_) destroy(exec);
}

bool ReplayCache::launch(const ReplayKey& key, cudaStream_t stream, const graph::CompiledGraph& graph,
                         cudnnHandle_t handle, void** sorted_pointers, void* workspace) {
  const std::size_t hash = ReplayKeyHash{}(key);
  std::lock_guard<std::mutex> lock(mutex_);  // held through the launch: an exec may not launch from two threads at once
  if (disabled_) {
    ++stats_.executed;
    return false;
  }
  int slot = find(key, hash);
  if (slot < 0) {  // a first sighting: remember it in the least recently used slot
    slot = victim();
    if (execs_[slot] != nullptr) ++stats_.evicted;
    destroy(execs_[slot]);
    execs_[slot] = nullptr;
    keys_[slot] = key;
    hashes_[slot] = hash;
    last_use_[slot] = ++clock_;
    ++stats_.executed;
    return false;
  }
  last_use_[slot] = ++clock_;
  if (execs_[slot] == nullptr) {
    if (!recording_pays()) {
      ++stats_.executed;
      return false;
    }
    execs_[slot] = record(graph, handle, sorted_pointers, workspace);
    if (execs_[slot] == nullptr) {
      disabled_ = true;
      ++stats_.executed;
      return false;
    }
    ++stats_.recorded;
  }
  check_cuda(cudaGraphLaunch(execs_[slot], stream), "cudaGraphLaunch (replaying a recorded call)");
  ++stats_.replayed;
  return true;
}

void ReplayCache::note_executed() {
  std::lock_guard<std::mutex> lock(mutex_);
  ++stats_.executed;
}

int ReplayCache::find(const ReplayKey& key, std::size_t hash) const noexcept {
  for (int i = 0; i < kSlots; ++i) {
    if (last_use_[i] != 0 && hashes_[i] == hash && keys_[i] == key) return i;
  }
  return -1;
}

int ReplayCache::victim() const noexcept {
  int oldest = 0;
  for (int i = 1; i < kSlots; ++i) {
    if (last_use_[i] < last_use_[oldest]) oldest = i;
  }
  return oldest;
}

ReplayStats ReplayCache::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

bool ReplayCache::recording_pays() const noexcept {
  return stats_.recorded < kFreeRecordings || stats_.replayed >= kLaunchesPerRecording * stats_.recorded;
}

// The graph is filled by cuDNN, then instantiated; the template is not needed after that. Any
// failure only means this plan is not replayed: the call still runs through cuDNN's execute.
cudaGraphExec_t ReplayCache::record(const graph::CompiledGraph& graph, cudnnHandle_t handle, void** sorted_pointers,
                                    void* workspace) noexcept {
  cudaGraph_t recording = nullptr;
  if (cudaGraphCreate(&recording, 0) != cudaSuccess) return nullptr;
  cudaGraphExec_t exec = nullptr;
  try {
    if (graph.record(handle, sorted_pointers, workspace, recording) &&
        cudaGraphInstantiate(&exec, recording, 0) != cudaSuccess) {
      exec = nullptr;
    }
  } catch (const std::exception&) {
    exec = nullptr;
  }
  cudaGraphDestroy(recording);
  return exec;
}

namespace {
std::atomic<bool>& replay_switch() noexcept {
  static std::atomic<bool> on{switch_on_unless_zero("FUSEDATTN_REPLAY")};
  return on;
}
}  // namespace

bool replay_enabled() noexcept { return replay_switch().load(std::memory_order_relaxed); }

}  // namespace fusedattn::detail

namespace fusedattn {

bool set_replay(bool enabled) noexcept { return detail::replay_switch().exchange(enabled); }

}  // namespace fusedattn
