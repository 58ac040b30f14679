// testing/check_result.h — what a reference check takes (options), what it holds outputs to
// (tolerance_for) and what it gives back (CheckResult, one printable line).
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "fusedattn/tensor.h"

namespace fusedattn::check {

/// How to run a check. Defaults give a fresh random problem, forward and backward.
struct CheckOptions {
  bool backward = true;                                    ///< also run and check dQ, dK, dV
  double scale = std::numeric_limits<double>::quiet_NaN();  ///< NaN: default_scale(spec)
  std::uint64_t seed = 0;                                  ///< 0: draw one from std::random_device
  /// A score modifier's scalars ($0, $1, ...); empty: drawn uniformly from [0.5, 2] per check.
  std::vector<float> score_mod_scalars;
  /// A padded dense spec's lengths, one per batch entry (empty: drawn, entry 0 the longest).
  std::vector<std::int32_t> seq_len_q, seq_len_kv;
  /// The forward called with seq_len_q null (attention.h: every entry's s_q queries); seq_len_q
  /// above must then be s_q for every entry, which the reference uses.
  bool forward_without_seq_len_q = false;
};

/// Outcome of one check. Errors are relative L2 errors; NaN means "not computed".
struct CheckResult {
  std::string spec;       ///< to_string(spec): paste it into `fusedattn run` to reproduce
  std::string reference;  ///< "cpu-f64" or "gpu-f32"
  std::uint64_t seed = 0; ///< the seed actually used (pass it back with --seed to get the same inputs)
  double err_o = std::numeric_limits<double>::quiet_NaN();
  double err_stats = std::numeric_limits<double>::quiet_NaN();
  double err_dq = std::numeric_limits<double>::quiet_NaN();
  double err_dk = std::numeric_limits<double>::quiet_NaN();
  double err_dv = std::numeric_limits<double>::quiet_NaN();
  double err_dbias = std::numeric_limits<double>::quiet_NaN();
  double err_dsink = std::numeric_limits<double>::quiet_NaN();
  double err_max_logit = std::numeric_limits<double>::quiet_NaN();
  double keep_rate = std::numeric_limits<double>::quiet_NaN();  ///< dropout: kept fraction of the visible probabilities
  double keep_rate_sigma = std::numeric_limits<double>::quiet_NaN();  ///< its binomial standard deviation
  double tolerance = 0.0;
  bool backward = false;
  bool passed = false;
  /// One line: spec, reference, seed, each error, tolerance, PASS/FAIL.
  std::string to_string() const;
};

/// Relative L2 tolerance for outputs of `dtype` (DESIGN.md §8): bf16 1e-2, f16 2e-3.
double tolerance_for(DType dtype);

}  // namespace fusedattn::check
