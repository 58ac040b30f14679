// CPU float64 attention reference: the plain definition that every faster path is checked against.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <thread>
#include <vector>

#include "fusedattn/reference.h"
#include "spec/window_rule.h"
#include "problem_check.h"
#include "score_terms.h"

namespace fusedattn {

ReferenceProblem reference_problem(const AttentionSpec& spec, double scale) {
  ReferenceProblem p;
  p.batch = spec.batch();
  p.heads_q = spec.heads_q();
  p.heads_kv = spec.heads_kv();
  p.seq_q = spec.seq_q();
  p.seq_kv = spec.seq_kv();
  p.head_dim_qk = spec.head_dim_qk();
  p.head_dim_v = spec.head_dim_v();
  p.window = spec.window;
  p.alignment = spec.alignment;
  p.bias = spec.bias;
  p.alibi = spec.alibi;
  p.softmax = spec.softmax;
  p.dropout = spec.dropout;
  p.score_mod = spec.score_mod;
  p.scale = scale;
  return p;
}

std::vector<double> alibi_slopes(std::int64_t heads) {
  std::vector<double> slopes;
  for (std::int64_t h = 0; h < heads; ++h) slopes.push_back(detail::alibi_slope(h, heads));
  return slopes;
}

namespace {

std::int64_t entry_len_q(const ReferenceProblem& p, std::int64_t b) {
  return p.seq_len_q.empty() ? p.seq_q : p.seq_len_q[b];
}

// The keys row i of batch entry b sees: the window over the entry's actual lengths, so that the
// entry behaves as it would alone and unpadded; none at all for a padding row.
detail::KeyRange row_keys(const ReferenceProblem& p, std::int64_t b, std::int64_t i) {
  const std::int64_t len_q = entry_len_q(p, b);
  const std::int64_t len_kv = p.seq_len_kv.empty() ? p.seq_kv : p.seq_len_kv[b];
  if (i >= len_q) return {0, -1};
  return detail::visible_keys(p.window.left, p.window.right, p.alignment == Alignment::bottom_right, len_q, len_kv,
                              i);
}

// Start of head h of batch b in a contiguous [b, heads, seq, dim] array.
std::int64_t head_offset(std::int64_t b, std::int64_t h, std::int64_t heads, std::int64_t seq, std::int64_t dim) {
  return ((b * heads + h) * seq) * dim;
}

double dot(const double* a, const double* b, std::int64_t n) {
  double sum = 0.0;
  for (std::int64_t x = 0; x < n; ++x) sum += a[x] * b[x];
  return sum;
}

// y += alpha * x
void axpy(double alpha, const double* x, double* y, std::int64_t n) {
  for (std::int64_t x_i = 0; x_i < n; ++x_i) y[x_i] += alpha * x[x_i];
}

// What a call adds to the plain scaled scores: bias and ALiBi on each logit, and the extra term
// (e^0 or e^sink_h) of the softmax's denominator.
struct ScoreTerms {
  const ReferenceProblem& p;
  const ReferenceExtras<double>& extras;
  detail::BiasIndex bias_at;
  std::vector<double> slopes;
  std::vector<const float*> mod_tensors;

  ScoreTerms(const ReferenceProblem& problem, const ReferenceExtras<double>& e)
      : p(problem), extras(e), bias_at(detail::bias_index(problem)) {
    if (p.alibi) slopes = alibi_slopes(p.heads_q);
    for (const auto& tensor : p.score_mod_tensors) mod_tensors.push_back(tensor.data());
  }
  // The score modifier at (b, h, i, j) of scaled score `score`: its value and its derivative.
  ScoreModValue modified(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j, double score) const {
    if (p.score_mod.empty()) return {score, 1.0};
    ScoreModPoint point;
    point.score = score;
    point.index = {b, h, i, j};
    point.sizes = {p.batch, p.heads_q, p.seq_q, p.seq_kv};
    point.scalars = p.score_mod_scalars.data();
    point.tensors = mod_tensors.data();
    return evaluate_with_derivative(p.score_mod, point);
  }
  // bias[b', h', i', j] + slope_h * (j - i)
  double added(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) const {
    double sum = 0.0;
    if (p.bias != Bias::none) sum += extras.bias[bias_at.at(b, h, i, j)];
    if (p.alibi) sum += slopes[h] * static_cast<double>(j - i);
    return sum;
  }
  bool has_extra() const { return p.softmax != Softmax::vanilla; }
  double extra_logit(std::int64_t h) const { return p.softmax == Softmax::sink ? extras.sink[h] : 0.0; }
};

// Dropout with an explicit keep mask: probability P_ij becomes P_ij * M_ij / (1 - p). Without
// dropout the factor is 1 and the mask is never read.
struct Dropout {
  const double* mask = nullptr;  // [b, h_q, s_q, s_kv]; null without dropout
  double keep_scale = 1.0;       // 1 / (1 - p)
  std::int64_t heads_q, seq_q, seq_kv;

