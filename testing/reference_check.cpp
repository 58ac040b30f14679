// testing/reference_check.cpp — check_against_reference: fresh inputs, poisoned outputs, one
// fusedattn call each way, and every output compared with the reference.
#include "testing/reference_check.h"

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "fusedattn/errors.h"
#include "fusedattn/reference.h"
#include "testing/attention_buffers.h"
#include "testing/check_outputs.h"
#include "testing/twins.h"

namespace fusedattn::check {
namespace {

std::string with_spec(const std::string& what, const AttentionSpec& spec) {
  return what + " [spec: " + to_string(spec) + "]";
}

template <class R>
double error_of(const std::vector<float>& out, const std::vector<R>& ref) {
  if (out.size() != ref.size()) return std::numeric_limits<double>::infinity();
  return relative_error<float, R>(out.data(), ref.data(), static_cast<std::int64_t>(out.size()));
}

// Rows that see no key have lse = -inf in the reference; what a kernel writes there is not
// defined by the math, so only rows with a finite reference are compared. A non-finite value
// where the reference is finite still counts (relative_error makes it infinite).
template <class R>
double stats_error(const std::vector<float>& out, const std::vector<R>& ref) {
  if (out.size() != ref.size()) return std::numeric_limits<double>::infinity();
  std::vector<float> kept_out;
  std::vector<R> kept_ref;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(static_cast<double>(ref[i]))) continue;
    kept_out.push_back(out[i]);
    kept_ref.push_back(ref[i]);
  }
  if (kept_ref.empty()) return 0.0;
  return error_of(kept_out, kept_ref);
}

template <class R>
void compare(const CheckProblem& p, const Outputs<float>& out, const Outputs<R>& ref, CheckResult* result) {
  result->err_o = error_of(out.o, ref.o);
  if (p.spec.stats) result->err_stats = stats_error(out.lse, ref.lse);
  if (p.spec.max_logit != MaxLogit::none) result->err_max_logit = error_of(out.max_logit, ref.max_logit);
  if (p.options.backward) {
    result->err_dq = error_of(out.dq, ref.dq);
    result->err_dk = error_of(out.dk, ref.dk);
    result->err_dv = error_of(out.dv, ref.dv);
    if (p.spec.bias_grad) result->err_dbias = error_of(out.dbias, ref.dbias);
    if (p.spec.softmax == Softmax::sink) result->err_dsink = error_of(out.dsink, ref.dsink);
  }
}

// The kept fraction over the entries that were drawn for a probability that exists: visible keys
// of valid rows (elsewhere the mask's value does not matter and is not counted).
void keep_rate(const CheckProblem& p, const std::vector<float>& mask, CheckResult* result) {
  const AttentionSpec& s = p.spec;
  double kept = 0.0, drawn = 0.0;
  for (std::int64_t b = 0; b < s.batch(); ++b) {
    for (std::int64_t h = 0; h < s.heads_q(); ++h) {
      for (std::int64_t i = 0; i < s.seq_q(); ++i) {
        for (std::int64_t j = 0; j < s.seq_kv(); ++j) {
          if (!reference_visible(p.ref, b, i, j)) continue;
          kept += mask[static_cast<std::size_t>(((b * s.heads_q() + h) * s.seq_q() + i) * s.seq_kv() + j)];
          drawn += 1.0;
        }
      }
    }
  }
  result->keep_rate = drawn > 0 ? kept / drawn : std::numeric_limits<double>::quiet_NaN();
  result->keep_rate_sigma = drawn > 0 ? std::sqrt(s.dropout * (1.0 - s.dropout) / drawn) : 0.0;
}

std::uint64_t fresh_seed() {
  std::random_device device;
  std::uint64_t seed = (static_cast<std::uint64_t>(device()) << 32) ^ device();
  return seed == 0 ? 1 : seed;  // 0 means "draw one", so never report it as the seed used
}

// CPU float64 up to ~3e8 multiply-adds per forward (a second or two with the backward);
// beyond that the float32 GPU reference.
// Score-modified specs go up to 1.6e9 (the GPU reference applies no modifier), so that long causal
// shapes (2048 rows and more, where most tiles lie past the band cuDNN skips) are checked too.
bool use_cpu_reference(const AttentionSpec& spec) {
  const double work = static_cast<double>(spec.batch()) * spec.heads_q() * spec.seq_q() * spec.seq_kv() *
                      static_cast<double>(spec.head_dim_qk() + spec.head_dim_v());
  return work <= (spec.score_mod.empty() ? 3e8 : 1.6e9);
}

