// GPU tier: calls replayed from their recordings (src/exec/replay.h) give what cuDNN's execute
// gives, for exactly the pointers, workspace and scale they were recorded with, and read whatever
// the input buffers hold when they run. The oracle is the same plan's run with replay switched off
// (set_replay(false)), which sends the call through cuDNN's execute.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "device_copy.h"
#include "fusedattn/attention.h"
#include "fusedattn/plan_cache.h"
#include "gpu_skip.h"
#include "testing/attention_buffers.h"
#include "testing/check_result.h"
#include "testing/cuda_check.h"
#include "testing/device_buffer.h"

namespace fusedattn {
namespace {

using check::AttentionBuffers;
using check::DeviceBuffer;

// Replay on for the test (whatever FUSEDATTN_REPLAY says), the setting restored after it.
class ReplayOn {
 public:
  ReplayOn() : was_(set_replay(true)) {}
  ~ReplayOn() { set_replay(was_); }

 private:
  bool was_;
};

// A shape of its own, and a fresh plan per test (the cache is cleared), so counters start at 0.
const char* kSpec = "layout=bshd dtype=bf16 b=2 s_q=136 s_kv=264 h_q=4 h_kv=2 d=64 causal=1 align=bottom_right";

struct Fixture {
  static constexpr int kSlots = 65;  // one more than a plan remembers
  ReplayOn on;
  AttentionSpec spec = parse_spec(kSpec);
  float scale = default_scale(spec);
  AttentionBuffers buffers{spec, /*with_backward=*/true};
  std::shared_ptr<const Plan> forward_plan, backward_plan;
  DeviceBuffer workspace, outputs;  // outputs: kSlots places for O, each a distinct call
  cudaStream_t stream = nullptr;
  std::uint64_t oracle_calls = 0;  // forward calls executed() made: counted as executed by the plan

  Fixture() {
    clear_plan_cache();
    forward_plan = get_plan(spec, Pass::forward);
    backward_plan = get_plan(spec, Pass::backward);
    workspace = DeviceBuffer(std::max<std::size_t>(
        1, std::max(forward_plan->workspace_bytes(), backward_plan->workspace_bytes())));
    outputs = DeviceBuffer(kSlots * bytes_of(spec.o));
    check::check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    buffers.fill_inputs(0x7e91a);
  }
  ~Fixture() { cudaStreamDestroy(stream); }

  Workspace ws() const { return Workspace{workspace.get(), workspace.bytes(), nullptr}; }

  // The forward tensors with O at place `slot` of `outputs` (bytes_of(o) is a multiple of 16).
  ForwardTensors at(int slot) const {
    ForwardTensors t = buffers.forward_tensors();
    t.o = static_cast<char*>(outputs.get()) + slot * bytes_of(spec.o);
    return t;
  }

  // O's bytes, then the statistics', after one call on poisoned outputs.
  std::vector<std::uint8_t> read(const ForwardTensors& t) {
    check::check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    auto bytes = copy_to_host(t.o, bytes_of(spec.o));
    const auto stats = copy_to_host(t.stats, spec.batch() * spec.heads_q() * spec.seq_q() * sizeof(float));
    bytes.insert(bytes.end(), stats.begin(), stats.end());
    return bytes;
  }
  void poison(const ForwardTensors& t) {
    buffers.poison_outputs();
    check::check_cuda(cudaMemset(t.o, 0xFF, bytes_of(spec.o)), "cudaMemset");
  }

  // A forward through the plan, the path that replays.
  std::vector<std::uint8_t> forward(const ForwardTensors& t, float scale) {
    poison(t);
    forward_plan->run(t, scale, stream, ws());
    return read(t);
  }

  // cuDNN's result for `t` (the oracle), after the plan has seen the call twice: it is recorded.
  std::vector<std::uint8_t> recorded(const ForwardTensors& t) {
    const auto oracle = executed(t, scale);
    forward(t, scale);
    forward(t, scale);
    return oracle;
  }

  // The same forward through cuDNN's execute, never replayed: the oracle. With replay off the plan
  // neither records the call nor remembers it as seen; it only counts it as executed.
  std::vector<std::uint8_t> executed(const ForwardTensors& t, float scale) {
    poison(t);
    const bool was = set_replay(false);
    forward_plan->run(t, scale, stream, ws());
    set_replay(was);
    ++oracle_calls;
    return read(t);
  }

