// GPU tier: every FP16/BF16 forward and backward configuration of the core against a reference
// that does not use cuDNN, plus the execution contracts (cache hits, CUDA graphs, errors).
// Without a GPU each test skips and says why.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cctype>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "fusedattn/attention.h"
#include "fusedattn/disk_cache.h"
#include "fusedattn/build_info.h"
#include "fusedattn/errors.h"
#include "fusedattn/layout.h"
#include "fusedattn/plan_cache.h"
#include "fusedattn/reference.h"
#include "device_allocations.h"
#include "device_copy.h"
#include "gpu_skip.h"
#include "supported_passes.h"
#include "testing/attention_buffers.h"
#include "testing/check_result.h"
#include "testing/cuda_check.h"
#include "testing/device_buffer.h"

// Skips the test, with every reason, when this GPU and cuDNN cannot run `spec` in `pass`.
#define FUSEDATTN_REQUIRE_SUPPORT(spec, pass)                                      \
  do {                                                                             \
    const Support answer = check_support(spec, pass);                              \
    if (!answer.ok()) GTEST_SKIP() << to_string(pass) << ": " << answer.to_string(); \
  } while (0)

// Counts every host allocation made through operator new while armed, to prove that a cached
// call allocates nothing. Replacing the global operator covers the library too: it is linked
// dynamically and its calls bind to this definition.
namespace {
std::atomic<bool> g_count_allocations{false};
std::atomic<long> g_allocations{0};
}  // namespace

