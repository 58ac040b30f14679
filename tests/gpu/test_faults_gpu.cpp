// GPU tier: injected faults. A cuDNN failure in the middle of a plan build or of an execution, a
// device allocation or a workspace allocator that fails, a call on a stream whose capture went
// wrong: each raises an error that names the spec, leaves nothing half-written and nothing wrong
// in the plan cache, and the next call builds or runs and is right.
#include <gtest/gtest.h>

#include <cudnn_graph.h>

#include <cstdint>
#include <functional>
#include <new>
#include <string>
#include <vector>

#include "cudnn_faults.h"
#include "device_allocations.h"
#include "plan_folders.h"
#include "fusedattn/attention.h"
#include "fusedattn/errors.h"
#include "fusedattn/plan_cache.h"
#include "gpu_skip.h"
#include "testing/attention_buffers.h"
#include "testing/cuda_check.h"
#include "testing/device_buffer.h"
#include "testing/reference_check.h"

namespace fusedattn {
namespace {

using check::AttentionBuffers;
using check::DeviceBuffer;

// The next call works and is right: the forward (and backward) against the reference.
void expect_right(const AttentionSpec& spec, bool backward) {
  check::CheckOptions options;
  options.backward = backward;
  const check::CheckResult result = check::check_against_reference(spec, options);
  EXPECT_TRUE(result.passed) << result.to_string();
}

// Runs `call`, which must throw a fusedattn error of `kind` whose message names the spec.
void expect_error_naming(const std::function<void()>& call, ErrorKind kind, const AttentionSpec& spec) {
  try {
    call();
    ADD_FAILURE() << "no error; expected " << to_string(kind) << " for " << to_string(spec);
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), kind) << error.what();
    EXPECT_NE(std::string(error.what()).find(to_string(spec)), std::string::npos) << error.what();
  }
}

// Every byte of O still 0xFF (the poison): the failed call wrote nothing.
bool untouched(const AttentionSpec& spec, const ForwardTensors& t) {
  std::vector<unsigned char> bytes(static_cast<std::size_t>(spec.o.extent()) * size_of(spec.o.dtype));
  check::check_cuda(cudaMemcpy(bytes.data(), t.o, bytes.size(), cudaMemcpyDeviceToHost), "cudaMemcpy(o)");
  for (unsigned char byte : bytes) {
    if (byte != 0xFF) return false;
  }
  return true;
}

TEST(Faults, ACudnnFailureInTheMiddleOfABuildIsRaisedNeverCachedAndTheNextCallBuilds) {
  FUSEDATTN_REQUIRE_GPU();
  DiskCacheOff off;
  const AttentionSpec spec = parse_spec("layout=bshd dtype=bf16 b=2 s_q=96 s_kv=160 h_q=4 h_kv=2 d=64 causal");
  clear_plan_cache();
  const long finalizes = with_cudnn_failure(CudnnCall::finalize, 0, 0, [&] { get_plan(spec, Pass::forward); });
  ASSERT_GT(finalizes, 2) << "a build finalizes the operation graph, its engine configuration and its plan";
  // The first finalize (an operation graph's), one in the middle, the last (the plan's).
  for (long nth : {1L, finalizes / 2, finalizes}) {
    clear_plan_cache();
    const CacheStats before = plan_cache_stats();
    bool raised = false;
    with_cudnn_failure(CudnnCall::finalize, nth, CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED, [&] {
      try {
        get_plan(spec, Pass::forward);
      } catch (const CudnnError& error) {
        raised = true;
        EXPECT_NE(std::string(error.what()).find(to_string(spec)), std::string::npos) << error.what();
        EXPECT_NE(std::string(error.what()).find("DEVICE_ALLOCATION_FAILED"), std::string::npos) << error.what();
      } catch (const NotSupported& error) {  // the fault taken for a refusal: callers would fall back for good
        ADD_FAILURE() << "finalize " << nth << " of " << finalizes << " failing was answered NotSupported: "
                      << error.what();
      }
    });
    const CacheStats after = plan_cache_stats();
    if (raised) {
      EXPECT_EQ(after.failed_builds, before.failed_builds + 1);
      EXPECT_EQ(after.size, before.size) << "a failed build left an entry";
    }
    EXPECT_TRUE(nth != 1 || raised) << "nothing builds without its operation graph";
    EXPECT_TRUE(check_support(spec, Pass::forward).ok()) << "finalize " << nth;
    expect_right(spec, false);
  }
}

