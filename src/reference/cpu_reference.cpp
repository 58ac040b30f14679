// CPU float64 attention reference: the plain definition that every faster path is checked against.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "fusedattn/reference.h"
#include "spec/window_rule.h"
#include "problem_check.h"

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
  p.scale = scale;
  return p;
}

namespace {

// The keys row i of batch entry b sees: the window over the entry's actual lengths, so that the
// entry behaves as it would alone and unpadded; none at all for a padding row.
detail::KeyRange row_keys(const ReferenceProblem& p, std::int64_t b, std::int64_t i) {
  const std::int64_t len_q = p.seq_len_q.empty() ? p.seq_q : p.seq_len_q[b];
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

// Softmax probabilities of one query row against every key of one head (0 outside `keys`, the
// keys it sees); returns the row's log-sum-exp, or -infinity when it sees no key (then every
// probability is 0). Subtracting the row maximum keeps exp() from overflowing however large the
// scores are.
double softmax_row(const ReferenceProblem& p, const double* q_row, const double* k_head, detail::KeyRange keys,
                   std::vector<double>& probs) {
  std::fill(probs.begin(), probs.end(), 0.0);
  if (keys.empty()) return -std::numeric_limits<double>::infinity();
  for (std::int64_t j = keys.first; j <= keys.last; ++j) {
    probs[j] = p.scale * dot(q_row, k_head + j * p.head_dim_qk, p.head_dim_qk);
  }
  const double max = *std::max_element(probs.begin() + keys.first, probs.begin() + keys.last + 1);
  double sum = 0.0;
  for (std::int64_t j = keys.first; j <= keys.last; ++j) {
    probs[j] = std::exp(probs[j] - max);
    sum += probs[j];
  }
  for (std::int64_t j = keys.first; j <= keys.last; ++j) probs[j] /= sum;
  return max + std::log(sum);
}

// o_row = sum_j probs[j] * v_j
void weighted_values(const ReferenceProblem& p, const std::vector<double>& probs, const double* v_head,
                     double* o_row) {
  std::fill(o_row, o_row + p.head_dim_v, 0.0);
  for (std::int64_t j = 0; j < p.seq_kv; ++j) {
    if (probs[j] != 0.0) axpy(probs[j], v_head + j * p.head_dim_v, o_row, p.head_dim_v);
  }
}

}  // namespace

bool reference_visible(const ReferenceProblem& p, std::int64_t b, std::int64_t i, std::int64_t j) noexcept {
  return row_keys(p, b, i).contains(j);
}

void reference_forward_cpu(const ReferenceProblem& p, const double* q, const double* k, const double* v,
                           double* o, double* lse) {
  detail::check_reference_problem(p);
  const std::int64_t group = p.heads_q / p.heads_kv;
  std::vector<double> probs(static_cast<std::size_t>(p.seq_kv));
  for (std::int64_t b = 0; b < p.batch; ++b) {
    for (std::int64_t hq = 0; hq < p.heads_q; ++hq) {
      const std::int64_t hk = hq / group;
      const double* q_head = q + head_offset(b, hq, p.heads_q, p.seq_q, p.head_dim_qk);
      const double* k_head = k + head_offset(b, hk, p.heads_kv, p.seq_kv, p.head_dim_qk);
      const double* v_head = v + head_offset(b, hk, p.heads_kv, p.seq_kv, p.head_dim_v);
      double* o_head = o + head_offset(b, hq, p.heads_q, p.seq_q, p.head_dim_v);
      double* lse_head = lse + head_offset(b, hq, p.heads_q, p.seq_q, 1);
      for (std::int64_t i = 0; i < p.seq_q; ++i) {
        lse_head[i] = softmax_row(p, q_head + i * p.head_dim_qk, k_head, row_keys(p, b, i), probs);
        weighted_values(p, probs, v_head, o_head + i * p.head_dim_v);
      }
    }
  }
}

void reference_backward_cpu(const ReferenceProblem& p, const double* q, const double* k, const double* v,
                            const double* d_o, double* d_q, double* d_k, double* d_v) {
  detail::check_reference_problem(p);
  const std::int64_t group = p.heads_q / p.heads_kv;
  // Zeroed first: padding rows and keys, like rows that see nothing, get no contribution at all.
  std::fill(d_q, d_q + p.batch * p.heads_q * p.seq_q * p.head_dim_qk, 0.0);
  std::fill(d_k, d_k + p.batch * p.heads_kv * p.seq_kv * p.head_dim_qk, 0.0);
  std::fill(d_v, d_v + p.batch * p.heads_kv * p.seq_kv * p.head_dim_v, 0.0);
  std::vector<double> probs(static_cast<std::size_t>(p.seq_kv));
  std::vector<double> o_row(static_cast<std::size_t>(p.head_dim_v));
  for (std::int64_t b = 0; b < p.batch; ++b) {
    for (std::int64_t hq = 0; hq < p.heads_q; ++hq) {
      const std::int64_t hk = hq / group;
      const std::int64_t q_off = head_offset(b, hq, p.heads_q, p.seq_q, p.head_dim_qk);
      const std::int64_t k_off = head_offset(b, hk, p.heads_kv, p.seq_kv, p.head_dim_qk);
      const std::int64_t v_off = head_offset(b, hk, p.heads_kv, p.seq_kv, p.head_dim_v);
      const std::int64_t o_off = head_offset(b, hq, p.heads_q, p.seq_q, p.head_dim_v);
      for (std::int64_t i = 0; i < p.seq_q; ++i) {
        const double* q_row = q + q_off + i * p.head_dim_qk;
        const double* do_row = d_o + o_off + i * p.head_dim_v;
        double* dq_row = d_q + q_off + i * p.head_dim_qk;
        const detail::KeyRange keys = row_keys(p, b, i);
        softmax_row(p, q_row, k + k_off, keys, probs);
        weighted_values(p, probs, v + v_off, o_row.data());
        // D_i = rowsum(dO ∘ O): the softmax Jacobian's correction term for this row.
        const double d_row = dot(do_row, o_row.data(), p.head_dim_v);
        for (std::int64_t j = keys.first; j <= keys.last; ++j) {  // elsewhere P = 0: no contribution
          const double* k_row = k + k_off + j * p.head_dim_qk;
          const double* v_row = v + v_off + j * p.head_dim_v;
          const double d_p = dot(do_row, v_row, p.head_dim_v);
          const double d_s = probs[j] * (d_p - d_row);
          axpy(p.scale * d_s, k_row, dq_row, p.head_dim_qk);
          axpy(p.scale * d_s, q_row, d_k + k_off + j * p.head_dim_qk, p.head_dim_qk);
          axpy(probs[j], do_row, d_v + v_off + j * p.head_dim_v, p.head_dim_v);
        }
      }
    }
  }
}

}  // namespace fusedattn