void* operator new(std::size_t bytes) {
  if (g_count_allocations.load(std::memory_order_relaxed)) g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(bytes ? bytes : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

namespace fusedattn {
namespace {

using check::AttentionBuffers;

// ---- numerics over the feature surface ------------------------------------------------------

struct Case {
  std::string name;
  std::string spec;
  bool inference = false;  // forward only, as inference runs it (no statistics unless the spec asks)
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.spec; }

std::vector<Case> numeric_cases() {
  std::vector<Case> cases;
  auto add = [&](const std::string& name, const std::string& spec) { cases.push_back({name, spec}); };
  auto add_inference = [&](const std::string& name, const std::string& spec) { cases.push_back({name, spec, true}); };
  const char* dtypes[] = {"bf16", "f16"};
  // Every layout, both dtypes, at a length that is not a multiple of 64; GQA where the
  // layout lets K/V have their own head count.
  for (const char* dt : dtypes) {
    for (Layout layout : all_layouts()) {
      if (paged_kv(layout)) continue;  // test_paged_gpu.cpp
      std::string name = to_string(layout);
      std::string heads = packs_qkv(layout) ? "h=4" : "h_q=8 h_kv=2";
      std::string seqs = packs_qkv(layout) ? "s=1000" : "s_q=1000 s_kv=777";
      add(std::string("layout_") + name + "_" + dt,
          std::string("layout=") + name + " dtype=" + dt + " b=2 " + seqs + " " + heads + " d=64 causal=0");
    }
  }
  // Masks against sequence lengths that are not multiples of 64 or 128, s_q != s_kv.
  struct Seq { int q, kv; };
  const Seq seqs[] = {{1, 1}, {1, 17}, {17, 1000}, {1000, 17}, {1000, 1000}, {4097, 1000}, {1000, 4097}};
  for (const char* dt : dtypes) {
    for (const Seq& s : seqs) {
      std::string sizes = "s_q=" + std::to_string(s.q) + " s_kv=" + std::to_string(s.kv);
      std::string base = std::string("layout=bshd dtype=") + dt + " b=2 " + sizes + " h=4 d=128";
      std::string tag = std::to_string(s.q) + "x" + std::to_string(s.kv) + "_" + dt;
      add("nomask_" + tag, base + " causal=0");
      add("causal_" + tag, base + " causal=1 align=top_left");
      add("causal_br_" + tag, base + " causal=1 align=bottom_right");
    }
  }
  // MHA, GQA, MQA against each head dimension, including d_qk != d_v.
  struct Heads { const char* name; const char* text; };
  const Heads heads[] = {{"mha", "h=8"}, {"gqa", "h_q=8 h_kv=2"}, {"mqa", "h_q=8 h_kv=1"}};
  struct Dims { const char* name; const char* text; };
  const Dims dims[] = {{"d64", "d=64"}, {"d128", "d=128"}, {"d256", "d=256"}, {"d192_128", "d_qk=192 d_v=128"}};
  for (const char* dt : dtypes) {
    for (const Heads& h : heads) {
      for (const Dims& d : dims) {
        add(std::string(h.name) + "_" + d.name + "_" + dt,
            std::string("layout=bshd dtype=") + dt + " b=2 s_q=333 s_kv=1000 " + h.text + " " + d.text +
                " causal=1 align=bottom_right");
      }
    }
  }
  // Sliding windows and bands, both alignments, GQA, s_q != s_kv; and bottom-right at s_q == s_kv.
  struct Win { const char* name; const char* text; };
  const Win windows[] = {{"swa128", "window=128,0"}, {"band64_16", "window=64,16"},
                         {"ahead32", "window=-1,32"}, {"left200", "window=200,-1"}};
  for (const char* dt : dtypes) {
    for (const Win& w : windows) {
      for (const char* align : {"top_left", "bottom_right"}) {
        add(std::string(w.name) + "_" + align + "_" + dt,
            std::string("layout=bshd dtype=") + dt + " b=2 s_q=777 s_kv=1000 h_q=8 h_kv=2 d=128 " + w.text +
                " align=" + align);
      }
    }
  }
  add("swa128_bottom_right_square_bf16", "layout=sbhd dtype=bf16 b=2 s=1000 h=4 d=64 window=128,0 align=bottom_right");
  // Padding: runtime lengths per entry (drawn by the check runner), with each mask kind.
  for (const char* dt : dtypes) {
    for (const char* mask : {"window=-1,-1", "window=-1,0 align=top_left", "window=-1,0 align=bottom_right",
                             "window=128,0 align=bottom_right"}) {
      std::string name = std::string(mask);
      for (char& c : name) {
        if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
      }
      add("padding_" + name + "_" + dt, std::string("layout=bshd dtype=") + dt +
                                            " b=3 s_q=777 s_kv=1000 h_q=8 h_kv=2 d=128 padding=1 " + mask);
    }
  }
  add("padding_sbhd_more_queries_bf16", "layout=sbhd dtype=bf16 b=4 s_q=300 s_kv=97 h=4 d=64 padding=1 causal");
  add("padding_bs3hd_f16", "layout=bs3hd dtype=f16 b=2 s=513 h=4 d=64 padding=1 causal");
  add("deterministic_bf16", "layout=bshd dtype=bf16 b=2 s_q=500 s_kv=1000 h_q=8 h_kv=2 d=128 causal deterministic=1");
  // Score terms and softmax variants: every bias shape with its gradient, ALiBi, the sinks, and
  // the max logit per row and per head (with padding, whose rows must not contribute).
  const std::string gqa = " b=2 s_q=333 s_kv=1000 h_q=8 h_kv=2 d=128";
  for (const char* shape : {"bhss", "b1ss", "1hss", "11ss"}) {
    add(std::string("bias_") + shape + "_grad_bf16",
        "layout=bshd dtype=bf16" + gqa + " causal bias=" + shape + " bias_grad=1");
  }
  add("bias_111s_bf16", "layout=bshd dtype=bf16" + gqa + " causal bias=111s");
  add("bias_1hss_f16_nograd", "layout=sbhd dtype=f16" + gqa + " bias=1hss");
  add("alibi_bf16", "layout=bshd dtype=bf16 b=2 s=1000 h=12 d=64 causal alibi=1");
  add("alibi_f16", "layout=bshd dtype=f16 b=1 s_q=777 s_kv=777 h_q=8 h_kv=4 d=128 causal alibi=1");
  add("off_by_one_bf16", "layout=bshd dtype=bf16" + gqa + " softmax=off_by_one");
  add("off_by_one_causal_f16", "layout=bshd dtype=f16" + gqa + " causal softmax=off_by_one");
  add("sink_bf16", "layout=bshd dtype=bf16" + gqa + " causal softmax=sink");
  add("sink_padding_f16", "layout=bshd dtype=f16 b=3 s=700 h=4 d=64 window=-1,-1 softmax=sink padding=1");
  add("max_logit_row_bf16", "layout=bshd dtype=bf16" + gqa + " causal max_logit=row");
  add("max_logit_head_padding_bf16", "layout=bshd dtype=bf16 b=3 s_q=500 s_kv=900 h=4 d=64 padding=1 max_logit=head");
  add_inference("max_logit_row_inference_f16", "layout=bshd dtype=f16" + gqa + " stats=0 max_logit=row");
  add_inference("max_logit_head_inference_bf16", "layout=bshd dtype=bf16" + gqa + " causal stats=0 max_logit=head");
  // Dropout: the reference applies the mask cuDNN drew (dumped by the forward), and the backward
  // must regenerate it from the same seed and offset.
  add("dropout_causal_bf16", "layout=bshd dtype=bf16" + gqa + " causal dropout=0.1");
  add("dropout_padding_f16", "layout=bshd dtype=f16 b=3 s_q=400 s_kv=700 h=4 d=64 padding=1 dropout=0.25");
  add("dropout_bias_bf16", "layout=bshd dtype=bf16 b=2 s=512 h=4 d=128 bias=1hss bias_grad=1 dropout=0.2");
  // One large problem, checked against the float32 GPU reference.
  add("large_bf16", "layout=bshd dtype=bf16 b=1 s_q=4097 s_kv=4097 h_q=8 h_kv=2 d=128 causal=1");
  return cases;
}

class Numerics : public ::testing::TestWithParam<Case> {};

TEST_P(Numerics, MatchesReference) {
  FUSEDATTN_REQUIRE_GPU();
  check_supported_passes(parse_spec(GetParam().spec), GetParam().inference);
}

INSTANTIATE_TEST_SUITE_P(Gpu, Numerics, ::testing::ValuesIn(numeric_cases()),
                         [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

// ---- execution contracts -------------------------------------------------------------------

const char* kSmallSpec = "layout=bshd dtype=bf16 b=2 s_q=200 s_kv=300 h_q=8 h_kv=2 d=64 causal=1 align=bottom_right";

// Host allocations (through operator new) and the process's own device allocations (through the
// CUDA runtime) that `work` makes.
struct Allocations {
  long host = 0, device = 0;
};
Allocations count_allocations(const std::function<void()>& work) {
  g_allocations = 0;
  g_count_allocations = true;
  const long device = count_device_allocations(work);
  g_count_allocations = false;
  return Allocations{g_allocations.load(), device};
}

// The small spec's plans, a workspace for both, and inputs; every call seen often enough that it
// is recorded and replayed from then on, and cuDNN's execute run once (replay off), so handles,
// lazily loaded kernels and the frontend's lazy state exist before anything is measured.
struct WarmCalls {
  AttentionSpec spec = parse_spec(kSmallSpec);
  AttentionBuffers buffers{spec, /*with_backward=*/true};
  std::shared_ptr<const Plan> forward_plan = get_plan(spec, Pass::forward);
  std::shared_ptr<const Plan> backward_plan = get_plan(spec, Pass::backward);
  check::DeviceBuffer workspace{std::max<std::size_t>(
      1, std::max(forward_plan->workspace_bytes(), backward_plan->workspace_bytes()))};
  Workspace ws{workspace.get(), workspace.bytes(), nullptr};
  float scale = default_scale(spec);
  ForwardTensors ft;
  BackwardTensors bt;
  bool replay_was = set_replay(true);

  WarmCalls() {
    buffers.fill_inputs(0x5eed);
    ft = buffers.forward_tensors();
    bt = buffers.backward_tensors();
    for (int warm = 0; warm < 3; ++warm) {
      forward(spec, ft, scale, nullptr, ws);
      backward(spec, bt, scale, nullptr, ws);
    }
    set_replay(false);
    forward(spec, ft, scale, nullptr, ws);
    backward(spec, bt, scale, nullptr, ws);
    set_replay(true);
    check::check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  }
  ~WarmCalls() { set_replay(replay_was); }
};

constexpr int kCalls = 100;

TEST(Execution, CacheHitAllocatesNothingAndNeverRebuilds) {
  FUSEDATTN_REQUIRE_GPU();
  WarmCalls w;
  CacheStats before = plan_cache_stats();
  // Each layer separately, so a failure says where an allocation comes from.
  auto repeat = [&](auto&& call) { return count_allocations([&] { for (int i = 0; i < kCalls; ++i) call(); }); };
  const Allocations lookups = repeat([&] {
    get_plan(w.spec, Pass::forward);
    get_plan(w.spec, Pass::backward);
  });
  const Allocations plan_forward = repeat([&] { w.forward_plan->run(w.ft, w.scale, nullptr, w.ws); });
  const Allocations call_forward = repeat([&] { forward(w.spec, w.ft, w.scale, nullptr, w.ws); });
  const Allocations plan_backward = repeat([&] { w.backward_plan->run(w.bt, w.scale, nullptr, w.ws); });
  const Allocations call_backward = repeat([&] { backward(w.spec, w.bt, w.scale, nullptr, w.ws); });
  // With replay off, Plan::run sends every call through cuDNN's execute.
  set_replay(false);
  const Allocations cudnn_forward = repeat([&] { w.forward_plan->run(w.ft, w.scale, nullptr, w.ws); });
  const Allocations call_forward_off = repeat([&] { forward(w.spec, w.ft, w.scale, nullptr, w.ws); });
  const Allocations call_backward_off = repeat([&] { backward(w.spec, w.bt, w.scale, nullptr, w.ws); });
  set_replay(true);
  check::check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  CacheStats after = plan_cache_stats();
  std::printf("  host allocations per %d calls: lookups %ld; forward: Plan::run %ld, forward() %ld; backward: "
              "Plan::run %ld, backward() %ld; replay off (cuDNN's execute): Plan::run %ld, forward() %ld\n",
              kCalls, lookups.host, plan_forward.host, call_forward.host, plan_backward.host, call_backward.host,
              cudnn_forward.host, call_forward_off.host);

  // A repeated call is replayed from its recording, so neither the lookups nor any layer above
  // allocate anything on the host.
  EXPECT_EQ(lookups.host, 0) << "cache lookup allocated";
  EXPECT_EQ(plan_forward.host, 0) << "Plan::run allocated";
  EXPECT_EQ(call_forward.host, 0) << "forward() allocated";
  EXPECT_EQ(plan_backward.host, 0) << "Plan::run (backward) allocated";
  EXPECT_EQ(call_backward.host, 0) << "backward() allocated";
  EXPECT_GE(w.forward_plan->replay_stats().replayed, static_cast<std::uint64_t>(2 * kCalls))
      << "repeated forward calls were not replayed";
  // cuDNN's own execute creates and finalizes a variant-pack descriptor on every call, which
  // allocates inside libcudnn (9 per forward on cuDNN 9.19); the lookup around Plan::run adds
  // nothing to that.
  EXPECT_EQ(call_forward_off.host, cudnn_forward.host) << "forward(), replay off, allocated more than Plan::run";
  // No call asked the CUDA runtime for device memory, whatever the path (cuDNN's own runtime is
  // out of sight here: Serial.CachedCallsLeaveDeviceMemoryAlone covers it).
  for (const Allocations* a : {&lookups, &plan_forward, &call_forward, &plan_backward, &call_backward, &cudnn_forward,
                               &call_forward_off, &call_backward_off}) {
    EXPECT_EQ(a->device, 0) << "a cached call allocated device memory";
  }
  EXPECT_EQ(after.builds, before.builds);
  EXPECT_EQ(after.misses, before.misses);
  EXPECT_EQ(after.hits - before.hits, static_cast<std::uint64_t>(6 * kCalls));
}

// Device-wide free memory before and after cached calls, which sees allocations the runtime count
// above cannot (cuDNN carries a CUDA runtime of its own). Device-wide, so it only means something
// while no other process allocates: its suite's name, Serial, makes ctest run it alone
// (tests/CMakeLists.txt).
TEST(Serial, CachedCallsLeaveDeviceMemoryAlone) {
  FUSEDATTN_REQUIRE_GPU();
  WarmCalls w;
  std::size_t free_before = 0, free_after = 0, total = 0;
  check::check_cuda(cudaMemGetInfo(&free_before, &total), "cudaMemGetInfo");
  for (bool replay : {true, false}) {
    set_replay(replay);
    for (int i = 0; i < kCalls; ++i) {
      w.forward_plan->run(w.ft, w.scale, nullptr, w.ws);
      forward(w.spec, w.ft, w.scale, nullptr, w.ws);
      w.backward_plan->run(w.bt, w.scale, nullptr, w.ws);
      backward(w.spec, w.bt, w.scale, nullptr, w.ws);
    }
  }
  set_replay(true);
  check::check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  check::check_cuda(cudaMemGetInfo(&free_after, &total), "cudaMemGetInfo");
  EXPECT_EQ(free_before, free_after) << "device memory changed during cached calls";
}

TEST(Execution, SupportAnswerIsCachedWithThePlan) {
  FUSEDATTN_REQUIRE_GPU();
  // A shape no other test uses, so the first query really builds.
  AttentionSpec spec = parse_spec("layout=sbhd dtype=f16 b=1 s_q=123 s_kv=457 h=2 d=72 causal=1");
  CacheStats s0 = plan_cache_stats();
  // Backward can be asked about before any forward was built or run (inference callers).
  Support backward_answer = check_support(spec, Pass::backward);
  CacheStats s1 = plan_cache_stats();
  Support again = check_support(spec, Pass::backward);
  auto plan = backward_answer.ok() ? get_plan(spec, Pass::backward) : nullptr;
  CacheStats s2 = plan_cache_stats();
  EXPECT_EQ(s1.misses - s0.misses, 1u);
  EXPECT_EQ(s2.misses, s1.misses) << "second query or get_plan rebuilt";
  EXPECT_EQ(again.ok(), backward_answer.ok());
  EXPECT_EQ(s2.builds, s1.builds);
}

TEST(Execution, NotSupportedCarriesEveryReasonAndIsCached) {
  FUSEDATTN_REQUIRE_GPU();
  // Head dim 512 is past what SM 9.0 runs; bottom-right with s_q > s_kv leaves rows with no key.
  AttentionSpec spec = parse_spec("layout=bshd dtype=bf16 b=1 s_q=64 s_kv=32 h=2 d=512 causal=1 align=bottom_right");
  Support answer = check_support(spec, Pass::forward);
  ASSERT_FALSE(answer.ok());
  EXPECT_GE(answer.reasons.size(), 2u) << answer.to_string();
  CacheStats before = plan_cache_stats();
  try {
    get_plan(spec, Pass::forward);
    FAIL() << "expected NotSupported";
  } catch (const NotSupported& error) {
    EXPECT_NE(std::string(error.what()).find(to_string(spec)), std::string::npos) << error.what();
  }
  EXPECT_EQ(plan_cache_stats().misses, before.misses);
}

TEST(Execution, CudaGraphCaptureAndReplay) {
  FUSEDATTN_REQUIRE_GPU();
  AttentionSpec spec = parse_spec(kSmallSpec);
  AttentionBuffers buffers(spec, true);
  auto forward_plan = get_plan(spec, Pass::forward);
  auto backward_plan = get_plan(spec, Pass::backward);
  check::DeviceBuffer workspace(std::max<std::size_t>(
      1, std::max(forward_plan->workspace_bytes(), backward_plan->workspace_bytes())));
  Workspace ws{workspace.get(), workspace.bytes(), nullptr};
  float scale = default_scale(spec);
  cudaStream_t stream;
  check::check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");

  // Capture with seed-1 inputs in place; the graph must read whatever the buffers hold at replay.
  buffers.fill_inputs(1);
  forward(spec, buffers.forward_tensors(), scale, stream, ws);  // first use of this stream's handle
  check::check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  cudaGraph_t graph;
  check::check_cuda(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), "cudaStreamBeginCapture");
  forward(spec, buffers.forward_tensors(), scale, stream, ws);
  backward(spec, buffers.backward_tensors(), scale, stream, ws);
  check::check_cuda(cudaStreamEndCapture(stream, &graph), "cudaStreamEndCapture");
  cudaGraphExec_t exec;
  check::check_cuda(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");

  // Eager results on seed-2 inputs.
  buffers.fill_inputs(2);
  buffers.poison_outputs();
  forward(spec, buffers.forward_tensors(), scale, stream, ws);
  backward(spec, buffers.backward_tensors(), scale, stream, ws);
  check::check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  ForwardTensors ft = buffers.forward_tensors();
  BackwardTensors bt = buffers.backward_tensors();
  auto eager_o = copy_to_host(ft.o, bytes_of(spec.o));
  auto eager_dq = as_floats(copy_to_host(bt.d_q, bytes_of(spec.q)), spec.q.dtype);
  auto eager_dk = as_floats(copy_to_host(bt.d_k, bytes_of(spec.k)), spec.k.dtype);

  // Replays on the same seed-2 inputs, outputs poisoned first.
  for (int replay = 0; replay < 3; ++replay) {
    buffers.poison_outputs();
    check::check_cuda(cudaGraphLaunch(exec, stream), "cudaGraphLaunch");
    check::check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    EXPECT_EQ(copy_to_host(ft.o, bytes_of(spec.o)), eager_o) << "forward replay differs from eager, replay " << replay;
    auto dq = as_floats(copy_to_host(bt.d_q, bytes_of(spec.q)), spec.q.dtype);
    auto dk = as_floats(copy_to_host(bt.d_k, bytes_of(spec.k)), spec.k.dtype);
    // The backward may accumulate in a different order from run to run, so it is compared to
    // the eager run within the dtype's tolerance rather than bit for bit.
    EXPECT_LE(relative_error(dq.data(), eager_dq.data(), static_cast<std::int64_t>(dq.size())),
              check::tolerance_for(spec.q.dtype));
    EXPECT_LE(relative_error(dk.data(), eager_dk.data(), static_cast<std::int64_t>(dk.size())),
              check::tolerance_for(spec.k.dtype));
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

TEST(Execution, DeterministicBackwardIsBitwiseReproducible) {
  FUSEDATTN_REQUIRE_GPU();
  AttentionSpec spec = parse_spec(
      "layout=bshd dtype=bf16 b=2 s_q=1000 s_kv=2048 h_q=16 h_kv=2 d=128 causal align=bottom_right deterministic=1");
  FUSEDATTN_REQUIRE_SUPPORT(spec, Pass::backward);
  AttentionBuffers buffers(spec, true);
  buffers.fill_inputs(7);
  const float scale = default_scale(spec);
  check::DeviceBuffer workspace(std::max<std::size_t>(1, get_plan(spec, Pass::backward)->workspace_bytes() +
                                                             get_plan(spec, Pass::forward)->workspace_bytes()));
  const Workspace ws{workspace.get(), workspace.bytes(), nullptr};
  forward(spec, buffers.forward_tensors(), scale, nullptr, ws);
  const BackwardTensors bt = buffers.backward_tensors();
  std::vector<std::vector<std::uint8_t>> first;
  for (int run = 0; run < 3; ++run) {
    buffers.poison_outputs();  // also poisons O and stats: recompute them first
    forward(spec, buffers.forward_tensors(), scale, nullptr, ws);
    backward(spec, bt, scale, nullptr, ws);
    check::check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    std::vector<std::vector<std::uint8_t>> grads = {copy_to_host(bt.d_q, bytes_of(spec.q)),
                                                    copy_to_host(bt.d_k, bytes_of(spec.k)),
                                                    copy_to_host(bt.d_v, bytes_of(spec.v))};
    if (run == 0) {
      first = grads;
    } else {
      EXPECT_EQ(grads[0], first[0]) << "dQ differs in run " << run;
      EXPECT_EQ(grads[1], first[1]) << "dK differs in run " << run;
      EXPECT_EQ(grads[2], first[2]) << "dV differs in run " << run;
    }
  }
}

std::int64_t device_offset(const AttentionBuffers& buffers) {
  std::int64_t offset = 0;
  check::check_cuda(cudaMemcpy(&offset, buffers.forward_tensors().dropout_offset, sizeof offset, cudaMemcpyDeviceToHost),
                    "cudaMemcpy(dropout offset)");
  return offset;
}

std::vector<std::uint8_t> dropout_forward(const AttentionSpec& spec, AttentionBuffers& buffers) {
  buffers.poison_outputs();
  check::DeviceBuffer workspace(std::max<std::size_t>(1, get_plan(spec, Pass::forward)->workspace_bytes()));
  forward(spec, buffers.forward_tensors(), default_scale(spec), nullptr, Workspace{workspace.get(), workspace.bytes()});
  check::check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  return copy_to_host(buffers.forward_tensors().o, bytes_of(spec.o));
}

TEST(Execution, DropoutReplaysTheSameMaskAndAdvancingTheOffsetDrawsANewOne) {
  FUSEDATTN_REQUIRE_GPU();
  AttentionSpec spec = parse_spec("layout=bshd dtype=bf16 b=2 s=300 h=4 d=64 causal dropout=0.3");
  FUSEDATTN_REQUIRE_SUPPORT(spec, Pass::forward);
  AttentionBuffers buffers(spec, false);
  buffers.fill_inputs(11);
  buffers.set_dropout_state(1234, 5678);
  const auto first = dropout_forward(spec, buffers);
  EXPECT_EQ(dropout_forward(spec, buffers), first) << "same seed and offset, different output";
  // The plan that also dumps the mask draws the very same one.
  AttentionSpec dumping = spec;
  dumping.dropout_mask_out = true;
  AttentionBuffers with_mask(dumping, false);
  with_mask.fill_inputs(11);
  with_mask.set_dropout_state(1234, 5678);
  EXPECT_EQ(dropout_forward(dumping, with_mask), first) << "dumping the mask changed the draw";
  // Advancing the offset on the device gives a fresh mask.
  advance_dropout_offset(spec, const_cast<std::int64_t*>(buffers.forward_tensors().dropout_offset), nullptr);
  EXPECT_NE(dropout_forward(spec, buffers), first) << "advanced offset, same output";
  EXPECT_EQ(device_offset(buffers), 5678 + dropout_offset_increment(spec));
}

TEST(Execution, CudaGraphReplaysAdvanceTheDropoutOffset) {
  FUSEDATTN_REQUIRE_GPU();
  AttentionSpec spec = parse_spec("layout=bshd dtype=bf16 b=1 s=256 h=4 d=64 dropout=0.5");
  FUSEDATTN_REQUIRE_SUPPORT(spec, Pass::forward);
  AttentionBuffers buffers(spec, false);
  buffers.fill_inputs(12);
  buffers.set_dropout_state(99, 0);
  auto plan = get_plan(spec, Pass::forward);
  check::DeviceBuffer workspace(std::max<std::size_t>(1, plan->workspace_bytes()));
  const Workspace ws{workspace.get(), workspace.bytes(), nullptr};
  cudaStream_t stream;
  check::check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  forward(spec, buffers.forward_tensors(), default_scale(spec), stream, ws);  // this stream's handle
  check::check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  buffers.set_dropout_state(99, 0);
  cudaGraph_t graph;
  check::check_cuda(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), "cudaStreamBeginCapture");
  forward(spec, buffers.forward_tensors(), default_scale(spec), stream, ws);
  advance_dropout_offset(spec, const_cast<std::int64_t*>(buffers.forward_tensors().dropout_offset), stream);
  check::check_cuda(cudaStreamEndCapture(stream, &graph), "cudaStreamEndCapture");
  cudaGraphExec_t exec;
  check::check_cuda(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
  std::vector<std::vector<std::uint8_t>> outputs;
  for (int replay = 0; replay < 3; ++replay) {
    check::check_cuda(cudaGraphLaunch(exec, stream), "cudaGraphLaunch");
    check::check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    outputs.push_back(copy_to_host(buffers.forward_tensors().o, bytes_of(spec.o)));
  }
  EXPECT_NE(outputs[0], outputs[1]);
  EXPECT_NE(outputs[1], outputs[2]);
  EXPECT_EQ(device_offset(buffers), 3 * dropout_offset_increment(spec));
  // Eager replay of the first draw: offset 0 again gives the first replay's output.
  buffers.set_dropout_state(99, 0);
  forward(spec, buffers.forward_tensors(), default_scale(spec), stream, ws);
  check::check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  EXPECT_EQ(copy_to_host(buffers.forward_tensors().o, bytes_of(spec.o)), outputs[0]);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

class CountingAllocator : public WorkspaceAllocator {
 public:
  void* allocate(std::size_t bytes, cudaStream_t stream) override {
    ++allocations;
    void* p = nullptr;
    check::check_cuda(cudaMallocAsync(&p, bytes, stream), "cudaMallocAsync");
    return p;
  }
  void release(void* p, std::size_t, cudaStream_t stream) override {
    ++releases;
    check::check_cuda(cudaFreeAsync(p, stream), "cudaFreeAsync");
  }
  int allocations = 0, releases = 0;
};

TEST(Execution, WorkspaceComesFromTheCallerOrTheAllocator) {
  FUSEDATTN_REQUIRE_GPU();
  AttentionSpec spec = parse_spec(kSmallSpec);
  AttentionBuffers buffers(spec, true);
  buffers.fill_inputs(3);
  auto plan = get_plan(spec, Pass::backward);
  float scale = default_scale(spec);
  CountingAllocator forward_allocator;
  forward(spec, buffers.forward_tensors(), scale, nullptr, Workspace{nullptr, 0, &forward_allocator});
  if (plan->workspace_bytes() == 0) GTEST_SKIP() << "this backward plan needs no workspace";
  CountingAllocator allocator;
  plan->run(buffers.backward_tensors(), scale, nullptr, Workspace{nullptr, 0, &allocator});
  EXPECT_EQ(allocator.allocations, 1);
  EXPECT_EQ(allocator.releases, 1);
  check::DeviceBuffer own(plan->workspace_bytes());
  plan->run(buffers.backward_tensors(), scale, nullptr, Workspace{own.get(), own.bytes(), &allocator});
  EXPECT_EQ(allocator.allocations, 1) << "the caller's buffer was large enough";
  try {
    plan->run(buffers.backward_tensors(), scale, nullptr, Workspace{own.get(), own.bytes() - 1, nullptr});
    FAIL() << "expected InvalidArgument for a short workspace";
  } catch (const InvalidArgument& error) {
    EXPECT_EQ(error.field(), "workspace");
  }
  check::check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

TEST(Execution, BadPointersAreRejectedBeforeAnyWork) {
  FUSEDATTN_REQUIRE_GPU();
  AttentionSpec spec = parse_spec(kSmallSpec);
  AttentionBuffers buffers(spec, false);
  ForwardTensors t = buffers.forward_tensors();
  float scale = default_scale(spec);
  ForwardTensors null_q = t;
  null_q.q = nullptr;
  try {
    forward(spec, null_q, scale, nullptr);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& error) {
    EXPECT_EQ(error.field(), "tensors.q");
    EXPECT_EQ(error.value(), "null");
  }
  ForwardTensors misaligned = t;
  misaligned.v = static_cast<const char*>(t.v) + 2;
  try {
    forward(spec, misaligned, scale, nullptr);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& error) {
    EXPECT_EQ(error.field(), "tensors.v");
  }
  ForwardTensors no_stats = t;
  no_stats.stats = nullptr;
  try {
    forward(spec, no_stats, scale, nullptr);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& error) {
    EXPECT_EQ(error.field(), "tensors.stats");
  }
  auto backward_plan = get_plan(spec, Pass::backward);
  try {
    backward_plan->run(t, scale, nullptr);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& error) {
    EXPECT_EQ(error.field(), "plan");
  }
}

TEST(Execution, DebugLogReportsMissBuildAndHit) {
  FUSEDATTN_REQUIRE_GPU();
  // A fresh disk cache folder, so that the plan is built (and written) rather than restored.
  const std::string was = plan_dir();
  char folder[] = "/tmp/fusedattn-log-plans-XXXXXX";
  ASSERT_NE(mkdtemp(folder), nullptr);
  set_plan_dir(folder);
  std::vector<std::string> lines;
  set_log_sink([&](const std::string& line) { lines.push_back(line); });
  set_logging(true);
  AttentionSpec spec = parse_spec("layout=bhsd dtype=bf16 b=1 s_q=99 s_kv=99 h=2 d=40 causal=0");
  check_support(spec, Pass::forward);
  check_support(spec, Pass::forward);
  set_logging(false);
  set_log_sink(nullptr);
  set_plan_dir(was);
  std::filesystem::remove_all(folder);
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(lines[0].rfind("fusedattn: miss forward", 0), 0u) << lines[0];
  EXPECT_EQ(lines[1].rfind("fusedattn: disk_store forward", 0), 0u) << lines[1];  // written inside the build
  EXPECT_EQ(lines[2].rfind("fusedattn: build ", 0), 0u) << lines[2];
  EXPECT_NE(lines[2].find(" ms forward"), std::string::npos) << lines[2];
  EXPECT_EQ(lines[3].rfind("fusedattn: hit forward", 0), 0u) << lines[3];
  EXPECT_NE(lines[3].find(to_string(spec)), std::string::npos) << lines[3];
}

}  // namespace
}  // namespace fusedattn
