// Tier 1: cuDNN's build answers told apart — refusals are support answers, failures are errors.
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace fusedattn::detail