TEST(Faults, ACudnnFailureInAnExecutionIsRaisedAndThePlanRunsRightAfterwards) {
  FUSEDATTN_REQUIRE_GPU();
  const AttentionSpec spec = parse_spec("layout=bshd dtype=bf16 b=2 s_q=80 s_kv=144 h_q=4 h_kv=4 d=64");
  AttentionBuffers buffers(spec, false);
  buffers.fill_inputs(7);
  buffers.poison_outputs();
  const auto plan = get_plan(spec, Pass::forward);
  DeviceBuffer workspace(plan->workspace_bytes());
  const bool replay = set_replay(false);  // each call through cuDNN's execute
  const CacheStats before = plan_cache_stats();
  const long executes = with_cudnn_failure(CudnnCall::execute, 1, CUDNN_STATUS_EXECUTION_FAILED, [&] {
    expect_error_naming([&] {
      plan->run(buffers.forward_tensors(), default_scale(spec), nullptr, {workspace.get(), workspace.bytes()});
    }, ErrorKind::cudnn, spec);
  });
  set_replay(replay);
  EXPECT_EQ(executes, 1);
  check::check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  EXPECT_TRUE(untouched(spec, buffers.forward_tensors()));
  EXPECT_EQ(get_plan(spec, Pass::forward), plan) << "the plan stays cached";
  EXPECT_EQ(plan_cache_stats().failed_builds, before.failed_builds);
  expect_right(spec, true);
}

// Workspace allocators that fail: by returning null, and by throwing as a framework's does.
class NullAllocator : public WorkspaceAllocator {
 public:
  void* allocate(std::size_t, cudaStream_t) override { return nullptr; }
  void release(void*, std::size_t, cudaStream_t) override { ++released; }
  int released = 0;
};
class ThrowingAllocator : public WorkspaceAllocator {
 public:
  void* allocate(std::size_t, cudaStream_t) override { throw std::bad_alloc(); }
  void release(void*, std::size_t, cudaStream_t) override {}
};

TEST(Faults, AFailingWorkspaceAllocatorNamesTheSpecAndLeavesNothingWritten) {
  FUSEDATTN_REQUIRE_GPU();
  // A max logit per head needs scratch of ours: the plan always asks for workspace.
  const AttentionSpec spec = parse_spec("layout=bshd dtype=bf16 b=2 s_q=64 s_kv=128 h_q=4 h_kv=4 d=64 max_logit=head");
  const auto plan = get_plan(spec, Pass::forward);
  ASSERT_GT(plan->workspace_bytes(), 0u);
  AttentionBuffers buffers(spec, false);
  buffers.fill_inputs(11);
  buffers.poison_outputs();
  NullAllocator null_allocator;
  expect_error_naming([&] { plan->run(buffers.forward_tensors(), default_scale(spec), nullptr, {nullptr, 0, &null_allocator}); },
                      ErrorKind::cuda, spec);
  EXPECT_EQ(null_allocator.released, 0) << "nothing to release after a null allocation";
  ThrowingAllocator throwing;
  EXPECT_THROW(plan->run(buffers.forward_tensors(), default_scale(spec), nullptr, {nullptr, 0, &throwing}),
               std::bad_alloc);
  check::check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  EXPECT_TRUE(untouched(spec, buffers.forward_tensors()));
  expect_right(spec, false);
}

