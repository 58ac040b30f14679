// testing/check_result.cpp — the tolerance a check holds outputs to, and its one-line result.
#include "testing/check_result.h"

#include <cmath>
#include <cstdio>

namespace fusedattn::check {

double tolerance_for(DType dtype) {
  // Relative L2 error reachable by a correct kernel that rounds its outputs to 16 bits (8 and 11
  // significant bits): bf16 1e-2, f16 2e-3 (DESIGN.md §8).
  return dtype == DType::f16 ? 2e-3 : 1e-2;
}

std::string CheckResult::to_string() const {
  auto err = [](const char* name, double value) {
    if (std::isnan(value)) return std::string();
    char text[48];
    std::snprintf(text, sizeof text, " %s=%.3e", name, value);
    return std::string(text);
  };
  char tol[32];
  std::snprintf(tol, sizeof tol, "%.0e", tolerance);
  return std::string(passed ? "PASS" : "FAIL") + " \"" + spec + "\" ref=" + reference + " seed=" + std::to_string(seed) +
         err("o", err_o) + err("stats", err_stats) + err("max_logit", err_max_logit) + err("dq", err_dq) +
         err("dk", err_dk) + err("dv", err_dv) + err("dbias", err_dbias) + err("dsink", err_dsink) +
         (std::isnan(keep_rate) ? std::string() : " keep_rate=" + std::to_string(keep_rate)) + " tol=" + tol +
         (backward ? "" : " (forward only)");
}

}  // namespace fusedattn::check
