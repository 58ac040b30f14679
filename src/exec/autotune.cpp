// Autotune's timing: stand-in data for every tensor of the graph, each candidate run until its
// median time is steady, the fastest kept (fusedattn/autotune.h).
#include "exec/autotune.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <mutex>
#include <string>
#include <vector>

#include "exec/cuda_check.h"
#include "exec/device.h"
#include "exec/environment_switch.h"
#include "exec/relaxed_capture.h"
#include "exec/stand_in_bench.h"
#include "fusedattn/attention.h"
#include "fusedattn/autotune.h"
#include "fusedattn/errors.h"

namespace fusedattn {
namespace {

std::atomic<bool>& autotune_setting() {
  static std::atomic<bool> setting{detail::switch_on_when_set("FUSEDATTN_AUTOTUNE")};
  return setting;
}

}  // namespace

bool autotune_default() noexcept { return autotune_setting().load(std::memory_order_relaxed); }
bool set_autotune(bool enabled) noexcept { return autotune_setting().exchange(enabled); }

namespace detail {
namespace {

constexpr double kKeepHeuristicsWithin = 1.01;

bool is_length(std::int64_t uid, bool& kv) {
  kv = uid == graph::kUidSeqLenKV || uid == graph::kUidScoreModSeqLenKV;
  return kv || uid == graph::kUidSeqLenQ || uid == graph::kUidScoreModSeqLenQ;
}

// Integers that must stay in range: ragged offsets and page tables at 0 (every sequence at the
// start of its tensor, every page the first of the pool) and the dropout seed and offset.
bool is_zeroed_integer(std::int64_t uid) {
  return (uid >= graph::kUidOffsetQ && uid <= graph::kUidOffsetStats) || uid == graph::kUidPageTableK ||
         uid == graph::kUidPageTableV || uid == graph::kUidDropoutSeed || uid == graph::kUidDropoutOffset;
}

// Stand-in data: every byte kStandInByte, then the integers that index memory set to values in
// range: full lengths, and zeros.
void fill(const std::vector<graph::TensorExtent>& extents, const std::vector<char*>& at, const AttentionSpec& spec,
          cudaStream_t stream, std::vector<std::vector<std::int32_t>>& host_lengths) {
  for (std::size_t i = 0; i < extents.size(); ++i) {
    if (extents[i].by_value) continue;
    const std::int64_t uid = extents[i].uid;
    bool kv = false;
    if (is_length(uid, kv)) {
      host_lengths.emplace_back(extents[i].bytes / sizeof(std::int32_t),
                                static_cast<std::int32_t>(kv ? spec.seq_kv() : spec.seq_q()));
      check_cuda(cudaMemcpyAsync(at[i], host_lengths.back().data(), host_lengths.back().size() * sizeof(std::int32_t),
                                 cudaMemcpyHostToDevice, stream),
                 "cudaMemcpyAsync(autotune lengths)");
    } else {
      check_cuda(cudaMemsetAsync(at[i], is_zeroed_integer(uid) ? 0 : kStandInByte, extents[i].bytes, stream),
                 "cudaMemsetAsync(autotune data)");
    }
  }
}

// The median time of one call; a candidate that cuDNN refuses to run gets -1.
double time_candidate(graph::Candidates& candidates, int candidate, cudnnHandle_t handle, void** sorted,
                      void* workspace, const Bench& bench) {
  try {
    return bench.median_ms([&] { candidates.execute(candidate, handle, sorted, workspace); });
  } catch (const CudnnError&) {
    return -1.0;
  }
}

}  // namespace

Tuning autotune(graph::Candidates& candidates, const AttentionSpec& spec, int device) {
  // One tuning at a time in the process: candidates timed beside another tuning's would share the GPU.
  static std::mutex one_at_a_time;
  std::lock_guard<std::mutex> lock(one_at_a_time);
  RelaxedCapture relaxed;
  Tuning tuning;
  {
    const std::vector<graph::TensorExtent> extents = candidates.extents();
    std::size_t bytes = 0, workspace = 0;
    for (const auto& extent : extents) bytes += extent.by_value ? 0 : stand_in_aligned(extent.bytes);
    for (int i = 0; i < candidates.count(); ++i) workspace = std::max(workspace, candidates.workspace_bytes(i));
    Bench bench(bytes + workspace);

    std::vector<char*> at;
    char* next = bench.memory();
    float scale = default_scale(spec);
    for (const auto& extent : extents) {
      at.push_back(extent.by_value ? reinterpret_cast<char*>(&scale) : next);
      next += extent.by_value ? 0 : stand_in_aligned(extent.bytes);
    }
    std::vector<std::vector<std::int32_t>> host_lengths;  // alive until the stream has copied them
    fill(extents, at, spec, bench.stream(), host_lengths);
    std::vector<void*> sorted(at.begin(), at.end());  // extents() follows uids(), ascending

    cudnnHandle_t handle = handle_for(device, bench.stream());
    for (int i = 0; i < candidates.count(); ++i) {
      tuning.times.push_back(CandidateTime{candidates.name(i),
                                           time_candidate(candidates, i, handle, sorted.data(), next, bench)});
    }
    check_cuda(cudaStreamSynchronize(bench.stream()), "cudaStreamSynchronize(autotune)");
    handle_for(device, nullptr);  // the handle must not keep the stream destroyed below
  }
  int best = -1;
  for (int i = 0; i < static_cast<int>(tuning.times.size()); ++i) {
    if (tuning.times[i].ms > 0 && (best < 0 || tuning.times[i].ms < tuning.times[best].ms)) best = i;
  }
  if (best < 0) throw CudnnError("autotune: no candidate plan ran [" + to_string(spec) + "]");
  if (tuning.times[0].ms > 0 && tuning.times[0].ms <= tuning.times[best].ms * kKeepHeuristicsWithin) best = 0;
  tuning.chosen = best;
  tuning.graph = candidates.choose(best, handle_for(device, nullptr));
  return tuning;
}

std::string to_string(const Tuning& tuning) {
  char text[160];
  const CandidateTime& first = tuning.times.at(0);
  const CandidateTime& chosen = tuning.times.at(static_cast<std::size_t>(tuning.chosen));
  std::snprintf(text, sizeof text, "autotune: %zu plans, heuristics' choice %.3f ms, chosen %d %.3f ms (",
                tuning.times.size(), first.ms, tuning.chosen, chosen.ms);
  return text + chosen.name + ")";
}

}  // namespace detail
}  // namespace fusedattn