TEST(Faults, ADeviceAllocationFailingInABuildIsRaisedNeverCached) {
  FUSEDATTN_REQUIRE_GPU();
  DiskCacheOff off;
  // off_by_one: the plan allocates its sink of zeros when it is built.
  const AttentionSpec spec =
      parse_spec("layout=bshd dtype=bf16 b=1 s_q=72 s_kv=136 h_q=4 h_kv=4 d=64 softmax=off_by_one");
  clear_plan_cache();
  const CacheStats before = plan_cache_stats();
  const long allocations = with_failing_device_allocation(1, [&] {
    expect_error_naming([&] { get_plan(spec, Pass::forward); }, ErrorKind::cuda, spec);
  });
  EXPECT_GE(allocations, 1);
  EXPECT_EQ(plan_cache_stats().size, before.size);
  EXPECT_EQ(plan_cache_stats().failed_builds, before.failed_builds + 1);
  expect_right(spec, true);
}

TEST(Faults, APlanBuiltWhileAnotherStreamIsCapturedLeavesTheCaptureWhole) {
  FUSEDATTN_REQUIRE_GPU();
  DiskCacheOff off;
  const AttentionSpec spec = parse_spec("layout=bshd dtype=bf16 b=2 s_q=112 s_kv=112 h_q=4 h_kv=4 d=64 causal");
  clear_plan_cache();
  AttentionBuffers buffers(spec, false);
  buffers.fill_inputs(5);
  buffers.poison_outputs();
  cudaStream_t stream = nullptr;
  check::check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  DeviceBuffer workspace(1 << 20);
  check::check_cuda(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), "cudaStreamBeginCapture");
  const auto plan = get_plan(spec, Pass::forward);  // built now, under the capture
  ASSERT_LE(plan->workspace_bytes(), workspace.bytes());
  plan->run(buffers.forward_tensors(), default_scale(spec), stream, {workspace.get(), workspace.bytes()});
  cudaGraph_t graph = nullptr;
  check::check_cuda(cudaStreamEndCapture(stream, &graph), "cudaStreamEndCapture (the build broke the capture)");
  cudaGraphExec_t exec = nullptr;
  check::check_cuda(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
  check::check_cuda(cudaGraphLaunch(exec, stream), "cudaGraphLaunch");
  check::check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  EXPECT_FALSE(untouched(spec, buffers.forward_tensors())) << "the replayed graph wrote O";
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
  expect_right(spec, false);
}

TEST(Faults, ACallOnAStreamWhoseCaptureBrokeNamesTheSpecAndTheNextCallRuns) {
  FUSEDATTN_REQUIRE_GPU();
  const AttentionSpec spec = parse_spec("layout=bshd dtype=bf16 b=2 s_q=48 s_kv=176 h_q=4 h_kv=2 d=64");
  const auto plan = get_plan(spec, Pass::forward);
  AttentionBuffers buffers(spec, false);
  buffers.fill_inputs(3);
  buffers.poison_outputs();
  DeviceBuffer workspace(plan->workspace_bytes() + 256);
  cudaStream_t stream = nullptr;
  check::check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  check::check_cuda(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), "cudaStreamBeginCapture");
  // Synchronizing a capturing stream is not allowed: it fails and invalidates the capture.
  EXPECT_NE(cudaStreamSynchronize(stream), cudaSuccess);
  const CacheStats before = plan_cache_stats();
  try {
    plan->run(buffers.forward_tensors(), default_scale(spec), stream, {workspace.get(), workspace.bytes()});
    ADD_FAILURE() << "ran on an invalidated capture";
  } catch (const Error& error) {  // cuDNN's execute or our own launch, whichever meets it first
    EXPECT_TRUE(error.kind() == ErrorKind::cudnn || error.kind() == ErrorKind::cuda) << error.what();
    EXPECT_NE(std::string(error.what()).find(to_string(spec)), std::string::npos) << error.what();
  }
  cudaGraph_t graph = nullptr;
  EXPECT_NE(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  (void)cudaGetLastError();
  if (graph) cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
  EXPECT_EQ(plan_cache_stats().size, before.size);
  EXPECT_EQ(get_plan(spec, Pass::forward), plan);
  expect_right(spec, false);
}

}  // namespace
}  // namespace fusedattn
