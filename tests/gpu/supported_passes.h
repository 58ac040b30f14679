// GPU tier: check a spec against the reference in every pass this GPU and cuDNN support.
#pragma once

#include <cstdio>

#include <gtest/gtest.h>

#include "fusedattn/attention.h"
#include "testing/reference_check.h"

namespace fusedattn {

/// Forward (and backward where supported) against the reference, with fresh random inputs. An
/// unsupported forward skips the test with every reason; an unsupported backward skips it after
/// the forward passed, saying so. `inference`: the forward alone, as inference runs it.
inline void check_supported_passes(const AttentionSpec& spec, bool inference = false) {
  const Support forward = check_support(spec, Pass::forward);
  if (!forward.ok()) GTEST_SKIP() << "forward not supported: " << forward.to_string();
  const Support backward = check_support(spec, Pass::backward);
  check::CheckOptions options;
  options.backward = !inference && backward.ok();
  const check::CheckResult result = check::check_against_reference(spec, options);
  std::printf("  %s\n", result.to_string().c_str());
  EXPECT_TRUE(result.passed) << result.to_string();
  if (!inference && !backward.ok()) GTEST_SKIP() << "forward passed; backward not supported: " << backward.to_string();
}

}  // namespace fusedattn

/// Skips the test, with every reason, unless this GPU and cuDNN run `spec` both ways.
#define FUSEDATTN_REQUIRE_SUPPORTED_BOTH(spec)                                                             \
  do {                                                                                                   \
    for (::fusedattn::Pass fusedattn_pass : {::fusedattn::Pass::forward, ::fusedattn::Pass::backward}) {  \
      const ::fusedattn::Support fusedattn_answer = ::fusedattn::check_support(spec, fusedattn_pass);     \
      if (!fusedattn_answer.ok()) GTEST_SKIP() << ::fusedattn::to_string(fusedattn_pass) << ": " << fusedattn_answer.to_string(); \
    }                                                                                                    \
  } while (0)
