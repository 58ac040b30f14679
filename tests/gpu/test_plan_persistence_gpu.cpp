// GPU tier: plans restored from the disk cache (fusedattn/disk_cache.h) and plans chosen by
// autotune (fusedattn/autotune.h) compute what the reference computes, a damaged entry is rebuilt
// and rewritten, and a restored plan records and replays like a built one.
#include <gtest/gtest.h>

#include <cstdlib>
#include <iostream>
#include <stdexcept>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "device_copy.h"
#include "fusedattn/attention.h"
#include "fusedattn/autotune.h"
#include "fusedattn/disk_cache.h"
#include "fusedattn/plan_cache.h"
#include "gpu_skip.h"
#include "plan_folders.h"
#include "testing/attention_buffers.h"
#include "testing/cuda_check.h"
#include "testing/device_buffer.h"
#include "testing/fp8_check.h"
#include "testing/reference_check.h"

namespace fusedattn {
namespace {

namespace fs = std::filesystem;

// The specs cover one of each graph kind the disk cache holds: plain with GQA and s_q != s_kv,
// ragged, FP8, a score modifier, a bias with its gradient.
const char* const kSpecs[] = {
    "layout=bshd b=2 s_q=200 s_kv=328 h_q=8 h_kv=2 d=128 causal",
    "layout=thd_thd_thd b=3 s_q=300 s_kv=300 h_q=4 h_kv=4 d=64 causal padding=1",
    "layout=bshd dtype=e4m3 b=2 s=256 h=4 d=128 causal",
    "layout=bshd b=2 s=256 h=4 d=64 score_mod=mul(tanh(div(score,$0)),$0)",
    "layout=bshd b=2 s=192 h=4 d=64 bias=1hss bias_grad=1",
};

class DiskCacheGpu : public ::testing::TestWithParam<const char*> {};

TEST_P(DiskCacheGpu, RestoredPlansMatchTheReference) {
  FUSEDATTN_REQUIRE_GPU();
  FreshPlanFolder folder;
  const AttentionSpec spec = parse_spec(GetParam());
  get_plan(spec, Pass::forward);
  get_plan(spec, Pass::backward);
  const DiskCacheStats written = disk_cache_stats();
  EXPECT_EQ(written.loaded, 0u);
  EXPECT_GE(written.stored, 2u) << "each pass's plan is written";
  EXPECT_EQ(written.store_failures, 0u);

  clear_plan_cache();  // as a new process would start
  get_plan(spec, Pass::forward);
  get_plan(spec, Pass::backward);
  const DiskCacheStats read = disk_cache_stats();
  EXPECT_EQ(read.loaded, 2u);
  EXPECT_EQ(read.stored, written.stored) << "nothing was built again";
  EXPECT_EQ(read.rejected, 0u);

  if (is_fp8(spec.q.dtype)) {  // FP8 is checked against the dequantized inputs' reference
    const check::Fp8CheckResult result = check::check_fp8_against_reference(spec, /*backward=*/true, 0);
    EXPECT_TRUE(result.passed) << result.to_string();
  } else {
    const check::CheckResult result = check::check_against_reference(spec, check::CheckOptions{});
    EXPECT_TRUE(result.passed) << result.to_string();
  }
  EXPECT_EQ(disk_cache_stats().rejected, 0u);
}

INSTANTIATE_TEST_SUITE_P(Gpu, DiskCacheGpu, ::testing::ValuesIn(kSpecs));

TEST(DiskCacheGpu, DamagedEntriesAreRebuiltAndRewritten) {
  FUSEDATTN_REQUIRE_GPU();
  FreshPlanFolder folder;
  const AttentionSpec spec = parse_spec(kSpecs[0]);
  get_plan(spec, Pass::forward);
  const std::vector<fs::path> entries = folder.entries();
  ASSERT_EQ(entries.size(), 1u);
  const auto whole = fs::file_size(entries[0]);

  // Cut short: refused as truncated, rebuilt, rewritten whole.
  fs::resize_file(entries[0], whole / 2);
  clear_plan_cache();
  get_plan(spec, Pass::forward);
  EXPECT_EQ(disk_cache_stats().rejected, 1u);
  EXPECT_EQ(fs::file_size(entries[0]), whole);

  // Another spec's whole entry under this one's name (as if copied in from elsewhere): other key.
  get_plan(parse_spec(kSpecs[3]), Pass::forward);
  std::vector<fs::path> both = folder.entries();
  ASSERT_EQ(both.size(), 2u);
  const fs::path other = both[0] == entries[0] ? both[1] : both[0];
  fs::copy_file(other, entries[0], fs::copy_options::overwrite_existing);
  clear_plan_cache();
  get_plan(spec, Pass::forward);
  EXPECT_EQ(disk_cache_stats().rejected, 2u);

  // A few bytes changed in the middle: the checksum refuses the file before cuDNN sees it.
  {
    std::fstream out(entries[0], std::ios::binary | std::ios::in | std::ios::out);
    out.seekp(static_cast<std::streamoff>(fs::file_size(entries[0]) / 2));
    out << "not a plan";
  }
  clear_plan_cache();
  get_plan(spec, Pass::forward);
  EXPECT_EQ(disk_cache_stats().rejected, 3u);
  EXPECT_EQ(disk_cache_stats().loaded, 0u);

  clear_plan_cache();
  get_plan(spec, Pass::forward);
  EXPECT_EQ(disk_cache_stats().loaded, 1u) << "the rewritten entry is whole again";
  const check::CheckResult result = check::check_against_reference(spec, check::CheckOptions{});
  EXPECT_TRUE(result.passed) << result.to_string();
}

TEST(DiskCacheGpu, RestoredPlansRecordAndReplay) {
  FUSEDATTN_REQUIRE_GPU();
  FreshPlanFolder folder;
  const AttentionSpec spec = parse_spec(kSpecs[0]);
  get_plan(spec, Pass::forward);
  clear_plan_cache();
  const std::shared_ptr<const Plan> plan = get_plan(spec, Pass::forward);
  ASSERT_EQ(disk_cache_stats().loaded, 1u);
  const bool was = set_replay(true);
  check::AttentionBuffers buffers(spec, /*with_backward=*/false);
  buffers.fill_inputs(0x51ab);
  check::DeviceBuffer workspace(std::max<std::size_t>(1, plan->workspace_bytes()));
  const Workspace ws{workspace.get(), workspace.bytes(), nullptr};
  const ForwardTensors t = buffers.forward_tensors();
  std::vector<std::vector<std::uint8_t>> outputs;
  for (int call = 0; call < 3; ++call) {
    buffers.poison_outputs();
    plan->run(t, default_scale(spec), nullptr, ws);
    check::check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    outputs.push_back(copy_to_host(t.o, bytes_of(spec.o)));
  }
  set_replay(was);
  EXPECT_GE(plan->replay_stats().replayed, 1u);
  EXPECT_EQ(outputs[2], outputs[0]) << "the replayed call differs from the executed one";
}

TEST(AutotuneGpu, TunedPlansMatchTheReferenceAndPersist) {
  FUSEDATTN_REQUIRE_GPU();
  FreshPlanFolder folder;
  std::vector<std::string> log;
  set_log_sink([&log](const std::string& line) { log.push_back(line); });
  set_logging(true);
  const bool was = set_autotune(true);
  for (const char* text : {kSpecs[0], kSpecs[1]}) {
    const AttentionSpec spec = parse_spec(text);
    const check::CheckResult result = check::check_against_reference(spec, check::CheckOptions{});
    EXPECT_TRUE(result.passed) << result.to_string();
  }
  set_autotune(was);
  set_logging(false);
  set_log_sink(nullptr);
  int tunings = 0;
  for (const std::string& line : log) {
    if (line.find("autotune:") == std::string::npos) continue;
    ++tunings;
    EXPECT_NE(line.find(" tuned device="), std::string::npos) << line;
    std::cout << line << "\n";  // which plans were timed and which won, for the results file
  }
  EXPECT_EQ(tunings, 4) << "one tuning per spec and pass";

  // A tuned entry is on disk: the next process (here: an empty plan cache) restores it, untimed.
  clear_plan_cache();
  reset_disk_cache_stats();
  get_plan(parse_spec(kSpecs[0]), Pass::backward, PlanOptions{Autotune::on});
  EXPECT_EQ(disk_cache_stats().loaded, 1u);
  EXPECT_EQ(disk_cache_stats().stored, 0u);
  // ... and a heuristics plan of the same spec is an entry of its own.
  get_plan(parse_spec(kSpecs[0]), Pass::backward, PlanOptions{Autotune::off});
  EXPECT_EQ(disk_cache_stats().missing, 1u);
}

}  // namespace
}  // namespace fusedattn
