// GPU tier: a soak of layouts, masks, sizes and features through support, plan and execution in
// one process, with the plan cache capped at 64 while they span about 540 plans, so that it evicts
// all along (evicted plans come back from a disk cache of the test's own, as they would in a serving
// process: rebuilding each would take 65 ms). Every spec of the space runs once first, forward alone
// and with its backward, then 2,000 drawn at random (FUSEDATTN_SOAK_SPECS sets another count), over
// which host and device memory must stay flat (what the library holds is bounded by the cap);
// every supported spec must run, and every 100th draw is checked against the reference.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "fusedattn/attention.h"
#include "fusedattn/plan_cache.h"
#include "gpu_skip.h"
#include "plan_folders.h"
#include "testing/attention_buffers.h"
#include "testing/cuda_check.h"
#include "testing/device_buffer.h"
#include "testing/reference_check.h"

namespace fusedattn {
namespace {

constexpr std::size_t kCap = 64;

// 2,000 by default: most draws miss the cache (64 of about 540 plans) and run through eviction and
// restore.
int spec_count() {
  const char* text = std::getenv("FUSEDATTN_SOAK_SPECS");
  const int count = text ? std::atoi(text) : 0;
  return count > 0 ? count : 2000;
}

// Every spec of the soak's space, 270 (each run forward alone and with its backward): every
// combination of the choices below; padded specs draw new lengths at every call.
std::vector<std::string> every_spec() {
  static const char* const kLayouts[] = {"bshd", "bs3hd", "sbhd_bshd_bshd"};
  static const char* const kSizes[] = {"b=2 s_q=96 s_kv=160", "b=1 s_q=200 s_kv=200"};
  static const char* const kHeads[] = {"h_q=4 h_kv=4", "h_q=8 h_kv=2"};
  static const char* const kMasks[] = {"", "causal", "window=32,0"};
  static const char* const kFeatures[] = {"", "bias=1hss", "softmax=sink", "padding=1", "dropout=0.1"};
  static const char* const kDtypes[] = {"bf16", "f16"};
  std::vector<std::string> specs;
  for (const std::string layout : kLayouts) {
    // One buffer for Q, K and V (bs3hd): equal sizes and heads, one choice of each.
    const bool packed = layout == "bs3hd";
    for (const char* sizes : kSizes) {
      for (const char* heads : kHeads) {
        if (packed && (sizes != kSizes[0] || heads != kHeads[0])) continue;
        const std::string shape = packed ? "b=2 s_q=128 s_kv=128 h_q=4 h_kv=4" : std::string(sizes) + " " + heads;
        for (const char* dtype : kDtypes) {
          for (const char* mask : kMasks) {
            for (const char* feature : kFeatures) {
              specs.push_back("layout=" + layout + " dtype=" + dtype + " " + shape + " d=64 " + mask + " " + feature);
            }
          }
        }
      }
    }
  }
  return specs;
}

std::size_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  std::size_t pages = 0, resident = 0;
  statm >> pages >> resident;
  return resident * static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
}

std::size_t device_used_bytes() {
  std::size_t free = 0, total = 0;
  check::check_cuda(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
  return total - free;
}

// What the soak counts.
struct Tally {
  int supported = 0, refused = 0, checked = 0, failed_checks = 0;
};

// One call of `text` (with its backward where `training`): refused where the spec or the support
// answer rules it out, against the reference where `sample`, otherwise a plain call on fresh buffers
// (allocated and freed here: the library keeps none).
void run_one(const std::string& text, bool training, bool sample, std::uint64_t seed, Tally& tally) {
  AttentionSpec spec;
  try {
    spec = parse_spec(text);
    validate(spec);
  } catch (const InvalidArgument&) {
    ++tally.refused;  // a combination the spec itself rules out (a window wider than the keys, ...)
    return;
  }
  if (!check_support(spec, Pass::forward).ok() || (training && !check_support(spec, Pass::backward).ok())) {
    ++tally.refused;
    return;
  }
  ++tally.supported;
  if (sample) {
    check::CheckOptions options;
    options.backward = training;
    const check::CheckResult result = check::check_against_reference(spec, options);
    ++tally.checked;
    if (!result.passed) ++tally.failed_checks;
    EXPECT_TRUE(result.passed) << result.to_string();
    return;
  }
  check::AttentionBuffers buffers(spec, training);
  buffers.fill_inputs(seed);
  try {
    const auto forward_plan = get_plan(spec, Pass::forward);
    const auto backward_plan = training ? get_plan(spec, Pass::backward) : nullptr;
    check::DeviceBuffer workspace(std::max(forward_plan->workspace_bytes(),
                                           backward_plan ? backward_plan->workspace_bytes() : 0));
    const Workspace w{workspace.get(), workspace.bytes()};
    forward_plan->run(buffers.forward_tensors(), default_scale(spec), nullptr, w);
    if (backward_plan) backward_plan->run(buffers.backward_tensors(), default_scale(spec), nullptr, w);
    check::check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  } catch (const std::exception& error) {
    ADD_FAILURE() << "supported but failed: " << text << ": " << error.what();
  }
}

TEST(SerialSoak, RandomSpecsRunWithinTheCachesBound) {
  FUSEDATTN_REQUIRE_GPU();
  const int specs = spec_count();
  FreshPlanFolder plans;  // evicted plans come back from it
  set_plan_cache_capacity(kCap);
  const CacheStats before = plan_cache_stats();
  // First every spec of the space once, forward alone and with its backward: every graph the draws
  // will build has then been built once, so that whatever a cuDNN keeps per distinct graph is in
  // place before memory is watched (under cuDNN 9.26 and 9.28, host memory grew while random draws
  // were still finding new graphs, more slowly as they found fewer). The draws then rebuild evicted
  // plans all along, and memory must stay flat: growth there is held per build or per call.
  const std::vector<std::string> space = every_spec();
  const double host_at_start = resident_bytes() / 1e6;
  Tally tally;
  std::uint64_t seed = 0;
  for (const std::string& text : space) {
    for (const bool training : {false, true}) {
      run_one(text, training, false, ++seed, tally);
      // A few against the reference too: the checks' own host allocations are then in place as well.
      if (seed % 100 == 0) run_one(text, training, true, seed, tally);
    }
  }
  ASSERT_EQ(plan_cache_stats().size, kCap) << "the cache never filled";
  const std::size_t host_at_full = resident_bytes(), device_at_full = device_used_bytes();
  std::size_t host_peak = host_at_full, device_peak = device_at_full;
  // Host memory at each tenth of the random draws: growth that keeps its pace is held per plan
  // built or per call.
  std::vector<double> host_by_tenth;
  std::mt19937_64 rng(std::random_device{}());
  for (int n = 0; n < specs; ++n) {
    if (n > 0 && n % std::max(specs / 10, 1) == 0) host_by_tenth.push_back(resident_bytes() / 1e6);
    const std::string& text = space[rng() % space.size()];
    const bool training = rng() % 2 == 0;
    run_one(text, training, n % 100 == 0, ++seed, tally);  // every 100th against the reference
    host_peak = std::max(host_peak, resident_bytes());
    device_peak = std::max(device_peak, device_used_bytes());
  }
  const CacheStats after = plan_cache_stats();
  set_plan_cache_capacity(kDefaultPlanCacheCapacity);
  std::printf("soak: %zu specs twice, then %d drawn: %d supported, %d refused, %d checked (%d failed); %llu builds, "
              "%llu evictions; host %.1f MB at the start, %.1f -> %.1f MB peak over the draws, device %.1f -> %.1f MB\n",
              space.size(), specs, tally.supported, tally.refused, tally.checked, tally.failed_checks,
              static_cast<unsigned long long>(after.builds - before.builds),
              static_cast<unsigned long long>(after.evictions - before.evictions), host_at_start, host_at_full / 1e6,
              host_peak / 1e6, device_at_full / 1e6, device_peak / 1e6);
  std::string tenths = "host MB at each tenth of the draws:";
  for (const double mb : host_by_tenth) tenths += " " + std::to_string(static_cast<int>(mb));
  std::printf("soak: %s\n", tenths.c_str());
  EXPECT_GT(tally.supported, tally.refused);
  EXPECT_LE(after.size, kCap);
  EXPECT_GT(after.evictions - before.evictions, 0u);
  // Flat within what one plan's cuDNN objects and the allocator's slack take: 64 MB of host memory,
  // 256 MB of device memory (a plan holds no device memory of ours but the off_by_one sink). The
  // draws' reference checks (statistics and dropout masks out) build a score of graphs of their own,
  // well within it.
  EXPECT_LT(host_peak, host_at_full + (64u << 20)) << tenths;
  EXPECT_LT(device_peak, device_at_full + (256u << 20));
}

}  // namespace
}  // namespace fusedattn
