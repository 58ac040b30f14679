// Tier 1: support answers from the policy alone (a device named by target, or no GPU to ask) and
// the words for a missing driver or GPU.
#include <gtest/gtest.h>

#include <string>

#include <cuda_runtime_api.h>

#include "exec/cuda_status.h"
#include "fusedattn/errors.h"
#include "fusedattn/layout.h"
#include "fusedattn/support.h"
#include "made_up_versions.h"
#include "support/policy_only.h"

namespace fusedattn::detail {
namespace {

AttentionSpec spec_of(std::int64_t d_qk, std::int64_t d_v) {
  ProblemShape shape;
  shape.batch = 2;
  shape.seq_q = shape.seq_kv = 256;
  shape.heads_q = shape.heads_kv = 8;
  shape.head_dim_qk = d_qk;
  shape.head_dim_v = d_v;
  return spec_for_layout(Layout::bshd, shape);
}

void expect_same_reasons(const Support& a, const Support& b) {
  ASSERT_EQ(a.reasons.size(), b.reasons.size()) << a.to_string() << "\nvs\n" << b.to_string();
  for (std::size_t i = 0; i < a.reasons.size(); ++i) EXPECT_EQ(a.reasons[i].to_string(), b.reasons[i].to_string());
}

TEST(DeviceTarget, NamesMajorAndMinor) {
  const std::pair<const char*, DeviceCaps> cases[] = {
      {"sm90", {9, 0}}, {"sm_90", {9, 0}}, {"sm100", {10, 0}}, {"sm_103", {10, 3}},
      {"sm86", {8, 6}}, {"sm120", {12, 0}}, {"sm75", {7, 5}}};
  for (const auto& [target, caps] : cases) {
    const DeviceCaps got = device_target(target);
    EXPECT_EQ(got.sm_major, caps.sm_major) << target;
    EXPECT_EQ(got.sm_minor, caps.sm_minor) << target;
  }
}

TEST(DeviceTarget, OtherFormsAndUnknownFamiliesAreNamed) {
  for (const char* target : {"", "90", "sm", "sm_", "sm9", "sm1000", "SM90", "sm90a", "sm 90", "sm090", "gpu"}) {
    try {
      device_target(target);
      ADD_FAILURE() << "accepted '" << target << "'";
    } catch (const InvalidArgument& error) {
      EXPECT_EQ(error.field(), "device");
      EXPECT_EQ(error.value(), target);
      EXPECT_NE(error.requirement().find("sm90"), std::string::npos) << error.what();
    }
  }
  for (const char* target : {"sm110", "sm130"}) {  // families the policy has no rules for
    try {
      device_target(target);
      ADD_FAILURE() << "accepted '" << target << "'";
    } catch (const InvalidArgument& error) {
      EXPECT_EQ(error.value(), target);
      EXPECT_NE(error.requirement().find("12.x"), std::string::npos) << error.what();
    }
  }
}

TEST(PolicyOnly, AnswersAsThePolicyForTheNamedDeviceAndSaysCudnnDidNotCheck) {
  const Versions versions = made_up_versions(91900);
  // The MLA pair 192/128 trains on SM 10.x from cuDNN 9.11 and on Hopper, not on SM 8.x or 12.x.
  const AttentionSpec mla = spec_of(192, 128);
  for (const char* target : {"sm80", "sm90", "sm100", "sm120"}) {
    const DeviceCaps caps = device_target(target);
    const std::string why = std::string("device ") + target + " named";
    const Support answer = policy_only_answer(mla, Pass::backward, caps, versions, why);
    expect_same_reasons(answer, check_support_policy(mla, Pass::backward, caps, versions));
    EXPECT_EQ(answer.ok(), caps.sm_major == 9 || caps.sm_major == 10) << target << ": " << answer.to_string();
  }
  const Support sm100 = policy_only_answer(mla, Pass::backward, DeviceCaps{10, 0}, versions, "device sm100 named");
  EXPECT_EQ(sm100.policy_only,
            "policy for SM 10.0 with cuDNN 9.19.0 only, cuDNN's own check not run (device sm100 named)");
  EXPECT_EQ(sm100.to_string(), "supported\n(" + sm100.policy_only + ")");
}

TEST(PolicyOnly, ANoGpuAnswerListsEveryReasonThenTheNote) {
  const Support answer = policy_only_answer(spec_of(512, 512), Pass::forward, DeviceCaps{9, 0},
                                            made_up_versions(91900), "no NVIDIA driver found");
  ASSERT_EQ(answer.reasons.size(), 2u) << answer.to_string();
  EXPECT_EQ(answer.policy_only,
            "policy for SM 9.0 with cuDNN 9.19.0 only, cuDNN's own check not run (no NVIDIA driver found)");
  EXPECT_EQ(answer.to_string(), answer.reasons[0].to_string() + "\n" + answer.reasons[1].to_string() +
                                    "\n(policy for SM 9.0 with cuDNN 9.19.0 only, cuDNN's own check not run (no "
                                    "NVIDIA driver found))");
}

TEST(PolicyOnly, NoLoadedCudnnReadsAsTheCompiledOne) {
  // Runtime 0 would be refused by the cuDNN version rule; the compiled headers' version is the one
  // a process that loads the library would run.
  const Support answer = policy_only_answer(spec_of(128, 128), Pass::backward, DeviceCaps{9, 0}, made_up_versions(0),
                                            "no NVIDIA driver found");
  EXPECT_TRUE(answer.ok()) << answer.to_string();
  EXPECT_NE(answer.policy_only.find("cuDNN 9.19.0 only"), std::string::npos) << answer.policy_only;
  EXPECT_FALSE(check_support_policy(spec_of(128, 128), Pass::backward, DeviceCaps{9, 0}, made_up_versions(0)).ok());
}

TEST(PolicyOnly, ThePolicysOwnAnswerCarriesNoNote) {
  const Support answer =
      check_support_policy(spec_of(128, 128), Pass::forward, DeviceCaps{9, 0}, made_up_versions(91900));
  EXPECT_TRUE(answer.policy_only.empty());
  EXPECT_EQ(answer.to_string(), "supported");
}

TEST(GpuMissing, NoDriverAndNoGpuAreSaidPlainly) {
  EXPECT_EQ(gpu_missing(cudaErrorInsufficientDriver, 0), "no NVIDIA driver found");
  EXPECT_EQ(gpu_missing(cudaErrorNoDevice, 0), "no NVIDIA driver found");
  EXPECT_EQ(gpu_missing(cudaErrorNoDevice, 13000), "no CUDA GPU found");
  EXPECT_EQ(gpu_missing(cudaErrorInsufficientDriver, 12020), "");  // a driver too old: the runtime's words are right
  EXPECT_EQ(gpu_missing(cudaErrorMemoryAllocation, 0), "");
  EXPECT_EQ(gpu_missing(cudaSuccess, 0), "");
}

TEST(GpuMissing, FailuresNameTheCallAndTheStatus) {
  EXPECT_EQ(cuda_failure(cudaErrorInsufficientDriver, "cudaGetDevice", 0),
            "cudaGetDevice failed: no NVIDIA driver found (cudaErrorInsufficientDriver)");
  EXPECT_EQ(cuda_failure(cudaErrorNoDevice, "cudaGetDeviceCount", 13000),
            "cudaGetDeviceCount failed: no CUDA GPU found (cudaErrorNoDevice)");
  EXPECT_EQ(cuda_failure(cudaErrorInsufficientDriver, "cudaGetDevice", 12020),
            std::string("cudaGetDevice failed: cudaErrorInsufficientDriver (") +
                cudaGetErrorString(cudaErrorInsufficientDriver) + ")");
}

// The mapping rests on what the runtime reports without a driver; on a machine without one, check it.
TEST(GpuMissing, ThisMachineWithoutADriver) {
  int driver_version = -1;
  ASSERT_EQ(cudaDriverGetVersion(&driver_version), cudaSuccess);
  if (driver_version != 0) GTEST_SKIP() << "an NVIDIA driver is installed here (CUDA " << driver_version << ")";
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  cudaGetLastError();
  EXPECT_EQ(gpu_missing(status, driver_version), "no NVIDIA driver found") << cudaGetErrorName(status);
}

}  // namespace
}  // namespace fusedattn::detail