  // The forward plan's counters, less the oracle's calls.
  ReplayStats forward_stats() const {
    ReplayStats stats = forward_plan->replay_stats();
    stats.executed -= oracle_calls;
    return stats;
  }
};

// A plan's counters, all three at once, so that a failure shows them side by side.
void expect_counts(const ReplayStats& stats, std::uint64_t executed, std::uint64_t recorded, std::uint64_t replayed) {
  EXPECT_EQ(stats.executed, executed) << "executed through cuDNN";
  EXPECT_EQ(stats.recorded, recorded) << "recorded";
  EXPECT_EQ(stats.replayed, replayed) << "replayed";
}

TEST(Replay, RepeatedForwardIsReplayedAndEqualsCudnnExecute) {
  FUSEDATTN_REQUIRE_GPU();
  Fixture f;
  const ForwardTensors t = f.at(0);
  const float scale = f.scale;
  const auto oracle = f.executed(t, scale);
  for (int call = 0; call < 4; ++call) EXPECT_EQ(f.forward(t, scale), oracle) << "call " << call;
  expect_counts(f.forward_stats(), 1, 1, 3);  // only the first sighting goes through cuDNN

  // A replay reads the inputs as they are now, not as they were when it was recorded.
  f.buffers.fill_inputs(0x51de);
  const auto fresh_oracle = f.executed(t, scale);
  ASSERT_NE(fresh_oracle, oracle);
  EXPECT_EQ(f.forward(t, scale), fresh_oracle);
  EXPECT_EQ(f.forward_plan->replay_stats().replayed, 4u);
}

TEST(Replay, ScaleAndPointersAreTheRecordingsKey) {
  FUSEDATTN_REQUIRE_GPU();
  Fixture f;
  const ForwardTensors t = f.at(0);
  const float scale = f.scale;
  const auto at_scale = f.executed(t, scale);
  const auto at_half = f.executed(t, scale / 2);
  ASSERT_NE(at_scale, at_half);
  for (int call = 0; call < 3; ++call) {
    EXPECT_EQ(f.forward(t, scale), at_scale) << "call " << call;
    EXPECT_EQ(f.forward(t, scale / 2), at_half) << "call " << call << ": the scale was baked into the wrong recording";
  }
  EXPECT_EQ(f.forward_plan->replay_stats().recorded, 2u);

  // Another O: the replay writes there, and leaves the O of the first recording alone.
  const ForwardTensors moved = f.at(1);
  const std::vector<std::uint8_t> poisoned(bytes_of(f.spec.o), 0xFF);
  for (int call = 0; call < 3; ++call) {
    check::check_cuda(cudaMemset(t.o, 0xFF, bytes_of(f.spec.o)), "cudaMemset");
    EXPECT_EQ(f.forward(moved, scale), at_scale) << "call " << call;
    EXPECT_EQ(copy_to_host(t.o, bytes_of(f.spec.o)), poisoned) << "call " << call << ": a replay wrote to another O";
  }
  EXPECT_EQ(f.forward_plan->replay_stats().recorded, 3u);
}

TEST(Replay, RepeatedBackwardIsReplayed) {
  FUSEDATTN_REQUIRE_GPU();
  Fixture f;
  const float scale = f.scale;
  const BackwardTensors t = f.buffers.backward_tensors();
  f.forward(f.buffers.forward_tensors(), scale);  // O and stats for the backward, where it reads them
  std::vector<std::vector<float>> first;
  for (int call = 0; call < 3; ++call) {
    check::check_cuda(cudaMemset(t.d_q, 0xFF, bytes_of(f.spec.q)), "cudaMemset");
    check::check_cuda(cudaMemset(t.d_k, 0xFF, bytes_of(f.spec.k)), "cudaMemset");
    check::check_cuda(cudaMemset(t.d_v, 0xFF, bytes_of(f.spec.v)), "cudaMemset");
    f.backward_plan->run(t, scale, f.stream, f.ws());
    check::check_cuda(cudaStreamSynchronize(f.stream), "cudaStreamSynchronize");
    std::vector<std::vector<float>> grads = {as_floats(copy_to_host(t.d_q, bytes_of(f.spec.q)), f.spec.q.dtype),
                                             as_floats(copy_to_host(t.d_k, bytes_of(f.spec.k)), f.spec.k.dtype),
                                             as_floats(copy_to_host(t.d_v, bytes_of(f.spec.v)), f.spec.v.dtype)};
    if (call == 0) {
      first = grads;
      continue;
    }
    // The backward may accumulate in another order each run: equal within the dtype's tolerance.
    for (int g = 0; g < 3; ++g) {
      EXPECT_LE(relative_error(grads[g].data(), first[g].data(), static_cast<std::int64_t>(grads[g].size())),
                check::tolerance_for(f.spec.q.dtype))
          << "gradient " << g << ", call " << call;
    }
  }
  expect_counts(f.backward_plan->replay_stats(), 1, 1, 2);
}

TEST(Replay, RecordingStopsWhenRecordingsAreNotReplayed) {
  FUSEDATTN_REQUIRE_GPU();
  Fixture f;
  const float scale = f.scale;
  const auto oracle = f.executed(f.at(0), scale);
  // 20 calls each made twice (A A B B ...): a recording is launched once and never again.
  for (int slot = 0; slot < 20; ++slot) {
    EXPECT_EQ(f.forward(f.at(slot), scale), oracle) << "slot " << slot << ", first";
    EXPECT_EQ(f.forward(f.at(slot), scale), oracle) << "slot " << slot << ", second";
  }
  expect_counts(f.forward_stats(), 32, 8, 8);  // recording stops after the free recordings
}

TEST(Replay, LeastRecentlyUsedCallsMakeRoom) {
  FUSEDATTN_REQUIRE_GPU();
  Fixture f;
  const float scale = f.scale;
  const auto oracle = f.executed(f.at(0), scale);
  // Slot 0 is replayed between every new call, so it stays while 64 others pass through.
  for (int call = 0; call < 3; ++call) f.forward(f.at(0), scale);
  for (int slot = 1; slot < Fixture::kSlots; ++slot) {
    EXPECT_EQ(f.forward(f.at(slot), scale), oracle) << "slot " << slot;
    EXPECT_EQ(f.forward(f.at(0), scale), oracle) << "after slot " << slot;
  }
  expect_counts(f.forward_stats(), 1 + 64, 1, 2 + 64);
  EXPECT_EQ(f.forward_plan->replay_stats().evicted, 0u) << "the call in use was dropped";
}

TEST(Replay, StreamCaptureRecordsCudnnItself) {
  FUSEDATTN_REQUIRE_GPU();
  Fixture f;
  const ForwardTensors t = f.at(0);
  const float scale = f.scale;
  const auto oracle = f.recorded(t);
  const ReplayStats before = f.forward_plan->replay_stats();
  cudaGraph_t graph;
  check::check_cuda(cudaStreamBeginCapture(f.stream, cudaStreamCaptureModeGlobal), "cudaStreamBeginCapture");
  f.forward_plan->run(t, scale, f.stream, f.ws());
  check::check_cuda(cudaStreamEndCapture(f.stream, &graph), "cudaStreamEndCapture");
  const ReplayStats after = f.forward_plan->replay_stats();
  EXPECT_EQ(after.executed, before.executed + 1) << "a captured call went through cuDNN's execute";
  EXPECT_EQ(after.replayed, before.replayed);
  cudaGraphExec_t exec;
  check::check_cuda(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
  f.poison(t);
  check::check_cuda(cudaGraphLaunch(exec, f.stream), "cudaGraphLaunch");
  EXPECT_EQ(f.read(t), oracle);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

TEST(Replay, SwitchedOffEveryCallGoesThroughCudnn) {
  FUSEDATTN_REQUIRE_GPU();
  Fixture f;
  const ForwardTensors t = f.at(0);
  const float scale = f.scale;
  const auto oracle = f.recorded(t);
  set_replay(false);
  for (int call = 0; call < 3; ++call) EXPECT_EQ(f.forward(t, scale), oracle) << "call " << call;
  expect_counts(f.forward_stats(), 4, 1, 1);
  set_replay(true);  // the recording was kept
  EXPECT_EQ(f.forward(t, scale), oracle);
  expect_counts(f.forward_stats(), 4, 1, 2);
}

}  // namespace
}  // namespace fusedattn
