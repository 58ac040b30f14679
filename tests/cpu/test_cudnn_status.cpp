// Tier 1: cuDNN's build answers told apart — refusals are support answers, failures are errors.
#include <gtest/gtest.h>

#include <string>

#include "support/cudnn_status.h"

namespace fusedattn::detail {
namespace {

// The frontend's form: "<call> failed with message: <cuDNN's last error>, and code: <status>".
TEST(CudnnStatus, FailuresAreNamedWithTheirWholeStatus) {
  EXPECT_EQ(cudnn_failure_in("cudnnBackendFinalize(plan) failed with message: , and code: "
                             "CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED"),
            "CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED");
  EXPECT_EQ(cudnn_failure_in("[cudnn_frontend] Error: No valid execution plans built.\nPlan at index 0: "
                             "x failed, and code: CUDNN_STATUS_EXECUTION_FAILED_CUDART\nPlan at index 1: y"),
            "CUDNN_STATUS_EXECUTION_FAILED_CUDART");
  EXPECT_EQ(cudnn_failure_in("code: CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED"), "CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED");
  EXPECT_EQ(cudnn_failure_in("code: CUDNN_STATUS_NOT_INITIALIZED."), "CUDNN_STATUS_NOT_INITIALIZED");
}

TEST(CudnnStatus, RefusalsAreNotFailures) {
  EXPECT_TRUE(cudnn_failure_in("code: CUDNN_STATUS_NOT_SUPPORTED_SHAPE").empty());
  EXPECT_TRUE(cudnn_failure_in("code: CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH").empty());
  EXPECT_TRUE(cudnn_failure_in("code: CUDNN_STATUS_INTERNAL_ERROR").empty());  // cuDNN's word for graphs it cannot compile
  EXPECT_TRUE(cudnn_failure_in("code: CUDNN_STATUS_INTERNAL_ERROR_COMPILATION_FAILED").empty());
  EXPECT_TRUE(cudnn_failure_in("[cudnn_frontend] Error: No valid engine configs for SDPA").empty());
  EXPECT_TRUE(cudnn_failure_in("").empty());
}

// An engine's refusal quotes the check that failed, which may name a failure status in passing
// (cuDNN 9.19 on the H200, a softcap's runtime scalar beside a bias and its gradient): a refusal.
TEST(CudnnStatus, StatusesNamedInARefusalsReasonAreNotFailures) {
  const char* refusal =
      "No valid engine configs for _____\n"
      "{\"engineId\":6,\"smVersion\":900}\n"
      "Warning: CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN; Reason: !pointwise_node->bPort.tensor->getIsByValue()\n"
      "Warning: CUDNN_STATUS_NOT_SUPPORTED; Reason: (CUDNN_STATUS_NOT_INITIALIZED == status) || "
      "(CUDNN_STATUS_NOT_SUPPORTED == ((status) / 1000 * 1000))\n"
      "Warning: CUDNN_STATUS_NOT_SUPPORTED; Reason: finalize_internal()\n";
  EXPECT_TRUE(cudnn_failure_in(refusal).empty());
  // A failure on a line of its own still counts, before or after such lines.
  EXPECT_EQ(cudnn_failure_in(std::string(refusal) + "Plan at index 1: code: CUDNN_STATUS_EXECUTION_FAILED"),
            "CUDNN_STATUS_EXECUTION_FAILED");
}

}  // namespace
}  // namespace fusedattn::detail
