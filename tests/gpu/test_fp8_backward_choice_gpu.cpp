// GPU tier: the FP8 backward's choice (fusedattn/fp8_backward_choice.h) is measured once, then
// answered from memory, and from the disk cache after memory is cleared; a fresh folder measures again.
#include <gtest/gtest.h>

#include <iostream>
#include <string>

#include "fusedattn/attention.h"
#include "fusedattn/disk_cache.h"
#include "fusedattn/errors.h"
#include "fusedattn/fp8_backward_choice.h"
#include "gpu_skip.h"
#include "plan_folders.h"

namespace fusedattn {
namespace {

const char* const kSpec = "layout=bshd dtype=e4m3 b=2 s=512 h=4 d=128 causal";

TEST(Fp8BackwardChoiceGpu, MeasuredOnceThenFromMemoryThenFromDisk) {
  FUSEDATTN_REQUIRE_GPU();
  if (current_device_caps().sm() < 90) GTEST_SKIP() << "FP8 attention needs SM 9.0 or newer";
  const AttentionSpec spec = parse_spec(kSpec);
  FreshPlanFolder folder;
  clear_fp8_backward_choices();
  EXPECT_FALSE(known_fp8_backward_choice(spec, DType::bf16).has_value());
  EXPECT_EQ(fp8_backward_report(spec), "not measured");
  EXPECT_EQ(fp8_backward_report(parse_spec("layout=bshd b=2 s=512 h=4 d=128")), "");

  const std::uint64_t before = fp8_backward_measurements();
  const Fp8BackwardChoice first = choose_fp8_backward(spec, DType::bf16);
  EXPECT_EQ(fp8_backward_measurements(), before + 1);
  EXPECT_GT(first.model_ms, 0.0);
  EXPECT_GT(first.fp8_ms, 0.0) << "the FP8 backward of " << kSpec << " is supported on SM 9.0";
  EXPECT_EQ(first.chosen, first.fp8_ms < first.model_ms ? Fp8Backward::fp8 : Fp8Backward::model);
  std::cout << "  " << kSpec << ": fp8 " << first.fp8_ms << " ms, model " << first.model_ms << " ms, chosen "
            << to_string(first.chosen) << "\n";

  const Fp8BackwardChoice again = choose_fp8_backward(spec, DType::bf16);
  EXPECT_EQ(fp8_backward_measurements(), before + 1) << "the second call must come from memory";
  EXPECT_EQ(again.chosen, first.chosen);
  EXPECT_EQ(again.fp8_ms, first.fp8_ms);
  ASSERT_TRUE(known_fp8_backward_choice(spec, DType::bf16).has_value());
  EXPECT_EQ(known_fp8_backward_choice(spec, DType::bf16)->model_ms, first.model_ms);
  EXPECT_FALSE(known_fp8_backward_choice(spec, DType::f16).has_value());
  EXPECT_EQ(fp8_backward_report(spec), to_string(first.chosen));

  clear_fp8_backward_choices();
  const std::uint64_t loaded = disk_cache_stats().loaded;
  const Fp8BackwardChoice kept = choose_fp8_backward(spec, DType::bf16);
  EXPECT_EQ(fp8_backward_measurements(), before + 1) << "after memory is cleared, the disk cache answers";
  EXPECT_EQ(disk_cache_stats().loaded, loaded + 1);
  EXPECT_EQ(kept.chosen, first.chosen);
  EXPECT_NEAR(kept.fp8_ms, first.fp8_ms, 1e-4);
  EXPECT_NEAR(kept.model_ms, first.model_ms, 1e-4);

  FreshPlanFolder another;
  clear_fp8_backward_choices();
  choose_fp8_backward(spec, DType::bf16);
  EXPECT_EQ(fp8_backward_measurements(), before + 2) << "a folder without the record measures again";
}

TEST(Fp8BackwardChoiceGpu, RefusesWhatItCannotStandInFor) {
  FUSEDATTN_REQUIRE_GPU();
  EXPECT_THROW(choose_fp8_backward(parse_spec("layout=bshd dtype=bf16 b=2 s=256 h=4 d=128"), DType::bf16),
               InvalidArgument);
  EXPECT_THROW(choose_fp8_backward(parse_spec(kSpec), DType::e4m3), InvalidArgument);
}

}  // namespace
}  // namespace fusedattn