  Dropout(const ReferenceProblem& p, const ReferenceExtras<double>& extras)
      : heads_q(p.heads_q), seq_q(p.seq_q), seq_kv(p.seq_kv) {
    if (p.dropout > 0.0) {
      mask = extras.dropout_mask;
      keep_scale = 1.0 / (1.0 - p.dropout);
    }
  }
  // M_ij / (1 - p) for row i of (b, h); read only for keys the row sees.
  double factor(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) const {
    return mask == nullptr ? 1.0 : mask[((b * heads_q + h) * seq_q + i) * seq_kv + j] * keep_scale;
  }
  // dropped[j] = probs[j] * factor(j) over the keys the row sees, 0 elsewhere.
  void apply(std::int64_t b, std::int64_t h, std::int64_t i, detail::KeyRange keys, const std::vector<double>& probs,
             std::vector<double>& dropped) const {
    std::fill(dropped.begin(), dropped.end(), 0.0);
    for (std::int64_t j = keys.first; j <= keys.last; ++j) dropped[j] = probs[j] * factor(b, h, i, j);
  }
};

struct RowStats {
  double lse;        // log of the full denominator (the extra term included); -inf when it is empty
  double max_logit;  // the largest visible logit; -inf when the row sees no key
};

// Softmax probabilities of query row i (of entry b, head h) against every key of one head (0
// outside `keys`, the keys it sees). A row that sees no key has every probability 0; its lse is
// the extra logit when the softmax has one, -inf otherwise (and always for a padding row).
// Subtracting the row maximum keeps exp() from overflowing however large the scores are.
RowStats softmax_row(const ScoreTerms& terms, std::int64_t b, std::int64_t h, std::int64_t i, const double* q_row,
                     const double* k_head, detail::KeyRange keys, std::vector<double>& probs) {
  const ReferenceProblem& p = terms.p;
  constexpr double inf = std::numeric_limits<double>::infinity();
  RowStats stats{-inf, -inf};
  std::fill(probs.begin(), probs.end(), 0.0);
  if (i >= entry_len_q(p, b)) return stats;  // padding
  for (std::int64_t j = keys.first; j <= keys.last; ++j) {
    const double score = p.scale * dot(q_row, k_head + j * p.head_dim_qk, p.head_dim_qk);
    probs[j] = terms.modified(b, h, i, j, score).value + terms.added(b, h, i, j);
  }
  if (!keys.empty()) stats.max_logit = *std::max_element(probs.begin() + keys.first, probs.begin() + keys.last + 1);
  const double max = terms.has_extra() ? std::max(stats.max_logit, terms.extra_logit(h)) : stats.max_logit;
  if (max == -inf) {  // nothing in the denominator
    std::fill(probs.begin(), probs.end(), 0.0);
    return stats;
  }
  double sum = 0.0;
  for (std::int64_t j = keys.first; j <= keys.last; ++j) {
    probs[j] = std::exp(probs[j] - max);
    sum += probs[j];
  }
  if (terms.has_extra()) sum += std::exp(terms.extra_logit(h) - max);
  for (std::int64_t j = keys.first; j <= keys.last; ++j) probs[j] /= sum;
  stats.lse = max + std::log(sum);
  return stats;
}

// o_row = sum_j probs[j] * v_j
void weighted_values(const ReferenceProblem& p, const std::vector<double>& probs, const double* v_head,
                     double* o_row) {
  std::fill(o_row, o_row + p.head_dim_v, 0.0);
  for (std::int64_t j = 0; j < p.seq_kv; ++j) {
    if (probs[j] != 0.0) axpy(probs[j], v_head + j * p.head_dim_v, o_row, p.head_dim_v);
  }
}

// Runs work(unit) for every unit in [0, units) on the machine's cores. Units write disjoint
// outputs, so the result does not depend on how they are spread over threads.
template <class Work>
void for_each_unit(std::int64_t units, Work&& work) {
  const std::int64_t threads =
      std::min<std::int64_t>(units, std::max(1u, std::thread::hardware_concurrency()));
  if (threads <= 1) {
    for (std::int64_t unit = 0; unit < units; ++unit) work(unit);
    return;
  }
  std::atomic<std::int64_t> next{0};
  auto loop = [&] {
    for (std::int64_t unit; (unit = next.fetch_add(1)) < units;) work(unit);
  };
  std::vector<std::thread> pool;
  for (std::int64_t t = 1; t < threads; ++t) pool.emplace_back(loop);
  loop();
  for (std::thread& thread : pool) thread.join();
}

}  // namespace

bool reference_visible(const ReferenceProblem& p, std::int64_t b, std::int64_t i, std::int64_t j) noexcept {
  return row_keys(p, b, i).contains(j);
}

void reference_forward_cpu(const ReferenceProblem& p, const double* q, const double* k, const double* v,
                           double* o, double* lse, const ReferenceExtras<double>& extras) {
  detail::check_reference_problem(p);
  detail::check_reference_extras(p, extras);
  const ScoreTerms terms(p, extras);
  const Dropout dropout(p, extras);
  const std::int64_t group = p.heads_q / p.heads_kv;
  // One unit per (batch entry, query head): each writes only its own rows of O, lse, max logit.
  for_each_unit(p.batch * p.heads_q, [&](std::int64_t unit) {
    const std::int64_t b = unit / p.heads_q, hq = unit % p.heads_q;
    std::vector<double> probs(static_cast<std::size_t>(p.seq_kv)), dropped(probs.size());
    const std::int64_t hk = hq / group;
    const double* q_head = q + head_offset(b, hq, p.heads_q, p.seq_q, p.head_dim_qk);
    const double* k_head = k + head_offset(b, hk, p.heads_kv, p.seq_kv, p.head_dim_qk);
    const double* v_head = v + head_offset(b, hk, p.heads_kv, p.seq_kv, p.head_dim_v);
    double* o_head = o + head_offset(b, hq, p.heads_q, p.seq_q, p.head_dim_v);
    const std::int64_t stat_head = head_offset(b, hq, p.heads_q, p.seq_q, 1);
    for (std::int64_t i = 0; i < p.seq_q; ++i) {
      const detail::KeyRange keys = row_keys(p, b, i);
      const RowStats stats = softmax_row(terms, b, hq, i, q_head + i * p.head_dim_qk, k_head, keys, probs);
      lse[stat_head + i] = stats.lse;  // from P: dropout does not enter the statistics
      if (extras.max_logit != nullptr) extras.max_logit[stat_head + i] = stats.max_logit;
      dropout.apply(b, hq, i, keys, probs, dropped);
      weighted_values(p, dropped, v_head, o_head + i * p.head_dim_v);
    }
  });
}

void reference_backward_cpu(const ReferenceProblem& p, const double* q, const double* k, const double* v,
                            const double* d_o, double* d_q, double* d_k, double* d_v,
                            const ReferenceExtras<double>& extras) {
  detail::check_reference_problem(p);
  detail::check_reference_extras(p, extras);
  const ScoreTerms terms(p, extras);
  const Dropout dropout(p, extras);
  const std::int64_t group = p.heads_q / p.heads_kv;
  double* d_bias = p.bias != Bias::none ? extras.d_bias : nullptr;
  double* d_sink = p.softmax == Softmax::sink ? extras.d_sink : nullptr;
  // Zeroed first: padding rows and keys, like rows that see nothing, get no contribution at all.
  std::fill(d_q, d_q + p.batch * p.heads_q * p.seq_q * p.head_dim_qk, 0.0);
  std::fill(d_k, d_k + p.batch * p.heads_kv * p.seq_kv * p.head_dim_qk, 0.0);
  std::fill(d_v, d_v + p.batch * p.heads_kv * p.seq_kv * p.head_dim_v, 0.0);
  if (d_bias != nullptr) std::fill(d_bias, d_bias + detail::bias_elements(p), 0.0);
  if (d_sink != nullptr) std::fill(d_sink, d_sink + p.heads_q, 0.0);
  // One unit per (batch entry, K/V head): it alone writes that head's dK, dV and its query heads'
  // dQ. dSink sums over the batch, so each unit keeps its own share and the shares are added in
  // unit order afterwards; a dBias that broadcasts would be shared too, so then one thread runs.
  const std::int64_t units = p.batch * p.heads_kv;
  std::vector<double> sink_shares(d_sink != nullptr ? static_cast<std::size_t>(units * group) : 0, 0.0);
  auto run_unit = [&](std::int64_t unit) {
    const std::int64_t b = unit / p.heads_kv, hk = unit % p.heads_kv;
    std::vector<double> probs(static_cast<std::size_t>(p.seq_kv)), dropped(probs.size());
    std::vector<double> o_row(static_cast<std::size_t>(p.head_dim_v));
    for (std::int64_t hq = hk * group; hq < (hk + 1) * group; ++hq) {
      const std::int64_t q_off = head_offset(b, hq, p.heads_q, p.seq_q, p.head_dim_qk);
      const std::int64_t k_off = head_offset(b, hk, p.heads_kv, p.seq_kv, p.head_dim_qk);
      const std::int64_t v_off = head_offset(b, hk, p.heads_kv, p.seq_kv, p.head_dim_v);
      const std::int64_t o_off = head_offset(b, hq, p.heads_q, p.seq_q, p.head_dim_v);
      for (std::int64_t i = 0; i < p.seq_q; ++i) {
        const double* q_row = q + q_off + i * p.head_dim_qk;
        const double* do_row = d_o + o_off + i * p.head_dim_v;
        double* dq_row = d_q + q_off + i * p.head_dim_qk;
        const detail::KeyRange keys = row_keys(p, b, i);
        const RowStats stats = softmax_row(terms, b, hq, i, q_row, k + k_off, keys, probs);
        if (stats.lse == -std::numeric_limits<double>::infinity()) continue;  // P = 0: no contribution
        dropout.apply(b, hq, i, keys, probs, dropped);
        weighted_values(p, dropped, v + v_off, o_row.data());  // O with dropout
        // D_i = rowsum(dO ∘ O): the softmax Jacobian's correction term for this row (O with dropout,
        // since D_i = sum_j P_ij dL/dP_ij and dL/dP_ij = dP_ij M_ij / (1 - p)).
        const double d_row = dot(do_row, o_row.data(), p.head_dim_v);
        for (std::int64_t j = keys.first; j <= keys.last; ++j) {  // elsewhere P = 0: no contribution
          const double* k_row = k + k_off + j * p.head_dim_qk;
          const double* v_row = v + v_off + j * p.head_dim_v;
          const double d_p = dot(do_row, v_row, p.head_dim_v);
          const double d_s = probs[j] * (d_p * dropout.factor(b, hq, i, j) - d_row);
          // dS before the modifier: times its derivative at this score (1 without one).
          const double d_score =
              p.score_mod.empty()
                  ? d_s
                  : d_s * terms.modified(b, hq, i, j, p.scale * dot(q_row, k_row, p.head_dim_qk)).d_score;
          axpy(p.scale * d_score, k_row, dq_row, p.head_dim_qk);
          axpy(p.scale * d_score, q_row, d_k + k_off + j * p.head_dim_qk, p.head_dim_qk);
          axpy(dropped[j], do_row, d_v + v_off + j * p.head_dim_v, p.head_dim_v);
          if (d_bias != nullptr) d_bias[terms.bias_at.at(b, hq, i, j)] += d_s;  // summed over broadcast dims
        }
        // The sink's probability is P_sink = e^(sink_h - lse_i), and dP_ij/dsink_h = -P_ij P_sink, so
        // dL/dsink_h = -P_sink sum_j P_ij dL/dP_ij = -P_sink D_i (with dropout too: D uses O with it).
        if (d_sink != nullptr) {
          const double share = -std::exp(extras.sink[hq] - stats.lse) * d_row;
          sink_shares[static_cast<std::size_t>(unit * group + hq % group)] += share;
        }
      }
    }
  };
  if (d_bias != nullptr) {
    for (std::int64_t unit = 0; unit < units; ++unit) run_unit(unit);
  } else {
    for_each_unit(units, run_unit);
  }
  for (std::int64_t unit = 0; d_sink != nullptr && unit < units; ++unit) {
    const std::int64_t hk = unit % p.heads_kv;
    for (std::int64_t g = 0; g < group; ++g) {
      d_sink[hk * group + g] += sink_shares[static_cast<std::size_t>(unit * group + g)];
    }
  }
}

}  // namespace fusedattn