// A forward called without seq_len_q runs every entry's s_q queries: the reference must too.
void require_full_query_rows(const AttentionSpec& spec, const std::vector<std::int32_t>& seq_len_q) {
  if (!spec.padding || spec.ragged_q() || spec.ragged_kv()) {
    throw InvalidArgument("options.forward_without_seq_len_q", "set", "a padded dense spec (padding=1, not thd)");
  }
  for (std::int32_t length : seq_len_q) {
    if (length != spec.seq_q()) {
      const std::string s_q = std::to_string(spec.seq_q());
      throw InvalidArgument("options.seq_len_q", std::to_string(length),
                            "s_q (" + s_q + ") for every entry, with forward_without_seq_len_q");
    }
  }
}

}  // namespace

CheckResult check_against_reference(const AttentionSpec& spec, const CheckOptions& options) {
  validate(spec);
  CheckProblem p;
  p.spec = spec;
  if (options.backward) p.spec.stats = true;  // the backward consumes the forward's statistics
  // With dropout the forward also hands back the mask it drew, so the reference applies exactly
  // that one; the backward must regenerate the same mask from the same seed and offset.
  if (spec.dropout > 0.0) p.spec.dropout_mask_out = true;
  p.run_spec = p.spec;
  const bool ragged = spec.ragged_q() || spec.ragged_kv();
  p.spec = paged_twin(ragged_twin(p.spec));
  p.options = options;
  if (p.options.seed == 0) p.options.seed = fresh_seed();
  p.scale = std::isnan(options.scale) ? static_cast<double>(default_scale(spec)) : options.scale;
  p.ref = reference_problem(p.spec, p.scale);
  p.ref.dropout = p.spec.dropout;

  CheckResult result;
  result.spec = to_string(p.run_spec);
  result.seed = p.options.seed;
  result.backward = options.backward;
  result.tolerance = tolerance_for(spec.q.dtype);
  result.reference = use_cpu_reference(spec) ? "cpu-f64" : "gpu-f32";
  if (!spec.score_mod.empty() && result.reference != "cpu-f64") {
    throw InvalidArgument("score_mod", to_string(spec.score_mod),
                          "a problem small enough for the CPU reference (at most ~1.6e9 multiply-adds per forward), "
                          "the one that applies score modifiers");
  }

  try {
    AttentionBuffers buffers(p.spec, options.backward);
    buffers.fill_inputs(p.options.seed);
    if (!options.score_mod_scalars.empty()) buffers.set_score_mod_scalars(options.score_mod_scalars);
    if (!options.seq_len_kv.empty()) buffers.set_lengths(options.seq_len_q, options.seq_len_kv);
    if (options.forward_without_seq_len_q) require_full_query_rows(p.run_spec, buffers.seq_len_q());
    p.ref.score_mod_scalars = buffers.score_mod_scalars();
    p.ref.score_mod_tensors = buffers.score_mod_tensors();
    if (ragged) set_ragged_lengths(p.run_spec, buffers);
    p.ref.seq_len_q.assign(buffers.seq_len_q().begin(), buffers.seq_len_q().end());
    p.ref.seq_len_kv.assign(buffers.seq_len_kv().begin(), buffers.seq_len_kv().end());
    buffers.poison_outputs();
    const Outputs<float> out = run_fusedattn(p, buffers);
    if (p.spec.dropout > 0.0) keep_rate(p, out.dropout_mask, &result);
    if (result.reference == "cpu-f64") {
      compare(p, out, reference_cpu(p, buffers, out.dropout_mask), &result);
    } else {
      compare(p, out, reference_gpu(p, buffers), &result);
    }
  } catch (const CudaError& error) {
    throw CudaError(with_spec(error.what(), p.spec));
  }

  // An error that was computed must be <= tolerance; NaN compares false, so it never passes.
  auto ok = [&](double err, bool computed) { return !computed || err <= result.tolerance; };
  const bool sink_grad = options.backward && p.spec.softmax == Softmax::sink;
  // The kept fraction centres on 1 - p, but cuDNN's draws are not independent: its masks correlate
  // between tiles 128 rows or keys apart (up to +-0.15, H200, cuDNN 9.19), and over 60 seeds per
  // configuration the fraction spread 1.9-2.0 times the binomial standard deviation. Five binomial
  // sigmas were thus 2.5 real ones, and about one check in a hundred failed on a correct mask; five
  // of the measured spread still refuse any rate that is off by a sizeable part of p.
  constexpr double kDrawSpread = 2.0;  // measured spread / binomial standard deviation
  const bool keep_rate_ok = p.spec.dropout == 0.0 || std::abs(result.keep_rate - (1.0 - p.spec.dropout)) <=
                                                         5.0 * kDrawSpread * result.keep_rate_sigma;
  result.passed = ok(result.err_o, true) && ok(result.err_stats, p.spec.stats) &&
                  ok(result.err_max_logit, p.spec.max_logit != MaxLogit::none) &&
                  ok(result.err_dq, options.backward) && ok(result.err_dk, options.backward) &&
                  ok(result.err_dv, options.backward) && ok(result.err_dbias, options.backward && p.spec.bias_grad) &&
                  ok(result.err_dsink, sink_grad) && keep_rate_ok;
  return result;
}

}  // namespace fusedattn::check
