// GPU tier: a soak — 2,000 random valid specs (FUSEDATTN_SOAK_SPECS sets another count: 10,000 took
// 306 s on the H200) of layouts, masks, sizes and features through support, plan and execution in one
// process, with the plan cache capped at 64 while they span a few hundred plans, so it evicts all along (evicted plans come back from a disk cache of the test's
// own, as they would in a serving process: rebuilding each would take 65 ms). Host and device
// memory must stay flat once the cache is full (what the library holds is bounded by the cap),
// every supported spec must run, and every 100th is checked against the reference.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <cstdlib>
#include <random>
#include <set>
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

// 2,000 by default: past the first hundred or so the cache is full and every further spec runs
// through eviction and restore, which these already repeat about 2,400 times.
int spec_count() {
  const char* text = std::getenv("FUSEDATTN_SOAK_SPECS");
  const int count = text ? std::atoi(text) : 0;
  return count > 0 ? count : 2000;
}

// A random spec from a space of about 270 (times the passes): every combination of the choices
// below; padded specs draw new lengths at every call.
std::string random_spec(std::mt19937_64& rng) {
  auto pick = [&](auto const& choices) { return choices[rng() % (sizeof choices / sizeof choices[0])]; };
  static const char* const kLayouts[] = {"bshd", "bs3hd", "sbhd_bshd_bshd"};
  static const char* const kSizes[] = {"b=2 s_q=96 s_kv=160", "b=1 s_q=200 s_kv=200"};
  static const char* const kHeads[] = {"h_q=4 h_kv=4", "h_q=8 h_kv=2"};
  static const char* const kMasks[] = {"", "causal", "window=32,0"};
  static const char* const kFeatures[] = {"", "bias=1hss", "softmax=sink", "padding=1", "dropout=0.1"};
  static const char* const kDtypes[] = {"bf16", "f16"};
  const std::string layout = pick(kLayouts);
  std::string sizes = pick(kSizes), heads = pick(kHeads);
  if (layout == "bs3hd") {  // one buffer for Q, K and V: equal sizes and heads
    sizes = "b=2 s_q=128 s_kv=128";
    heads = "h_q=4 h_kv=4";
  }
  return "layout=" + layout + " dtype=" + pick(kDtypes) + " " + sizes + " " + heads + " d=64 " + pick(kMasks) + " " +
         pick(kFeatures);
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

TEST(SerialSoak, RandomSpecsRunWithinTheCachesBound) {
  FUSEDATTN_REQUIRE_GPU();
  const int specs = spec_count();
  FreshPlanFolder plans;  // evicted plans come back from it
  set_plan_cache_capacity(kCap);
  std::mt19937_64 rng(std::random_device{}());
  int supported = 0, refused = 0, checked = 0, failed_checks = 0;
  std::size_t host_at_full = 0, device_at_full = 0, host_peak = 0, device_peak = 0;
  // Host memory at each tenth of the run: growth that levels off is a cache bounded by the distinct
  // plans the run visits (a cuDNN's own, beside the library's capped one), growth that keeps its
  // pace to the end is held per plan built.
  // Beside it, the distinct (spec, passes) the run has built by then: growth that follows them is
  // held per distinct graph (a cache keyed by the graph), not per call.
  std::vector<double> host_by_tenth;
  std::vector<std::size_t> distinct_by_tenth;
  std::set<std::string> distinct;
  const CacheStats before = plan_cache_stats();
  for (int n = 0; n < specs; ++n) {
    if (n > 0 && n % std::max(specs / 10, 1) == 0) {
      host_by_tenth.push_back(resident_bytes() / 1e6);
      distinct_by_tenth.push_back(distinct.size());
    }
    const std::string text = random_spec(rng);
    AttentionSpec spec;
    try {
      spec = parse_spec(text);
      validate(spec);
    } catch (const InvalidArgument&) {
      ++refused;  // a combination the spec itself rules out (a window wider than the keys, ...)
      continue;
    }
    const bool training = rng() % 2 == 0;
    if (!check_support(spec, Pass::forward).ok() || (training && !check_support(spec, Pass::backward).ok())) {
      ++refused;
      continue;
    }
    ++supported;
    distinct.insert(text + (training ? " +backward" : ""));
    if (n % 100 == 0) {  // a sample against the reference
      check::CheckOptions options;
      options.backward = training;
      const check::CheckResult result = check::check_against_reference(spec, options);
      ++checked;
      if (!result.passed) ++failed_checks;
      EXPECT_TRUE(result.passed) << result.to_string();
      continue;
    }
    // Otherwise a plain call on fresh buffers (allocated and freed here: the library keeps none).
    check::AttentionBuffers buffers(spec, training);
    buffers.fill_inputs(static_cast<std::uint64_t>(n));
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
    if (plan_cache_stats().size == kCap && host_at_full == 0 && n > specs / 10) {
      host_at_full = resident_bytes();
      device_at_full = device_used_bytes();
    }
    if (host_at_full) {
      host_peak = std::max(host_peak, resident_bytes());
      device_peak = std::max(device_peak, device_used_bytes());
    }
  }
  const CacheStats after = plan_cache_stats();
  set_plan_cache_capacity(kDefaultPlanCacheCapacity);
  std::printf("soak: %d specs, %d supported, %d refused, %d checked (%d failed); %llu builds, %llu evictions; "
              "host %.1f -> %.1f MB peak, device %.1f -> %.1f MB peak after the cache filled\n",
              specs, supported, refused, checked, failed_checks,
              static_cast<unsigned long long>(after.builds - before.builds),
              static_cast<unsigned long long>(after.evictions - before.evictions), host_at_full / 1e6,
              host_peak / 1e6, device_at_full / 1e6, device_peak / 1e6);
  std::string tenths = "host MB at each tenth of the specs:";
  for (const double mb : host_by_tenth) tenths += " " + std::to_string(static_cast<int>(mb));
  tenths += "; distinct (spec, passes) run by then:";
  for (const std::size_t count : distinct_by_tenth) tenths += " " + std::to_string(count);
  tenths += " of " + std::to_string(distinct.size());
  std::printf("soak: %s\n", tenths.c_str());
  EXPECT_GT(supported, specs / 2);
  EXPECT_LE(after.size, kCap);
  EXPECT_GT(after.evictions - before.evictions, 0u);
  ASSERT_GT(host_at_full, 0u) << "the cache never filled";
  // Flat within what one plan's cuDNN objects and the allocator's slack take: 64 MB of host memory,
  // 256 MB of device memory (a plan holds no device memory of ours but the off_by_one sink).
  EXPECT_LT(host_peak, host_at_full + (64u << 20)) << tenths;
  EXPECT_LT(device_peak, device_at_full + (256u << 20));
}

}  // namespace
}  // namespace fusedattn
