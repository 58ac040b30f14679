// CPU tier: the float64 reference against closed forms, finite differences and itself unpadded, and the host helpers.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <optional>
#include <vector>

#include <gtest/gtest.h>

#include "fusedattn/errors.h"
#include "fusedattn/reference.h"

namespace fusedattn {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Fresh inputs on every run; the seed is printed with any failure so it can be replayed.
struct Rng {
  unsigned seed = std::random_device{}();
  std::mt19937 engine{seed};
  std::string trace() const { return "random seed " + std::to_string(seed); }
  std::vector<double> normal(std::int64_t n) {
    std::normal_distribution<double> dist(0.0, 1.0);
    std::vector<double> out(static_cast<std::size_t>(n));
    for (double& x : out) x = dist(engine);
    return out;
  }
};

ReferenceProblem make_problem(std::int64_t heads_q, std::int64_t heads_kv, std::int64_t seq_q, std::int64_t seq_kv,
                              std::int64_t d_qk, std::int64_t d_v, Window window = {},
                              Alignment alignment = Alignment::top_left) {
  ReferenceProblem p;
  p.batch = 1;
  p.heads_q = heads_q;
  p.heads_kv = heads_kv;
  p.seq_q = seq_q;
  p.seq_kv = seq_kv;
  p.head_dim_qk = d_qk;
  p.head_dim_v = d_v;
  p.window = window;
  p.alignment = alignment;
  p.scale = 1.0 / std::sqrt(static_cast<double>(d_qk));
  return p;
}

std::string describe(const ReferenceProblem& p) {
  return "b=" + std::to_string(p.batch) + " h_q=" + std::to_string(p.heads_q) + " h_kv=" + std::to_string(p.heads_kv) +
         " s_q=" + std::to_string(p.seq_q) + " s_kv=" + std::to_string(p.seq_kv) +
         " d_qk=" + std::to_string(p.head_dim_qk) + " d_v=" + std::to_string(p.head_dim_v) +
         " window=" + to_string(p.window) +
         (p.alignment == Alignment::top_left ? " top_left" : " bottom_right");
}

std::int64_t q_size(const ReferenceProblem& p) { return p.batch * p.heads_q * p.seq_q * p.head_dim_qk; }
std::int64_t k_size(const ReferenceProblem& p) { return p.batch * p.heads_kv * p.seq_kv * p.head_dim_qk; }
std::int64_t v_size(const ReferenceProblem& p) { return p.batch * p.heads_kv * p.seq_kv * p.head_dim_v; }
std::int64_t o_size(const ReferenceProblem& p) { return p.batch * p.heads_q * p.seq_q * p.head_dim_v; }
std::int64_t lse_size(const ReferenceProblem& p) { return p.batch * p.heads_q * p.seq_q; }

// Whether row i sees key j, written independently of reference_visible: the key is tested against
// the band around the row's diagonal position.
bool sees(const ReferenceProblem& p, std::int64_t i, std::int64_t j) {
  const std::int64_t diagonal = p.alignment == Alignment::bottom_right ? i + p.seq_kv - p.seq_q : i;
  const bool left_ok = p.window.left < 0 || j > diagonal - p.window.left;
  const bool right_ok = p.window.right < 0 || j <= diagonal + p.window.right;
  return left_ok && right_ok;
}

std::int64_t visible_count(const ReferenceProblem& p, std::int64_t i) {
  std::int64_t count = 0;
  for (std::int64_t j = 0; j < p.seq_kv; ++j) count += sees(p, i, j);
  return count;
}

struct Forward {
  std::vector<double> o, lse;
};

Forward run_forward(const ReferenceProblem& p, const std::vector<double>& q, const std::vector<double>& k,
                    const std::vector<double>& v) {
  Forward f{std::vector<double>(static_cast<std::size_t>(o_size(p))),
            std::vector<double>(static_cast<std::size_t>(lse_size(p)))};
  reference_forward_cpu(p, q.data(), k.data(), v.data(), f.o.data(), f.lse.data());
  return f;
}

// The three mask settings, each on a shape where s_q < s_kv and one where s_q > s_kv.
std::vector<ReferenceProblem> mask_problems() {
  std::vector<ReferenceProblem> out;
  for (auto [s_q, s_kv] : {std::pair<int, int>{4, 6}, std::pair<int, int>{6, 4}}) {
    out.push_back(make_problem(2, 1, s_q, s_kv, 8, 16));
    out.push_back(make_problem(2, 1, s_q, s_kv, 8, 16, kCausal, Alignment::top_left));
    out.push_back(make_problem(2, 1, s_q, s_kv, 8, 16, kCausal, Alignment::bottom_right));
    out.push_back(make_problem(2, 1, s_q, s_kv, 8, 16, Window{2, 0}, Alignment::top_left));
    out.push_back(make_problem(2, 1, s_q, s_kv, 8, 16, Window{3, 1}, Alignment::bottom_right));
    out.push_back(make_problem(2, 1, s_q, s_kv, 8, 16, Window{2, -1}, Alignment::top_left));
  }
  return out;
}

// --- problem and mask ---------------------------------------------------------------------------

TEST(ReferenceProblem, CopiesEverySizeAndOptionFromTheSpec) {
  AttentionSpec spec;
  spec.q.dims = {2, 8, 100, 192};
  spec.k.dims = {2, 2, 120, 192};
  spec.v.dims = {2, 2, 120, 128};
  spec.o.dims = {2, 8, 100, 128};
  spec.window = Window{64, 3};
  spec.alignment = Alignment::bottom_right;
  spec.bias = Bias::b1ss;
  spec.alibi = true;
  spec.softmax = Softmax::sink;
  spec.dropout = 0.2;
  const ReferenceProblem p = reference_problem(spec, 0.3);
  EXPECT_EQ(p.batch, 2);
  EXPECT_EQ(p.heads_q, 8);
  EXPECT_EQ(p.heads_kv, 2);
  EXPECT_EQ(p.seq_q, 100);
  EXPECT_EQ(p.seq_kv, 120);
  EXPECT_EQ(p.head_dim_qk, 192);
  EXPECT_EQ(p.head_dim_v, 128);
  EXPECT_EQ(p.window, (Window{64, 3}));
  EXPECT_EQ(p.bias, Bias::b1ss);
  EXPECT_TRUE(p.alibi);
  EXPECT_EQ(p.softmax, Softmax::sink);
  EXPECT_EQ(p.dropout, 0.2);
  EXPECT_EQ(p.alignment, Alignment::bottom_right);
  EXPECT_EQ(p.scale, 0.3);
}

std::vector<std::int64_t> row_counts(const ReferenceProblem& p) {
  std::vector<std::int64_t> counts;
  for (std::int64_t i = 0; i < p.seq_q; ++i) {
    std::int64_t n = 0;
    for (std::int64_t j = 0; j < p.seq_kv; ++j) n += reference_visible(p, 0, i, j) ? 1 : 0;
    counts.push_back(n);
  }
  return counts;
}

TEST(ReferenceMask, VisibleKeysPerRow) {
  using V = std::vector<std::int64_t>;
  EXPECT_EQ(row_counts(make_problem(1, 1, 3, 5, 8, 8)), (V{5, 5, 5}));
  EXPECT_EQ(row_counts(make_problem(1, 1, 3, 5, 8, 8, kCausal, Alignment::top_left)), (V{1, 2, 3}));
  EXPECT_EQ(row_counts(make_problem(1, 1, 3, 5, 8, 8, kCausal, Alignment::bottom_right)), (V{3, 4, 5}));
  EXPECT_EQ(row_counts(make_problem(1, 1, 5, 3, 8, 8, kCausal, Alignment::top_left)), (V{1, 2, 3, 3, 3}));
  EXPECT_EQ(row_counts(make_problem(1, 1, 5, 3, 8, 8, kCausal, Alignment::bottom_right)), (V{0, 0, 1, 2, 3}));
  // Square: both alignments are the same lower triangle.
  EXPECT_EQ(row_counts(make_problem(1, 1, 4, 4, 8, 8, kCausal, Alignment::top_left)), (V{1, 2, 3, 4}));
  EXPECT_EQ(row_counts(make_problem(1, 1, 4, 4, 8, 8, kCausal, Alignment::bottom_right)), (V{1, 2, 3, 4}));
  // Sliding windows: `left` keys up to the diagonal, plus `right` keys past it.
  EXPECT_EQ(row_counts(make_problem(1, 1, 4, 6, 8, 8, Window{2, 0}, Alignment::top_left)), (V{1, 2, 2, 2}));
  EXPECT_EQ(row_counts(make_problem(1, 1, 4, 6, 8, 8, Window{2, 0}, Alignment::bottom_right)), (V{2, 2, 2, 2}));
  EXPECT_EQ(row_counts(make_problem(1, 1, 4, 6, 8, 8, Window{2, 1}, Alignment::top_left)), (V{2, 3, 3, 3}));
  EXPECT_EQ(row_counts(make_problem(1, 1, 4, 6, 8, 8, Window{-1, 1}, Alignment::bottom_right)), (V{4, 5, 6, 6}));
  EXPECT_EQ(row_counts(make_problem(1, 1, 4, 6, 8, 8, Window{3, -1}, Alignment::top_left)), (V{6, 6, 6, 5}));
}

TEST(ReferenceMask, VisibleSetIsTheBandAroundTheDiagonal) {
  for (const ReferenceProblem& p : mask_problems()) {
    SCOPED_TRACE(describe(p));
    for (std::int64_t i = 0; i < p.seq_q; ++i) {
      for (std::int64_t j = 0; j < p.seq_kv; ++j) {
        EXPECT_EQ(reference_visible(p, 0, i, j), sees(p, i, j)) << "i=" << i << " j=" << j;
      }
    }
  }
}

// Per-entry lengths: padding rows see nothing, padding keys are never seen, and bottom-right aligns
// the diagonal to the entry's own lengths (p = i + len_kv - len_q), not to the padded sizes.
TEST(ReferenceMask, PaddedEntriesUseTheirOwnLengths) {
  using V = std::vector<std::int64_t>;
  const auto counts = [](ReferenceProblem p, std::int64_t b) {
    p.batch = 3;
    p.seq_len_q = {3, 5, 0};
    p.seq_len_kv = {4, 6, 6};
    V out;
    for (std::int64_t i = 0; i < p.seq_q; ++i) {
      std::int64_t n = 0;
      for (std::int64_t j = 0; j < p.seq_kv; ++j) n += reference_visible(p, b, i, j) ? 1 : 0;
      out.push_back(n);
    }
    return out;
  };
  const ReferenceProblem none = make_problem(1, 1, 5, 6, 8, 8);
  const ReferenceProblem causal_br = make_problem(1, 1, 5, 6, 8, 8, kCausal, Alignment::bottom_right);
  const ReferenceProblem causal_tl = make_problem(1, 1, 5, 6, 8, 8, kCausal, Alignment::top_left);
  EXPECT_EQ(counts(none, 0), (V{4, 4, 4, 0, 0}));
  EXPECT_EQ(counts(causal_br, 0), (V{2, 3, 4, 0, 0}));
  EXPECT_EQ(counts(causal_tl, 0), (V{1, 2, 3, 0, 0}));
  EXPECT_EQ(counts(causal_br, 1), (V{2, 3, 4, 5, 6}));
  EXPECT_EQ(counts(causal_br, 2), (V{0, 0, 0, 0, 0}));
}

TEST(ReferenceCpu, RejectsHeadsThatDoNotGroup) {
  ReferenceProblem p = make_problem(3, 2, 2, 2, 8, 8);
  std::vector<double> buf(1024);
  try {
    reference_forward_cpu(p, buf.data(), buf.data(), buf.data(), buf.data(), buf.data());
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(e.field(), "heads_q");
    EXPECT_EQ(e.value(), "3");
  }
}

// --- forward against closed forms ------------------------------------------------------------

// With every key equal, every visible score is the same, so softmax is uniform over the visible
// keys: o is their mean, lse = score + log(count). Rows that see nothing give o = 0, lse = -inf.
TEST(ReferenceCpu, EqualKeysAverageTheVisibleValues) {
  Rng rng;
  SCOPED_TRACE(rng.trace());
  for (const ReferenceProblem& p : mask_problems()) {
    SCOPED_TRACE(describe(p));
    const std::vector<double> q = rng.normal(q_size(p)), v = rng.normal(v_size(p)), key = rng.normal(p.head_dim_qk);
    std::vector<double> k;
    for (std::int64_t j = 0; j < p.seq_kv; ++j) k.insert(k.end(), key.begin(), key.end());
    const Forward f = run_forward(p, q, k, v);
    for (std::int64_t h = 0; h < p.heads_q; ++h) {
      for (std::int64_t i = 0; i < p.seq_q; ++i) {
        const std::int64_t row = h * p.seq_q + i, count = visible_count(p, i);
        double score = 0.0;
        for (std::int64_t d = 0; d < p.head_dim_qk; ++d) score += q[row * p.head_dim_qk + d] * key[d];
        score *= p.scale;
        if (count == 0) {
          EXPECT_EQ(f.lse[row], -kInf) << "row " << i;
        } else {
          EXPECT_NEAR(f.lse[row], score + std::log(static_cast<double>(count)), 1e-12) << "row " << i;
        }
        for (std::int64_t d = 0; d < p.head_dim_v; ++d) {
          double mean = 0.0;
          for (std::int64_t j = 0; j < p.seq_kv; ++j) {
            if (sees(p, i, j)) mean += v[j * p.head_dim_v + d];  // one kv head
          }
          mean = count == 0 ? 0.0 : mean / static_cast<double>(count);
          EXPECT_NEAR(f.o[row * p.head_dim_v + d], mean, 1e-12) << "row " << i << " dim " << d;
        }
      }
    }
  }
}

// A zero query scores 0 against every key: lse = log(#visible), o = mean of visible values.
TEST(ReferenceCpu, ZeroQueryGivesLogOfVisibleCount) {
  Rng rng;
  SCOPED_TRACE(rng.trace());
  for (const ReferenceProblem& p : mask_problems()) {
    SCOPED_TRACE(describe(p));
    const std::vector<double> q(static_cast<std::size_t>(q_size(p)), 0.0);
    const Forward f = run_forward(p, q, rng.normal(k_size(p)), rng.normal(v_size(p)));
    for (std::int64_t h = 0; h < p.heads_q; ++h) {
      for (std::int64_t i = 0; i < p.seq_q; ++i) {
        const std::int64_t count = visible_count(p, i);
        const double expected = count == 0 ? -kInf : std::log(static_cast<double>(count));
        EXPECT_DOUBLE_EQ(f.lse[h * p.seq_q + i], expected) << "head " << h << " row " << i;
      }
    }
  }
}

// When exactly one key is visible its probability is exactly 1, so o is exactly that value row.
TEST(ReferenceCpu, SingleVisibleKeyCopiesItsValueRow) {
  Rng rng;
  SCOPED_TRACE(rng.trace());
  struct Case {
    ReferenceProblem p;
    std::int64_t row;  // the row that sees only key 0
  };
  const std::vector<Case> cases = {
      {make_problem(1, 1, 3, 1, 8, 16), 0},
      {make_problem(1, 1, 3, 1, 8, 16), 2},
      {make_problem(1, 1, 4, 6, 8, 16, kCausal, Alignment::top_left), 0},
      {make_problem(1, 1, 5, 3, 8, 16, kCausal, Alignment::bottom_right), 2},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(describe(c.p) + " row " + std::to_string(c.row));
    const std::vector<double> q = rng.normal(q_size(c.p)), k = rng.normal(k_size(c.p)), v = rng.normal(v_size(c.p));
    const Forward f = run_forward(c.p, q, k, v);
    for (std::int64_t d = 0; d < c.p.head_dim_v; ++d) EXPECT_EQ(f.o[c.row * c.p.head_dim_v + d], v[d]) << "dim " << d;
    double score = 0.0;
    for (std::int64_t d = 0; d < c.p.head_dim_qk; ++d) score += q[c.row * c.p.head_dim_qk + d] * k[d];
    EXPECT_NEAR(f.lse[c.row], c.p.scale * score, 1e-12);
  }
}

// Softmax must not overflow when scores are huge: the row maximum is subtracted first.
TEST(ReferenceCpu, LargeScoresStayFinite) {
  ReferenceProblem p = make_problem(1, 1, 1, 2, 8, 8);
  p.scale = 1.0;
  std::vector<double> q(8, 0.0), k(16, 0.0), v(16, 0.0);
  q[0] = 1000.0;
  k[0] = 1.0;        // key 0 scores 1000
  k[8] = 1.0 - 1e-3;  // key 1 scores 999
  v[0] = 1.0;
  v[8] = -1.0;
  const Forward f = run_forward(p, q, k, v);
  const double p0 = 1.0 / (1.0 + std::exp(-1.0));
  EXPECT_NEAR(f.o[0], p0 - (1.0 - p0), 1e-12);
  EXPECT_NEAR(f.lse[0], 1000.0 + std::log(1.0 + std::exp(-1.0)), 1e-9);
}

// K/V heads repeated for each query head of a group (MHA) must give exactly the GQA answer.
std::vector<double> repeat_heads(const std::vector<double>& kv, std::int64_t heads_kv, std::int64_t group,
                                 std::int64_t head_elems) {
  std::vector<double> out;
  for (std::int64_t h = 0; h < heads_kv; ++h) {
    for (std::int64_t g = 0; g < group; ++g) {
      out.insert(out.end(), kv.begin() + h * head_elems, kv.begin() + (h + 1) * head_elems);
    }
  }
  return out;
}

TEST(ReferenceCpu, GroupedQueryEqualsRepeatedHeads) {
  Rng rng;
  SCOPED_TRACE(rng.trace());
  for (std::int64_t heads_kv : {1, 2}) {  // MQA and GQA
    const ReferenceProblem gqa = make_problem(4, heads_kv, 5, 7, 16, 8, kCausal, Alignment::bottom_right);
    ReferenceProblem mha = gqa;
    mha.heads_kv = 4;
    SCOPED_TRACE(describe(gqa));
    const std::int64_t group = 4 / heads_kv;
    const std::vector<double> q = rng.normal(q_size(gqa)), k = rng.normal(k_size(gqa)), v = rng.normal(v_size(gqa));
    const std::vector<double> k_rep = repeat_heads(k, heads_kv, group, gqa.seq_kv * gqa.head_dim_qk);
    const std::vector<double> v_rep = repeat_heads(v, heads_kv, group, gqa.seq_kv * gqa.head_dim_v);
    const Forward a = run_forward(gqa, q, k, v), b = run_forward(mha, q, k_rep, v_rep);
    EXPECT_EQ(a.o, b.o);
    EXPECT_EQ(a.lse, b.lse);

    // Backward: dQ is the same; dK/dV of a shared head are the sums over the repeated copies.
    const std::vector<double> d_o = rng.normal(o_size(gqa));
    std::vector<double> dq_a(q.size()), dk_a(k.size()), dv_a(v.size());
    std::vector<double> dq_b(q.size()), dk_b(k_rep.size()), dv_b(v_rep.size());
    reference_backward_cpu(gqa, q.data(), k.data(), v.data(), d_o.data(), dq_a.data(), dk_a.data(), dv_a.data());
    reference_backward_cpu(mha, q.data(), k_rep.data(), v_rep.data(), d_o.data(), dq_b.data(), dk_b.data(),
                           dv_b.data());
    EXPECT_EQ(dq_a, dq_b);
    const auto fold = [&](const std::vector<double>& repeated, std::int64_t head_elems) {
      std::vector<double> out(static_cast<std::size_t>(heads_kv * head_elems), 0.0);
      for (std::int64_t h = 0; h < 4; ++h) {
        for (std::int64_t x = 0; x < head_elems; ++x) out[(h / group) * head_elems + x] += repeated[h * head_elems + x];
      }
      return out;
    };
    EXPECT_LT(relative_error(dk_a.data(), fold(dk_b, gqa.seq_kv * gqa.head_dim_qk).data(), k_size(gqa)), 1e-14);
    EXPECT_LT(relative_error(dv_a.data(), fold(dv_b, gqa.seq_kv * gqa.head_dim_v).data(), v_size(gqa)), 1e-14);
  }
}

// --- backward against finite differences --------------------------------------------------------

// L = sum(O ∘ dO), whose gradients reference_backward_cpu computes.
double loss(const ReferenceProblem& p, const std::vector<double>& q, const std::vector<double>& k,
            const std::vector<double>& v, const std::vector<double>& d_o) {
  const Forward f = run_forward(p, q, k, v);
  double sum = 0.0;
  for (std::size_t x = 0; x < f.o.size(); ++x) sum += f.o[x] * d_o[x];
  return sum;
}

// Central differences of L with respect to every element of `x` (one of q, k, v).
std::vector<double> numeric_gradient(std::vector<double>& x, const std::function<double()>& eval) {
  const double eps = 1e-6;
  std::vector<double> grad(x.size());
  for (std::size_t n = 0; n < x.size(); ++n) {
    const double saved = x[n];
    x[n] = saved + eps;
    const double up = eval();
    x[n] = saved - eps;
    const double down = eval();
    x[n] = saved;
    grad[n] = (up - down) / (2 * eps);
  }
  return grad;
}

std::vector<ReferenceProblem> backward_problems() {
  std::vector<ReferenceProblem> out;
  for (auto [s_q, s_kv] : {std::pair<int, int>{3, 5}, std::pair<int, int>{5, 3}}) {
    out.push_back(make_problem(4, 2, s_q, s_kv, 16, 8));
    out.push_back(make_problem(4, 2, s_q, s_kv, 16, 8, kCausal, Alignment::top_left));
    out.push_back(make_problem(4, 2, s_q, s_kv, 16, 8, kCausal, Alignment::bottom_right));
  }
  ReferenceProblem mqa_batched = make_problem(2, 1, 4, 4, 8, 16, kCausal, Alignment::top_left);
  mqa_batched.batch = 2;
  mqa_batched.scale = 0.7;  // not 1/sqrt(d): the scale must really be applied
  out.push_back(mqa_batched);
  return out;
}

// dQ, dK, dV of the reference against central differences of L, on fresh inputs.
void expect_gradients_match_differences(const ReferenceProblem& p, Rng& rng) {
  std::vector<double> q = rng.normal(q_size(p)), k = rng.normal(k_size(p)), v = rng.normal(v_size(p));
  const std::vector<double> d_o = rng.normal(o_size(p));
  std::vector<double> d_q(q.size()), d_k(k.size()), d_v(v.size());
  reference_backward_cpu(p, q.data(), k.data(), v.data(), d_o.data(), d_q.data(), d_k.data(), d_v.data());
  const auto eval = [&] { return loss(p, q, k, v, d_o); };
  const std::vector<double> num_q = numeric_gradient(q, eval);
  const std::vector<double> num_k = numeric_gradient(k, eval);
  const std::vector<double> num_v = numeric_gradient(v, eval);
  EXPECT_LT(relative_error(d_q.data(), num_q.data(), q_size(p)), 1e-6) << "dQ";
  EXPECT_LT(relative_error(d_k.data(), num_k.data(), k_size(p)), 1e-6) << "dK";
  EXPECT_LT(relative_error(d_v.data(), num_v.data(), v_size(p)), 1e-6) << "dV";
}

TEST(ReferenceBackward, MatchesFiniteDifferences) {
  Rng rng;
  SCOPED_TRACE(rng.trace());
  for (const ReferenceProblem& p : backward_problems()) {
    SCOPED_TRACE(describe(p));
    expect_gradients_match_differences(p, rng);
  }
}

// Bottom-right with s_q > s_kv: the first s_q - s_kv rows see nothing and get exactly zero dQ. So
// does a row that sees a single key: its softmax is the constant 1, whatever the scores.
TEST(ReferenceBackward, FullyMaskedRowsGetZeroGradient) {
  Rng rng;
  SCOPED_TRACE(rng.trace());
  const ReferenceProblem p = make_problem(2, 1, 6, 3, 8, 8, kCausal, Alignment::bottom_right);
  const std::vector<double> q = rng.normal(q_size(p)), k = rng.normal(k_size(p)), v = rng.normal(v_size(p));
  const std::vector<double> d_o = rng.normal(o_size(p));
  std::vector<double> d_q(q.size(), 42.0), d_k(k.size(), 42.0), d_v(v.size(), 42.0);  // must be overwritten
  reference_backward_cpu(p, q.data(), k.data(), v.data(), d_o.data(), d_q.data(), d_k.data(), d_v.data());
  for (std::int64_t h = 0; h < p.heads_q; ++h) {
    for (std::int64_t i = 0; i < p.seq_q; ++i) {
      double norm = 0.0;
      for (std::int64_t d = 0; d < p.head_dim_qk; ++d) norm += std::abs(d_q[(h * p.seq_q + i) * p.head_dim_qk + d]);
      if (visible_count(p, i) <= 1) {
        EXPECT_EQ(norm, 0.0) << "head " << h << " row " << i;
      } else {
        EXPECT_GT(norm, 0.0) << "head " << h << " row " << i;
      }
    }
  }
  const Forward f = run_forward(p, q, k, v);
  EXPECT_EQ(f.lse[0], -kInf);
  EXPECT_EQ(f.o[0], 0.0);
  // dV of the last key comes only from the last row (the only one that sees it), through both heads.
  for (std::int64_t d = 0; d < p.head_dim_v; ++d) EXPECT_NE(d_v[2 * p.head_dim_v + d], 42.0);
}

// --- padding -------------------------------------------------------------------------------------

// The padded problems: GQA, rows of each entry both shorter and longer than its keys, zero-length
// query and key entries, under each window kind.
std::vector<ReferenceProblem> padded_problems() {
  const std::vector<std::pair<Window, Alignment>> windows = {
      {Window{}, Alignment::top_left},           {kCausal, Alignment::top_left},
      {kCausal, Alignment::bottom_right},        {Window{2, 0}, Alignment::bottom_right},
      {Window{3, 1}, Alignment::top_left},
  };
  std::vector<ReferenceProblem> out;
  for (const auto& [window, alignment] : windows) {
    ReferenceProblem p = make_problem(4, 2, 6, 8, 8, 16, window, alignment);
    p.batch = 5;
    p.seq_len_q = {5, 0, 3, 6, 2};
    p.seq_len_kv = {7, 4, 0, 3, 8};
    out.push_back(p);
  }
  return out;
}

// Rows [0, len) of every head of entry b of a contiguous [batch, heads, seq, dim] array, as a
// [1, heads, len, dim] array.
std::vector<double> cut_entry(const std::vector<double>& x, std::int64_t b, std::int64_t heads, std::int64_t seq,
                              std::int64_t len, std::int64_t dim) {
  std::vector<double> out;
  for (std::int64_t h = 0; h < heads; ++h) {
    const auto first = x.begin() + ((b * heads + h) * seq) * dim;
    out.insert(out.end(), first, first + len * dim);
  }
  return out;
}

// Entry b of a padded [batch, heads, seq, dim] result: rows below len equal `alone` (the entry run
// by itself, [1, heads, len, dim]) exactly; the padding rows equal `pad` exactly. An empty `alone`
// means the entry has nothing to compute, so every row is `pad`.
void expect_entry(const std::vector<double>& padded, const std::vector<double>& alone, std::int64_t b,
                  std::int64_t heads, std::int64_t seq, std::int64_t len, std::int64_t dim, double pad,
                  const char* what) {
  for (std::int64_t h = 0; h < heads; ++h) {
    for (std::int64_t r = 0; r < seq; ++r) {
      for (std::int64_t d = 0; d < dim; ++d) {
        const double got = padded[static_cast<std::size_t>(((b * heads + h) * seq + r) * dim + d)];
        const bool inside = r < len && !alone.empty();
        const double expected = inside ? alone[static_cast<std::size_t>((h * len + r) * dim + d)] : pad;
        ASSERT_EQ(got, expected) << what << " entry " << b << " head " << h << " row " << r << " dim " << d;
      }
    }
  }
}

struct Gradients {
  std::vector<double> d_q, d_k, d_v;
};

// Backward into outputs poisoned with NaN, so that anything left unwritten fails the comparison.
Gradients run_backward(const ReferenceProblem& p, const std::vector<double>& q, const std::vector<double>& k,
                       const std::vector<double>& v, const std::vector<double>& d_o) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  Gradients g{std::vector<double>(q.size(), nan), std::vector<double>(k.size(), nan),
              std::vector<double>(v.size(), nan)};
  reference_backward_cpu(p, q.data(), k.data(), v.data(), d_o.data(), g.d_q.data(), g.d_k.data(), g.d_v.data());
  return g;
}

// Lengths equal to the padded sizes are no padding at all: the results must be bit for bit the same.
TEST(ReferencePadding, FullLengthsEqualNoPadding) {
  Rng rng;
  SCOPED_TRACE(rng.trace());
  for (ReferenceProblem p : mask_problems()) {
    p.batch = 2;
    SCOPED_TRACE(describe(p));
    ReferenceProblem full = p;
    full.seq_len_q = {p.seq_q, p.seq_q};
    full.seq_len_kv = {p.seq_kv, p.seq_kv};
    const std::vector<double> q = rng.normal(q_size(p)), k = rng.normal(k_size(p)), v = rng.normal(v_size(p));
    const std::vector<double> d_o = rng.normal(o_size(p));
    const Forward a = run_forward(p, q, k, v), b = run_forward(full, q, k, v);
    EXPECT_EQ(a.o, b.o);
    EXPECT_EQ(a.lse, b.lse);
    const Gradients ga = run_backward(p, q, k, v, d_o), gb = run_backward(full, q, k, v, d_o);
    EXPECT_EQ(ga.d_q, gb.d_q);
    EXPECT_EQ(ga.d_k, gb.d_k);
    EXPECT_EQ(ga.d_v, gb.d_v);
  }
}

// Each entry of a padded batch computes exactly what it would alone, unpadded, at its own lengths
// (whatever the padding holds); padding rows are O = 0, lse = -inf, dQ = 0, and padding keys get
// dK = dV = 0. An entry with a zero length computes nothing: all of it reads as padding.
TEST(ReferencePadding, EachEntryEqualsItselfAloneAndPaddingIsZero) {
  Rng rng;
  SCOPED_TRACE(rng.trace());
  for (const ReferenceProblem& p : padded_problems()) {
    SCOPED_TRACE(describe(p));
    const std::vector<double> q = rng.normal(q_size(p)), k = rng.normal(k_size(p)), v = rng.normal(v_size(p));
    const std::vector<double> d_o = rng.normal(o_size(p));
    const Forward f = run_forward(p, q, k, v);
    const Gradients g = run_backward(p, q, k, v, d_o);
    for (std::int64_t b = 0; b < p.batch; ++b) {
      const std::int64_t len_q = p.seq_len_q[b], len_kv = p.seq_len_kv[b];
      SCOPED_TRACE("entry " + std::to_string(b) + ": len_q=" + std::to_string(len_q) +
                   " len_kv=" + std::to_string(len_kv));
      Forward f_alone;
      Gradients g_alone;
      if (len_q > 0 && len_kv > 0) {
        ReferenceProblem alone = p;
        alone.batch = 1;
        alone.seq_q = len_q;
        alone.seq_kv = len_kv;
        alone.seq_len_q.clear();
        alone.seq_len_kv.clear();
        const std::vector<double> q_a = cut_entry(q, b, p.heads_q, p.seq_q, len_q, p.head_dim_qk);
        const std::vector<double> k_a = cut_entry(k, b, p.heads_kv, p.seq_kv, len_kv, p.head_dim_qk);
        const std::vector<double> v_a = cut_entry(v, b, p.heads_kv, p.seq_kv, len_kv, p.head_dim_v);
        const std::vector<double> do_a = cut_entry(d_o, b, p.heads_q, p.seq_q, len_q, p.head_dim_v);
        f_alone = run_forward(alone, q_a, k_a, v_a);
        g_alone = run_backward(alone, q_a, k_a, v_a, do_a);
      }
      expect_entry(f.o, f_alone.o, b, p.heads_q, p.seq_q, len_q, p.head_dim_v, 0.0, "O");
      expect_entry(f.lse, f_alone.lse, b, p.heads_q, p.seq_q, len_q, 1, -kInf, "lse");
      expect_entry(g.d_q, g_alone.d_q, b, p.heads_q, p.seq_q, len_q, p.head_dim_qk, 0.0, "dQ");
      expect_entry(g.d_k, g_alone.d_k, b, p.heads_kv, p.seq_kv, len_kv, p.head_dim_qk, 0.0, "dK");
      expect_entry(g.d_v, g_alone.d_v, b, p.heads_kv, p.seq_kv, len_kv, p.head_dim_v, 0.0, "dV");
    }
  }
}

TEST(ReferencePadding, BackwardMatchesFiniteDifferences) {
  Rng rng;
  SCOPED_TRACE(rng.trace());
  ReferenceProblem p = make_problem(4, 2, 5, 6, 8, 8, Window{2, 1}, Alignment::bottom_right);
  p.batch = 3;
  p.seq_len_q = {4, 0, 5};
  p.seq_len_kv = {6, 3, 2};
  SCOPED_TRACE(describe(p));
  std::vector<double> q = rng.normal(q_size(p)), k = rng.normal(k_size(p)), v = rng.normal(v_size(p));
  const std::vector<double> d_o = rng.normal(o_size(p));
  const Gradients g = run_backward(p, q, k, v, d_o);
  const auto eval = [&] { return loss(p, q, k, v, d_o); };
  const std::vector<double> num_q = numeric_gradient(q, eval);
  const std::vector<double> num_k = numeric_gradient(k, eval);
  const std::vector<double> num_v = numeric_gradient(v, eval);
  EXPECT_LT(relative_error(g.d_q.data(), num_q.data(), q_size(p)), 1e-6) << "dQ";
  EXPECT_LT(relative_error(g.d_k.data(), num_k.data(), k_size(p)), 1e-6) << "dK";
  EXPECT_LT(relative_error(g.d_v.data(), num_v.data(), v_size(p)), 1e-6) << "dV";
}

// Bad lengths throw before anything is read, naming the field, the value and the requirement.
TEST(ReferencePadding, RejectsBadLengths) {
  struct Case {
    std::vector<std::int64_t> len_q, len_kv;
    std::string field, value;
  };
  const std::vector<Case> cases = {
      {{3}, {4, 4}, "seq_len_q", "size 1"},          // batch is 2
      {{3, 3}, {}, "seq_len_kv", "size 0"},          // one set, the other not
      {{}, {4, 4}, "seq_len_q", "size 0"},
      {{3, 6}, {4, 4}, "seq_len_q", "6"},            // above seq_q = 5
      {{3, 3}, {-1, 4}, "seq_len_kv", "-1"},
      {{3, 3}, {4, 8}, "seq_len_kv", "8"},           // above seq_kv = 7
  };
  std::vector<double> buf(4096);
  for (const Case& c : cases) {
    ReferenceProblem p = make_problem(2, 1, 5, 7, 8, 8);
    p.batch = 2;
    p.seq_len_q = c.len_q;
    p.seq_len_kv = c.len_kv;
    SCOPED_TRACE(c.field + " = " + c.value);
    for (bool forward : {true, false}) {
      try {
        if (forward) {
          reference_forward_cpu(p, buf.data(), buf.data(), buf.data(), buf.data(), buf.data());
        } else {
          reference_backward_cpu(p, buf.data(), buf.data(), buf.data(), buf.data(), buf.data(), buf.data(),
                                 buf.data());
        }
        ADD_FAILURE() << "expected InvalidArgument";
      } catch (const InvalidArgument& e) {
        EXPECT_EQ(e.field(), c.field);
        EXPECT_EQ(e.value(), c.value);
        EXPECT_FALSE(e.requirement().empty());
      }
    }
  }
}

// --- bias, ALiBi, softmax variants, max logit --------------------------------------------------

std::string describe_extras(const ReferenceProblem& p) {
  return describe(p) + " bias=" + to_string(p.bias) + (p.alibi ? " alibi" : "") + " softmax=" + to_string(p.softmax) +
         (p.seq_len_q.empty() ? "" : " padded") + (p.dropout > 0.0 ? " dropout=" + std::to_string(p.dropout) : "");
}

std::int64_t bias_size(const ReferenceProblem& p) {
  const std::array<std::int64_t, 4> dims = bias_dims(p.bias, p.batch, p.heads_q, p.seq_q, p.seq_kv);
  return dims[0] * dims[1] * dims[2] * dims[3];
}

// The extra inputs of a call (empty: not given).
struct ExtraInputs {
  std::vector<double> bias, sink, mask;  // mask: the dropout keep mask [b, h_q, s_q, s_kv]
};

// A dropout keep mask: each visible element kept (1) with probability 1 - p.dropout, else 0. Where
// a row does not see the key the mask is NaN, which the references must never read.
std::vector<double> random_mask(const ReferenceProblem& p, Rng& rng) {
  std::bernoulli_distribution keep(1.0 - p.dropout);
  std::vector<double> mask;
  for (std::int64_t b = 0; b < p.batch; ++b) {
    for (std::int64_t h = 0; h < p.heads_q; ++h) {
      for (std::int64_t i = 0; i < p.seq_q; ++i) {
        for (std::int64_t j = 0; j < p.seq_kv; ++j) {
          const bool kept = keep(rng.engine);  // drawn everywhere, so the mask is the same draw
          mask.push_back(reference_visible(p, b, i, j) ? (kept ? 1.0 : 0.0) : std::nan(""));
        }
      }
    }
  }
  return mask;
}

ExtraInputs random_extras(const ReferenceProblem& p, Rng& rng) {
  ExtraInputs in;
  if (p.bias != Bias::none) in.bias = rng.normal(bias_size(p));
  if (p.softmax == Softmax::sink) in.sink = rng.normal(p.heads_q);
  if (p.dropout > 0.0) in.mask = random_mask(p, rng);
  return in;
}

ReferenceExtras<double> extras_of(const ExtraInputs& in) {
  ReferenceExtras<double> e;
  e.bias = in.bias.empty() ? nullptr : in.bias.data();
  e.sink = in.sink.empty() ? nullptr : in.sink.data();
  e.dropout_mask = in.mask.empty() ? nullptr : in.mask.data();
  return e;
}

struct FullForward {
  std::vector<double> o, lse, max_logit;
};

// Forward with every optional output, poisoned with NaN first so that nothing is left unwritten.
FullForward run_forward_full(const ReferenceProblem& p, const std::vector<double>& q, const std::vector<double>& k,
                             const std::vector<double>& v, const ExtraInputs& in) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  FullForward f{std::vector<double>(static_cast<std::size_t>(o_size(p)), nan),
                std::vector<double>(static_cast<std::size_t>(lse_size(p)), nan),
                std::vector<double>(static_cast<std::size_t>(lse_size(p)), nan)};
  ReferenceExtras<double> e = extras_of(in);
  e.max_logit = f.max_logit.data();
  reference_forward_cpu(p, q.data(), k.data(), v.data(), f.o.data(), f.lse.data(), e);
  return f;
}

struct FullGradients {
  std::vector<double> d_q, d_k, d_v, d_bias, d_sink;  // d_bias, d_sink empty when there is none
};

FullGradients run_backward_full(const ReferenceProblem& p, const std::vector<double>& q, const std::vector<double>& k,
                                const std::vector<double>& v, const std::vector<double>& d_o, const ExtraInputs& in) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  FullGradients g{std::vector<double>(q.size(), nan), std::vector<double>(k.size(), nan),
                  std::vector<double>(v.size(), nan), std::vector<double>(in.bias.size(), nan),
                  std::vector<double>(in.sink.size(), nan)};
  ReferenceExtras<double> e = extras_of(in);
  e.d_bias = g.d_bias.empty() ? nullptr : g.d_bias.data();
  e.d_sink = g.d_sink.empty() ? nullptr : g.d_sink.data();
  reference_backward_cpu(p, q.data(), k.data(), v.data(), d_o.data(), g.d_q.data(), g.d_k.data(), g.d_v.data(), e);
  return g;
}

// Problems `a` and `b` (with their extra inputs) compute the same attention, bit for bit: O, the
// statistics, the max logit and dQ, dK, dV, on the same fresh inputs.
void expect_same_attention(const ReferenceProblem& a, const ExtraInputs& in_a, const ReferenceProblem& b,
                           const ExtraInputs& in_b, Rng& rng) {
  const std::vector<double> q = rng.normal(q_size(a)), k = rng.normal(k_size(a)), v = rng.normal(v_size(a));
  const std::vector<double> d_o = rng.normal(o_size(a));
  const FullForward fa = run_forward_full(a, q, k, v, in_a), fb = run_forward_full(b, q, k, v, in_b);
  EXPECT_EQ(fa.o, fb.o);
  EXPECT_EQ(fa.lse, fb.lse);
  EXPECT_EQ(fa.max_logit, fb.max_logit);
  const FullGradients ga = run_backward_full(a, q, k, v, d_o, in_a), gb = run_backward_full(b, q, k, v, d_o, in_b);
  EXPECT_EQ(ga.d_q, gb.d_q);
  EXPECT_EQ(ga.d_k, gb.d_k);
  EXPECT_EQ(ga.d_v, gb.d_v);
}

double loss_full(const ReferenceProblem& p, const std::vector<double>& q, const std::vector<double>& k,
                 const std::vector<double>& v, const std::vector<double>& d_o, const ExtraInputs& in) {
  const FullForward f = run_forward_full(p, q, k, v, in);
  double sum = 0.0;
  for (std::size_t x = 0; x < f.o.size(); ++x) sum += f.o[x] * d_o[x];
  return sum;
}

// Every gradient of the call (dQ, dK, dV, and dBias / dSink where the problem has them) against
// central differences of L = sum(O ∘ dO).
void expect_gradients_match_finite_differences(const ReferenceProblem& p, Rng& rng) {
  std::vector<double> q = rng.normal(q_size(p)), k = rng.normal(k_size(p)), v = rng.normal(v_size(p));
  const std::vector<double> d_o = rng.normal(o_size(p));
  ExtraInputs in = random_extras(p, rng);
  const FullGradients g = run_backward_full(p, q, k, v, d_o, in);
  const auto eval = [&] { return loss_full(p, q, k, v, d_o, in); };
  const auto n = [](const std::vector<double>& x) { return static_cast<std::int64_t>(x.size()); };
  EXPECT_LT(relative_error(g.d_q.data(), numeric_gradient(q, eval).data(), n(q)), 1e-6) << "dQ";
  EXPECT_LT(relative_error(g.d_k.data(), numeric_gradient(k, eval).data(), n(k)), 1e-6) << "dK";
  EXPECT_LT(relative_error(g.d_v.data(), numeric_gradient(v, eval).data(), n(v)), 1e-6) << "dV";
  if (!in.bias.empty()) {
    EXPECT_LT(relative_error(g.d_bias.data(), numeric_gradient(in.bias, eval).data(), n(in.bias)), 1e-6) << "dBias";
  }
  if (!in.sink.empty()) {
    const std::vector<double> num_sink = numeric_gradient(in.sink, eval);
    EXPECT_LT(relative_error(g.d_sink.data(), num_sink.data(), n(in.sink)), 1e-6) << "dSink";
    double norm = 0.0;
    for (double x : num_sink) norm += std::abs(x);
    EXPECT_GT(norm, 1e-3) << "the sink must matter in this test";
  }
}

const Bias kBiasShapes[] = {Bias::bhss, Bias::b1ss, Bias::one_hss, Bias::one_1ss, Bias::one_11s};

TEST(ReferenceBias, DimsOfEachShape) {
  using D = std::array<std::int64_t, 4>;
  EXPECT_EQ(bias_dims(Bias::bhss, 2, 3, 4, 5), (D{2, 3, 4, 5}));
  EXPECT_EQ(bias_dims(Bias::b1ss, 2, 3, 4, 5), (D{2, 1, 4, 5}));
  EXPECT_EQ(bias_dims(Bias::one_hss, 2, 3, 4, 5), (D{1, 3, 4, 5}));
  EXPECT_EQ(bias_dims(Bias::one_1ss, 2, 3, 4, 5), (D{1, 1, 4, 5}));
  EXPECT_EQ(bias_dims(Bias::one_11s, 2, 3, 4, 5), (D{1, 1, 1, 5}));
}

// Softmax is invariant to a shift of the whole row: a bias constant along j changes O and the
// gradients only by rounding, moves lse by the constant, and gets dBias summing to 0 along each
// row (sum_j dS_ij = D_i - D_i sum_j P_ij = 0).
TEST(ReferenceBias, ConstantPerRowChangesNothingButLse) {
  Rng rng;
  SCOPED_TRACE(rng.trace());
  for (Bias shape : {Bias::bhss, Bias::b1ss, Bias::one_hss, Bias::one_1ss}) {
    ReferenceProblem plain = make_problem(4, 2, 5, 7, 8, 16, kCausal, Alignment::bottom_right);
    plain.batch = 2;
    ReferenceProblem p = plain;
    p.bias = shape;
    SCOPED_TRACE(describe_extras(p));
    const std::array<std::int64_t, 4> dims = bias_dims(shape, p.batch, p.heads_q, p.seq_q, p.seq_kv);
    ExtraInputs in;
    const std::vector<double> row_bias = rng.normal(dims[0] * dims[1] * dims[2]);
    for (double c : row_bias) in.bias.insert(in.bias.end(), static_cast<std::size_t>(p.seq_kv), 3.0 * c);
    const std::vector<double> q = rng.normal(q_size(p)), k = rng.normal(k_size(p)), v = rng.normal(v_size(p));
    const std::vector<double> d_o = rng.normal(o_size(p));
    const FullForward biased = run_forward_full(p, q, k, v, in), ref = run_forward_full(plain, q, k, v, {});
    EXPECT_LT(relative_error(biased.o.data(), ref.o.data(), o_size(p)), 1e-14);
    for (std::int64_t b = 0; b < p.batch; ++b) {
      for (std::int64_t h = 0; h < p.heads_q; ++h) {
        for (std::int64_t i = 0; i < p.seq_q; ++i) {
          const std::int64_t row = (b * p.heads_q + h) * p.seq_q + i;
          const std::int64_t at = ((dims[0] == 1 ? 0 : b) * dims[1] + (dims[1] == 1 ? 0 : h)) * dims[2] + i;
          const double c = 3.0 * row_bias[static_cast<std::size_t>(at)];
          EXPECT_NEAR(biased.lse[row], ref.lse[row] + c, 1e-12) << "row " << row;
          EXPECT_NEAR(biased.max_logit[row], ref.max_logit[row] + c, 1e-12) << "row " << row;
        }
      }
    }
    const FullGradients gb = run_backward_full(p, q, k, v, d_o, in), gr = run_backward_full(plain, q, k, v, d_o, {});
    EXPECT_LT(relative_error(gb.d_q.data(), gr.d_q.data(), q_size(p)), 1e-12);
    EXPECT_LT(relative_error(gb.d_k.data(), gr.d_k.data(), k_size(p)), 1e-12);
    EXPECT_LT(relative_error(gb.d_v.data(), gr.d_v.data(), v_size(p)), 1e-12);
    for (std::int64_t r = 0; r < dims[0] * dims[1] * dims[2]; ++r) {
      double sum = 0.0, norm = 0.0;
      for (std::int64_t j = 0; j < p.seq_kv; ++j) {
        sum += gb.d_bias[static_cast<std::size_t>(r * p.seq_kv + j)];
        norm += std::abs(gb.d_bias[static_cast<std::size_t>(r * p.seq_kv + j)]);
      }
      EXPECT_NEAR(sum, 0.0, 1e-12 * (1.0 + norm)) << "bias row " << r;
    }
  }
}

// A bias of -1e9 on a key makes e^(s - max) exactly 0 in float64: the key is hidden exactly as the
// mask hides it, so O, lse and every gradient equal the masked problem's, and dBias is 0 there.
TEST(ReferenceBias, HugeNegativeBiasHidesAKeyLikeTheMask) {
  Rng rng;
  SCOPED_TRACE(rng.trace());
  for (Alignment alignment : {Alignment::top_left, Alignment::bottom_right}) {
    ReferenceProblem masked = make_problem(4, 2, 5, 7, 8, 16, Window{3, 0}, alignment);
    ReferenceProblem p = make_problem(4, 2, 5, 7, 8, 16);
    p.bias = Bias::one_1ss;
    SCOPED_TRACE(describe(masked));
    ExtraInputs in;
    for (std::int64_t i = 0; i < p.seq_q; ++i) {
      for (std::int64_t j = 0; j < p.seq_kv; ++j) in.bias.push_back(reference_visible(masked, 0, i, j) ? 0.0 : -1e9);
    }
    const std::vector<double> q = rng.normal(q_size(p)), k = rng.normal(k_size(p)), v = rng.normal(v_size(p));
    const std::vector<double> d_o = rng.normal(o_size(p));
    const FullForward a = run_forward_full(p, q, k, v, in), b = run_forward_full(masked, q, k, v, {});
    EXPECT_EQ(a.o, b.o);
    EXPECT_EQ(a.lse, b.lse);
    EXPECT_EQ(a.max_logit, b.max_logit);
    const FullGradients ga = run_backward_full(p, q, k, v, d_o, in), gb = run_backward_full(masked, q, k, v, d_o, {});
    EXPECT_LT(relative_error(ga.d_q.data(), gb.d_q.data(), q_size(p)), 1e-14);
    EXPECT_LT(relative_error(ga.d_k.data(), gb.d_k.data(), k_size(p)), 1e-14);
    EXPECT_LT(relative_error(ga.d_v.data(), gb.d_v.data(), v_size(p)), 1e-14);
    for (std::size_t x = 0; x < in.bias.size(); ++x) {
      if (in.bias[x] != 0.0) EXPECT_EQ(ga.d_bias[x], 0.0) << "element " << x;
    }
  }
}

// dBias of each broadcast shape against central differences: float64, small, GQA, s_q != s_kv
// both ways, causal both alignments (with rows that see nothing), and a batch of two.
TEST(ReferenceBias, GradientOfEachShapeMatchesFiniteDifferences) {
  Rng rng;
  SCOPED_TRACE(rng.trace());
  for (Bias shape : kBiasShapes) {
    for (auto [s_q, s_kv, alignment] : {std::tuple<int, int, Alignment>{3, 5, Alignment::top_left},
                                        std::tuple<int, int, Alignment>{5, 3, Alignment::bottom_right}}) {
      ReferenceProblem p = make_problem(4, 2, s_q, s_kv, 8, 8, kCausal, alignment);
      p.batch = 2;
      p.bias = shape;
      SCOPED_TRACE(describe_extras(p));
      expect_gradients_match_finite_differences(p, rng);
    }
  }
}

// The bias's values land where bias_dims says: compare against a bhss bias with the broadcast
// dims written out.
TEST(ReferenceBias, BroadcastEqualsTheExpandedBias) {
  Rng rng;
  SCOPED_TRACE(rng.trace());
  for (Bias shape : kBiasShapes) {
    ReferenceProblem p = make_problem(4, 2, 3, 5, 8, 8, kCausal, Alignment::top_left);
    p.batch = 2;
    p.bias = shape;
    ReferenceProblem full = p;
    full.bias = Bias::bhss;
    SCOPED_TRACE(describe_extras(p));
    const ExtraInputs in = random_extras(p, rng);
    const std::array<std::int64_t, 4> dims = bias_dims(shape, p.batch, p.heads_q, p.seq_q, p.seq_kv);
    ExtraInputs expanded;
    for (std::int64_t b = 0; b < p.batch; ++b) {
      for (std::int64_t h = 0; h < p.heads_q; ++h) {
        for (std::int64_t i = 0; i < p.seq_q; ++i) {
          for (std::int64_t j = 0; j < p.seq_kv; ++j) {
            const std::int64_t at = (((dims[0] == 1 ? 0 : b) * dims[1] + (dims[1] == 1 ? 0 : h)) * dims[2] +
                                     (dims[2] == 1 ? 0 : i)) * dims[3] + j;
            expanded.bias.push_back(in.bias[static_cast<std::size_t>(at)]);
          }
        }
      }
    }
    const std::vector<double> q = rng.normal(q_size(p)), k = rng.normal(k_size(p)), v = rng.normal(v_size(p));
    const std::vector<double> d_o = rng.normal(o_size(p));
    const FullForward a = run_forward_full(p, q, k, v, in), b = run_forward_full(full, q, k, v, expanded);
    EXPECT_EQ(a.o, b.o);
    EXPECT_EQ(a.lse, b.lse);
    // dBias of the broadcast shape is the full dBias summed over the broadcast dims.
    const FullGradients ga = run_backward_full(p, q, k, v, d_o, in), gb = run_backward_full(full, q, k, v, d_o, expanded);
    EXPECT_EQ(ga.d_q, gb.d_q);
    std::vector<double> folded(in.bias.size(), 0.0);
    for (std::int64_t x = 0; x < static_cast<std::int64_t>(gb.d_bias.size()); ++x) {
      const std::int64_t j = x % p.seq_kv, i = x / p.seq_kv % p.seq_q, h = x / (p.seq_kv * p.seq_q) % p.heads_q,
                         b = x / (p.seq_kv * p.seq_q * p.heads_q);
      const std::int64_t at = (((dims[0] == 1 ? 0 : b) * dims[1] + (dims[1] == 1 ? 0 : h)) * dims[2] +
                               (dims[2] == 1 ? 0 : i)) * dims[3] + j;
      folded[static_cast<std::size_t>(at)] += gb.d_bias[static_cast<std::size_t>(x)];
    }
    EXPECT_LT(relative_error(ga.d_bias.data(), folded.data(), static_cast<std::int64_t>(folded.size())), 1e-14);
  }
}

// Runs the forward or the backward without extras on placeholder buffers and returns the
// InvalidArgument it throws (nullopt, with a test failure, when it throws none).
std::optional<InvalidArgument> missing_extras_error(const ReferenceProblem& p, bool forward) {
  std::vector<double> buf(1024);
  try {
    if (forward) {
      reference_forward_cpu(p, buf.data(), buf.data(), buf.data(), buf.data(), buf.data());
    } else {
      reference_backward_cpu(p, buf.data(), buf.data(), buf.data(), buf.data(), buf.data(), buf.data(), buf.data());
    }
  } catch (const InvalidArgument& e) {
    return e;
  }
  ADD_FAILURE() << "expected InvalidArgument";
  return std::nullopt;
}

TEST(ReferenceBias, RejectsAMissingBias) {
  ReferenceProblem p = make_problem(2, 1, 2, 2, 8, 8);
  p.bias = Bias::one_hss;
  for (bool forward : {true, false}) {
    const std::optional<InvalidArgument> e = missing_extras_error(p, forward);
    ASSERT_TRUE(e.has_value());
    EXPECT_EQ(e->field(), "extras.bias");
    EXPECT_NE(e->requirement().find("1hss"), std::string::npos) << e->requirement();
  }
}

// cuDNN's slopes: 2^(-8k/n) for the n = 2^floor(log2 h) first heads, then 2^(-4(2m+1)/n).
TEST(ReferenceAlibi, SlopesOfPowerOfTwoHeadCounts) {
  EXPECT_EQ(alibi_slopes(1), (std::vector<double>{0.00390625}));
  EXPECT_EQ(alibi_slopes(2), (std::vector<double>{0.0625, 0.00390625}));
  EXPECT_EQ(alibi_slopes(8), (std::vector<double>{0.5, 0.25, 0.125, 0.0625, 0.03125, 0.015625, 0.0078125,
                                                  0.00390625}));
  const std::vector<double> sixteen = alibi_slopes(16);
  ASSERT_EQ(sixteen.size(), 16u);
  for (int h = 0; h < 16; ++h) EXPECT_DOUBLE_EQ(sixteen[h], std::pow(2.0, -0.5 * (h + 1))) << "head " << h;
}

TEST(ReferenceAlibi, SlopesOfTwelveHeads) {
  // n = 8: 2^-1 .. 2^-8, then 2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5 (cuDNN: (i+1)*0.5 for i = 0, 2, 4, 6, times -8/n).
  const std::vector<double> expected = {0.5,
                                        0.25,
                                        0.125,
                                        0.0625,
                                        0.03125,
                                        0.015625,
                                        0.0078125,
                                        0.00390625,
                                        0.70710678118654752,
                                        0.35355339059327376,
                                        0.17677669529663688,
                                        0.088388347648318440};
  const std::vector<double> got = alibi_slopes(12);
  ASSERT_EQ(got.size(), expected.size());
  for (std::size_t h = 0; h < expected.size(); ++h) EXPECT_DOUBLE_EQ(got[h], expected[h]) << "head " << h;
  // Three heads: n = 2 gives 2^-4, 2^-8, then 2^-2.
  EXPECT_EQ(alibi_slopes(3), (std::vector<double>{0.0625, 0.00390625, 0.25}));
}

// ALiBi is the 1hss bias slope_h * (j - i), with raw indices (no bottom-right shift).
TEST(ReferenceAlibi, EqualsTheBiasItStandsFor) {
  Rng rng;
  SCOPED_TRACE(rng.trace());
  for (Alignment alignment : {Alignment::top_left, Alignment::bottom_right}) {
    ReferenceProblem p = make_problem(6, 2, 4, 7, 8, 8, kCausal, alignment);
    p.batch = 2;
    p.alibi = true;
    ReferenceProblem as_bias = p;
    as_bias.alibi = false;
    as_bias.bias = Bias::one_hss;
    SCOPED_TRACE(describe_extras(p));
    const std::vector<double> slopes = alibi_slopes(p.heads_q);
    ExtraInputs in;
    for (std::int64_t h = 0; h < p.heads_q; ++h) {
      for (std::int64_t i = 0; i < p.seq_q; ++i) {
        for (std::int64_t j = 0; j < p.seq_kv; ++j) in.bias.push_back(slopes[h] * static_cast<double>(j - i));
      }
    }
    expect_same_attention(p, {}, as_bias, in, rng);
  }
}

// A zero query scores only the ALiBi term: row i (top-left causal) sees keys 0..i with logits
// -slope * (i - j), so lse = log sum_{t=0..i} e^(-slope t) and the max logit is 0 (the diagonal).
TEST(ReferenceAlibi, ZeroQueryClosedForm) {
  Rng rng;
  SCOPED_TRACE(rng.trace());
  ReferenceProblem p = make_problem(3, 1, 6, 6, 8, 8, kCausal, Alignment::top_left);
  p.alibi = true;
  const std::vector<double> q(static_cast<std::size_t>(q_size(p)), 0.0);
  const FullForward f = run_forward_full(p, q, rng.normal(k_size(p)), rng.normal(v_size(p)), {});
  const std::vector<double> slopes = alibi_slopes(3);
  for (std::int64_t h = 0; h < p.heads_q; ++h) {
    for (std::int64_t i = 0; i < p.seq_q; ++i) {
      double sum = 0.0;
      for (std::int64_t t = 0; t <= i; ++t) sum += std::exp(-slopes[h] * static_cast<double>(t));
      EXPECT_NEAR(f.lse[h * p.seq_q + i], std::log(sum), 1e-14) << "head " << h << " row " << i;
      EXPECT_EQ(f.max_logit[h * p.seq_q + i], 0.0) << "head " << h << " row " << i;
    }
  }
}

TEST(ReferenceAlibi, GradientsMatchFiniteDifferences) {
  Rng rng;
  SCOPED_TRACE(rng.trace());
  ReferenceProblem p = make_problem(6, 3, 5, 4, 8, 8, kCausal, Alignment::bottom_right);
  p.batch = 2;
  p.alibi = true;
  p.bias = Bias::one_11s;
  SCOPED_TRACE(describe_extras(p));
  expect_gradients_match_finite_differences(p, rng);
}

// One visible key of logit x (s_kv = 1): off_by_one gives P = e^x / (e^x + 1), so O = P v and
// lse = log(e^x + 1). Bottom-right causal with s_q = 3 leaves rows 0 and 1 seeing nothing: their
// denominator is the extra term alone, O = 0 and lse = 0 (off_by_one) or sink_h (sink).
TEST(ReferenceSoftmax, OffByOneAndSinkWithOneVisibleKey) {
  Rng rng;
  SCOPED_TRACE(rng.trace());
  for (Softmax softmax : {Softmax::off_by_one, Softmax::sink}) {
    ReferenceProblem p = make_problem(2, 1, 3, 1, 8, 4, kCausal, Alignment::bottom_right);
    p.softmax = softmax;
    SCOPED_TRACE(describe_extras(p));
    const std::vector<double> q = rng.normal(q_size(p)), k = rng.normal(k_size(p)), v = rng.normal(v_size(p));
    const ExtraInputs in = random_extras(p, rng);
    const FullForward f = run_forward_full(p, q, k, v, in);
    for (std::int64_t h = 0; h < p.heads_q; ++h) {
      const double extra = softmax == Softmax::sink ? in.sink[h] : 0.0;
      for (std::int64_t i = 0; i < 2; ++i) {
        const std::int64_t row = h * p.seq_q + i;
        EXPECT_EQ(f.lse[row], extra) << "head " << h << " row " << i;
        EXPECT_EQ(f.max_logit[row], -kInf) << "head " << h << " row " << i;
        for (std::int64_t d = 0; d < p.head_dim_v; ++d) EXPECT_EQ(f.o[row * p.head_dim_v + d], 0.0);
      }
      const std::int64_t row = h * p.seq_q + 2;
      double x = 0.0;
      for (std::int64_t d = 0; d < p.head_dim_qk; ++d) x += q[row * p.head_dim_qk + d] * k[d];
      x *= p.scale;
      const double prob = std::exp(x) / (std::exp(x) + std::exp(extra));
      EXPECT_NEAR(f.lse[row], std::log(std::exp(x) + std::exp(extra)), 1e-14);
      EXPECT_NEAR(f.max_logit[row], x, 1e-14);
      for (std::int64_t d = 0; d < p.head_dim_v; ++d) {
        EXPECT_NEAR(f.o[row * p.head_dim_v + d], prob * v[d], 1e-14) << "head " << h << " dim " << d;
      }
    }
  }
}

// A zero query scores 0 on every key: with n visible keys, P = 1 / (n + e^extra) each, so
// lse = log(n + e^extra) and O = (sum of the visible values) / (n + e^extra).
TEST(ReferenceSoftmax, ZeroQueryClosedForm) {
  Rng rng;
  SCOPED_TRACE(rng.trace());
  for (Softmax softmax : {Softmax::vanilla, Softmax::off_by_one, Softmax::sink}) {
    ReferenceProblem p = make_problem(2, 1, 4, 6, 8, 4, Window{3, 0}, Alignment::bottom_right);
    p.softmax = softmax;
    SCOPED_TRACE(describe_extras(p));
    const std::vector<double> q(static_cast<std::size_t>(q_size(p)), 0.0), v = rng.normal(v_size(p));
    const ExtraInputs in = random_extras(p, rng);
    const FullForward f = run_forward_full(p, q, rng.normal(k_size(p)), v, in);
    for (std::int64_t h = 0; h < p.heads_q; ++h) {
      const double extra_mass =
          softmax == Softmax::vanilla ? 0.0 : softmax == Softmax::off_by_one ? 1.0 : std::exp(in.sink[h]);
      for (std::int64_t i = 0; i < p.seq_q; ++i) {
        const std::int64_t row = h * p.seq_q + i, n = visible_count(p, i);
        const double denominator = static_cast<double>(n) + extra_mass;
        EXPECT_NEAR(f.lse[row], std::log(denominator), 1e-14) << "head " << h << " row " << i;
        for (std::int64_t d = 0; d < p.head_dim_v; ++d) {
          double sum = 0.0;
          for (std::int64_t j = 0; j < p.seq_kv; ++j) sum += sees(p, i, j) ? v[j * p.head_dim_v + d] : 0.0;
          EXPECT_NEAR(f.o[row * p.head_dim_v + d], sum / denominator, 1e-14) << "head " << h << " row " << i;
        }
      }
    }
  }
}

// A sink of -inf takes no mass: everything equals the vanilla softmax, and dSink is 0. A sink of 0
// is the off_by_one softmax exactly.
TEST(ReferenceSoftmax, SinkOfMinusInfIsVanillaAndSinkOfZeroIsOffByOne) {
  Rng rng;
  SCOPED_TRACE(rng.trace());
  for (const ReferenceProblem& base : backward_problems()) {
    ReferenceProblem sink = base, off = base;
    sink.softmax = Softmax::sink;
    off.softmax = Softmax::off_by_one;
    SCOPED_TRACE(describe(base));
    const std::vector<double> q = rng.normal(q_size(base)), k = rng.normal(k_size(base)), v = rng.normal(v_size(base));
    const std::vector<double> d_o = rng.normal(o_size(base));
    ExtraInputs minus_inf, zero;
    minus_inf.sink.assign(static_cast<std::size_t>(base.heads_q), -kInf);
    zero.sink.assign(static_cast<std::size_t>(base.heads_q), 0.0);

    const FullForward vanilla = run_forward_full(base, q, k, v, {}), a = run_forward_full(sink, q, k, v, minus_inf);
    EXPECT_EQ(a.o, vanilla.o);
    EXPECT_EQ(a.lse, vanilla.lse);
    EXPECT_EQ(a.max_logit, vanilla.max_logit);
    const FullGradients gv = run_backward_full(base, q, k, v, d_o, {}), ga = run_backward_full(sink, q, k, v, d_o, minus_inf);
    EXPECT_EQ(ga.d_q, gv.d_q);
    EXPECT_EQ(ga.d_k, gv.d_k);
    EXPECT_EQ(ga.d_v, gv.d_v);
    EXPECT_EQ(ga.d_sink, std::vector<double>(static_cast<std::size_t>(base.heads_q), 0.0));

    const FullForward b = run_forward_full(sink, q, k, v, zero), c = run_forward_full(off, q, k, v, {});
    EXPECT_EQ(b.o, c.o);
    EXPECT_EQ(b.lse, c.lse);
    const FullGradients gb = run_backward_full(sink, q, k, v, d_o, zero), gc = run_backward_full(off, q, k, v, d_o, {});
    EXPECT_EQ(gb.d_q, gc.d_q);
    EXPECT_EQ(gb.d_k, gc.d_k);
    EXPECT_EQ(gb.d_v, gc.d_v);
  }
}

// dSink_h = -sum_{b, i} e^(sink_h - lse_i) D_i, and dQ, dK, dV through the larger denominator,
// against central differences; with GQA, rows that see nothing, and padding.
TEST(ReferenceSoftmax, GradientsMatchFiniteDifferences) {
  Rng rng;
  SCOPED_TRACE(rng.trace());
  for (Softmax softmax : {Softmax::off_by_one, Softmax::sink}) {
    for (const ReferenceProblem& base : backward_problems()) {
      ReferenceProblem p = base;
      p.softmax = softmax;
      SCOPED_TRACE(describe_extras(p));
      expect_gradients_match_finite_differences(p, rng);
    }
    ReferenceProblem padded = make_problem(4, 2, 5, 6, 8, 8, kCausal, Alignment::bottom_right);
    padded.batch = 3;
    padded.seq_len_q = {4, 0, 5};
    padded.seq_len_kv = {6, 3, 2};
    padded.softmax = softmax;
    SCOPED_TRACE(describe_extras(padded));
    expect_gradients_match_finite_differences(padded, rng);
  }
}

// Everything at once: bias, ALiBi, sink, padding, a sliding window, GQA.
TEST(ReferenceSoftmax, SinkWithBiasAlibiAndPaddingMatchesFiniteDifferences) {
  Rng rng;
  SCOPED_TRACE(rng.trace());
  ReferenceProblem p = make_problem(4, 2, 5, 6, 8, 8, Window{3, 1}, Alignment::bottom_right);
  p.batch = 3;
  p.seq_len_q = {4, 0, 5};
  p.seq_len_kv = {6, 3, 2};
  p.bias = Bias::b1ss;
  p.alibi = true;
  p.softmax = Softmax::sink;
  SCOPED_TRACE(describe_extras(p));
  expect_gradients_match_finite_differences(p, rng);
}

// Padding rows have no denominator at all, not even the extra term: O = 0, lse = -inf, max logit
// -inf, dQ = 0. A real row of an entry with no keys has only the extra term: O = 0, lse = it.
TEST(ReferenceSoftmax, PaddingRowsStayEmpty) {
  Rng rng;
  SCOPED_TRACE(rng.trace());
  for (Softmax softmax : {Softmax::off_by_one, Softmax::sink}) {
    ReferenceProblem p = make_problem(2, 1, 4, 5, 8, 8);
    p.batch = 2;
    p.seq_len_q = {2, 3};
    p.seq_len_kv = {5, 0};
    p.softmax = softmax;
    SCOPED_TRACE(describe_extras(p));
    const std::vector<double> q = rng.normal(q_size(p)), k = rng.normal(k_size(p)), v = rng.normal(v_size(p));
    const ExtraInputs in = random_extras(p, rng);
    const FullForward f = run_forward_full(p, q, k, v, in);
    const FullGradients g = run_backward_full(p, q, k, v, rng.normal(o_size(p)), in);
    for (std::int64_t b = 0; b < p.batch; ++b) {
      for (std::int64_t h = 0; h < p.heads_q; ++h) {
        const double extra = softmax == Softmax::sink ? in.sink[h] : 0.0;
        for (std::int64_t i = 0; i < p.seq_q; ++i) {
          const std::int64_t row = (b * p.heads_q + h) * p.seq_q + i;
          SCOPED_TRACE("entry " + std::to_string(b) + " head " + std::to_string(h) + " row " + std::to_string(i));
          const bool padding = i >= p.seq_len_q[b];
          if (padding) {
            EXPECT_EQ(f.lse[row], -kInf);
          } else if (b == 1) {
            EXPECT_EQ(f.lse[row], extra);
          } else {
            EXPECT_GT(f.lse[row], extra);
          }
          if (padding || b == 1) {
            EXPECT_EQ(f.max_logit[row], -kInf);
            for (std::int64_t d = 0; d < p.head_dim_v; ++d) EXPECT_EQ(f.o[row * p.head_dim_v + d], 0.0);
            for (std::int64_t d = 0; d < p.head_dim_qk; ++d) EXPECT_EQ(g.d_q[row * p.head_dim_qk + d], 0.0);
          }
        }
      }
    }
  }
}

TEST(ReferenceSoftmax, RejectsAMissingSink) {
  ReferenceProblem p = make_problem(2, 1, 2, 2, 8, 8);
  p.softmax = Softmax::sink;
  for (bool forward : {true, false}) {
    const std::optional<InvalidArgument> e = missing_extras_error(p, forward);
    ASSERT_TRUE(e.has_value());
    EXPECT_EQ(e->field(), "extras.sink");
  }
  // off_by_one needs no input.
  p.softmax = Softmax::off_by_one;
  std::vector<double> buf(1024);
  EXPECT_NO_THROW(reference_forward_cpu(p, buf.data(), buf.data(), buf.data(), buf.data(), buf.data()));
}

// The max logit per row, by brute force over reference_visible: scale q.k + bias + ALiBi over the
// visible keys, -inf where none (or padding). A large sink does not enter it.
TEST(ReferenceMaxLogit, MatchesBruteForceWithPadding) {
  Rng rng;
  SCOPED_TRACE(rng.trace());
  for (const ReferenceProblem& base : padded_problems()) {
    ReferenceProblem p = base;
    p.bias = Bias::one_hss;
    p.alibi = true;
    p.softmax = Softmax::sink;
    SCOPED_TRACE(describe_extras(p));
    const std::vector<double> q = rng.normal(q_size(p)), k = rng.normal(k_size(p)), v = rng.normal(v_size(p));
    ExtraInputs in = random_extras(p, rng);
    for (double& s : in.sink) s += 100.0;
    const FullForward f = run_forward_full(p, q, k, v, in);
    const std::vector<double> slopes = alibi_slopes(p.heads_q);
    const std::int64_t group = p.heads_q / p.heads_kv;
    for (std::int64_t b = 0; b < p.batch; ++b) {
      for (std::int64_t h = 0; h < p.heads_q; ++h) {
        for (std::int64_t i = 0; i < p.seq_q; ++i) {
          double expected = -kInf;
          for (std::int64_t j = 0; j < p.seq_kv; ++j) {
            if (!reference_visible(p, b, i, j)) continue;
            double s = 0.0;
            for (std::int64_t d = 0; d < p.head_dim_qk; ++d) {
              s += q[static_cast<std::size_t>(((b * p.heads_q + h) * p.seq_q + i) * p.head_dim_qk + d)] *
                   k[static_cast<std::size_t>(((b * p.heads_kv + h / group) * p.seq_kv + j) * p.head_dim_qk + d)];
            }
            s = s * p.scale + in.bias[static_cast<std::size_t>((h * p.seq_q + i) * p.seq_kv + j)] +
                slopes[h] * static_cast<double>(j - i);
            expected = std::max(expected, s);
          }
          const std::int64_t row = (b * p.heads_q + h) * p.seq_q + i;
          if (expected == -kInf) {
            EXPECT_EQ(f.max_logit[row], -kInf) << "entry " << b << " head " << h << " row " << i;
          } else {
            EXPECT_NEAR(f.max_logit[row], expected, 1e-12) << "entry " << b << " head " << h << " row " << i;
          }
        }
      }
    }
  }
}

// Without any extra the max logit is the largest scaled score; on unmasked rows lse >= it.
TEST(ReferenceMaxLogit, BoundsTheLse) {
  Rng rng;
  SCOPED_TRACE(rng.trace());
  for (const ReferenceProblem& p : mask_problems()) {
    SCOPED_TRACE(describe(p));
    const FullForward f = run_forward_full(p, rng.normal(q_size(p)), rng.normal(k_size(p)), rng.normal(v_size(p)), {});
    for (std::int64_t r = 0; r < lse_size(p); ++r) {
      const std::int64_t i = r % p.seq_q, n = visible_count(p, i);
      if (n == 0) {
        EXPECT_EQ(f.max_logit[r], -kInf);
      } else {
        EXPECT_LE(f.max_logit[r], f.lse[r]);
        EXPECT_GE(f.max_logit[r] + std::log(static_cast<double>(n)), f.lse[r] - 1e-12);
      }
    }
  }
}

// --- dropout with an explicit keep mask ---------------------------------------------------------

// Problems for dropout: GQA, causal both ways (with rows that see nothing), padding, and every
// score term at once.
std::vector<ReferenceProblem> dropout_problems(double dropout) {
  std::vector<ReferenceProblem> out;
  for (const ReferenceProblem& base : backward_problems()) {
    ReferenceProblem p = base;
    p.dropout = dropout;
    out.push_back(p);
  }
  ReferenceProblem padded = make_problem(4, 2, 5, 6, 8, 8, kCausal, Alignment::top_left);
  padded.batch = 3;
  padded.seq_len_q = {4, 0, 5};
  padded.seq_len_kv = {6, 3, 2};
  padded.bias = Bias::b1ss;
  padded.dropout = dropout;
  out.push_back(padded);
  padded.alibi = true;
  padded.softmax = Softmax::sink;
  padded.window = Window{3, 1};
  padded.alignment = Alignment::bottom_right;
  padded.bias = Bias::bhss;
  out.push_back(padded);
  return out;
}

// A mask of all ones drops nothing but still rescales: O = O_plain / (1 - p), and since L is then
// (1 - p)^-1 times the plain L, so is every gradient; lse and the max logit are exactly the plain
// ones. With p = 1/2 the factor is 2, so all of it holds bit for bit; with p = 1/4 up to rounding.
// Without dropout a mask, even all zeros, is ignored.
TEST(ReferenceDropout, AllOnesMaskOnlyRescales) {
  Rng rng;
  SCOPED_TRACE(rng.trace());
  for (double dropout : {0.5, 0.25}) {
    for (const ReferenceProblem& p : dropout_problems(dropout)) {
      SCOPED_TRACE(describe_extras(p));
      ReferenceProblem plain = p;
      plain.dropout = 0.0;
      const std::vector<double> q = rng.normal(q_size(p)), k = rng.normal(k_size(p)), v = rng.normal(v_size(p));
      const std::vector<double> d_o = rng.normal(o_size(p));
      ExtraInputs in = random_extras(p, rng);
      ExtraInputs plain_in = in;
      std::fill(in.mask.begin(), in.mask.end(), 1.0);
      std::fill(plain_in.mask.begin(), plain_in.mask.end(), 0.0);  // ignored: plain has no dropout
      const double c = 1.0 / (1.0 - dropout);
      const auto scaled = [c](std::vector<double> x) {
        for (double& e : x) e *= c;
        return x;
      };
      const FullForward f = run_forward_full(p, q, k, v, in), ref = run_forward_full(plain, q, k, v, plain_in);
      EXPECT_EQ(f.lse, ref.lse);
      EXPECT_EQ(f.max_logit, ref.max_logit);
      const FullGradients g = run_backward_full(p, q, k, v, d_o, in);
      const FullGradients gr = run_backward_full(plain, q, k, v, d_o, plain_in);
      const std::vector<std::pair<const char*, std::pair<const std::vector<double>*, const std::vector<double>*>>>
          pairs = {{"O", {&f.o, &ref.o}},           {"dQ", {&g.d_q, &gr.d_q}},
                   {"dK", {&g.d_k, &gr.d_k}},       {"dV", {&g.d_v, &gr.d_v}},
                   {"dBias", {&g.d_bias, &gr.d_bias}}, {"dSink", {&g.d_sink, &gr.d_sink}}};
      for (const auto& [what, got_ref] : pairs) {
        const std::vector<double> expected = scaled(*got_ref.second);
        if (dropout == 0.5) {
          EXPECT_EQ(*got_ref.first, expected) << what;
        } else {
          EXPECT_LT(relative_error(got_ref.first->data(), expected.data(),
                                   static_cast<std::int64_t>(expected.size())), 1e-14) << what;
        }
      }
    }
  }
}

// Dropping key j for every row is exactly a zero value row V_j under a mask of all ones: the same
// O, lse, dQ, dK, dBias and dSink bit for bit (dropped terms are skipped, zero ones add +0), and
// the same dV except at j, which no kept probability reaches, so dV_j = 0. GQA: the kv head's
// column is dropped for every query head of its group.
TEST(ReferenceDropout, DroppedColumnEqualsAZeroValueRow) {
  Rng rng;
  SCOPED_TRACE(rng.trace());
  for (const ReferenceProblem& p : dropout_problems(0.3)) {
    SCOPED_TRACE(describe_extras(p));
    const std::int64_t column = 1, group = p.heads_q / p.heads_kv;
    for (std::int64_t hk = 0; hk < p.heads_kv; ++hk) {
      SCOPED_TRACE("kv head " + std::to_string(hk));
      const std::vector<double> q = rng.normal(q_size(p)), k = rng.normal(k_size(p)), v = rng.normal(v_size(p));
      const std::vector<double> d_o = rng.normal(o_size(p));
      ExtraInputs dropped = random_extras(p, rng);
      ExtraInputs ones = dropped;
      std::fill(ones.mask.begin(), ones.mask.end(), 1.0);
      std::fill(dropped.mask.begin(), dropped.mask.end(), 1.0);
      std::vector<double> v_zeroed = v;
      for (std::int64_t b = 0; b < p.batch; ++b) {
        for (std::int64_t h = hk * group; h < (hk + 1) * group; ++h) {
          for (std::int64_t i = 0; i < p.seq_q; ++i) {
            dropped.mask[static_cast<std::size_t>(((b * p.heads_q + h) * p.seq_q + i) * p.seq_kv + column)] = 0.0;
          }
        }
        for (std::int64_t d = 0; d < p.head_dim_v; ++d) {
          v_zeroed[static_cast<std::size_t>(((b * p.heads_kv + hk) * p.seq_kv + column) * p.head_dim_v + d)] = 0.0;
        }
      }
      const FullForward a = run_forward_full(p, q, k, v, dropped), z = run_forward_full(p, q, k, v_zeroed, ones);
      EXPECT_EQ(a.o, z.o);
      EXPECT_EQ(a.lse, z.lse);
      EXPECT_EQ(a.max_logit, z.max_logit);
      const FullGradients ga = run_backward_full(p, q, k, v, d_o, dropped);
      const FullGradients gz = run_backward_full(p, q, k, v_zeroed, d_o, ones);
      EXPECT_EQ(ga.d_q, gz.d_q);
      EXPECT_EQ(ga.d_k, gz.d_k);
      EXPECT_EQ(ga.d_bias, gz.d_bias);
      EXPECT_EQ(ga.d_sink, gz.d_sink);
      for (std::int64_t b = 0; b < p.batch; ++b) {
        for (std::int64_t h = 0; h < p.heads_kv; ++h) {
          for (std::int64_t j = 0; j < p.seq_kv; ++j) {
            for (std::int64_t d = 0; d < p.head_dim_v; ++d) {
              const std::size_t at = static_cast<std::size_t>(((b * p.heads_kv + h) * p.seq_kv + j) * p.head_dim_v + d);
              const double expected = h == hk && j == column ? 0.0 : gz.d_v[at];
              ASSERT_EQ(ga.d_v[at], expected) << "dV entry " << b << " head " << h << " key " << j << " dim " << d;
            }
          }
        }
      }
    }
  }
}

// A row that sees a single key has P = 1 there: O is V_0 / (1 - p) when the key is kept and exactly
// 0 when it is dropped, while lse is the key's logit either way. Its dQ is 0 either way: the
// softmax is the constant 1.
TEST(ReferenceDropout, SingleVisibleKeyIsKeptOrDropped) {
  Rng rng;
  SCOPED_TRACE(rng.trace());
  ReferenceProblem p = make_problem(1, 1, 4, 6, 8, 16, kCausal, Alignment::top_left);  // row 0 sees key 0 only
  p.dropout = 0.25;
  const double c = 1.0 / (1.0 - p.dropout);
  for (double kept : {1.0, 0.0}) {
    SCOPED_TRACE(kept == 1.0 ? "kept" : "dropped");
    const std::vector<double> q = rng.normal(q_size(p)), k = rng.normal(k_size(p)), v = rng.normal(v_size(p));
    ExtraInputs in = random_extras(p, rng);
    in.mask[0] = kept;
    const FullForward f = run_forward_full(p, q, k, v, in);
    for (std::int64_t d = 0; d < p.head_dim_v; ++d) EXPECT_EQ(f.o[d], kept * c * v[d]) << "dim " << d;
    double score = 0.0;
    for (std::int64_t d = 0; d < p.head_dim_qk; ++d) score += q[d] * k[d];
    EXPECT_NEAR(f.lse[0], p.scale * score, 1e-12);
    const FullGradients g = run_backward_full(p, q, k, v, rng.normal(o_size(p)), in);
    // Kept: dP c - D = c (dO.V_0) - dO.(c V_0), zero up to rounding; dropped: 0 - dO.0, exactly 0.
    for (std::int64_t d = 0; d < p.head_dim_qk; ++d) EXPECT_NEAR(g.d_q[d], 0.0, kept * 1e-14) << "dim " << d;
  }
}

// Every gradient (dQ, dK, dV, dBias, dSink) against central differences of L = sum(O ∘ dO) for a
// fixed random mask: GQA, MQA, causal both ways, padding, a bias, ALiBi and a sink. The mask is NaN
// wherever a row does not see the key, so reading it there would fail too.
TEST(ReferenceDropout, GradientsMatchFiniteDifferences) {
  Rng rng;
  SCOPED_TRACE(rng.trace());
  for (const ReferenceProblem& p : dropout_problems(0.3)) {
    SCOPED_TRACE(describe_extras(p));
    expect_gradients_match_finite_differences(p, rng);
  }
}

// lse and the max logit do not see the dropout; O does (a random mask changes it).
TEST(ReferenceDropout, StatisticsIgnoreTheMask) {
  Rng rng;
  SCOPED_TRACE(rng.trace());
  for (const ReferenceProblem& p : dropout_problems(0.3)) {
    SCOPED_TRACE(describe_extras(p));
    ReferenceProblem plain = p;
    plain.dropout = 0.0;
    const std::vector<double> q = rng.normal(q_size(p)), k = rng.normal(k_size(p)), v = rng.normal(v_size(p));
    const ExtraInputs in = random_extras(p, rng);
    const FullForward f = run_forward_full(p, q, k, v, in), ref = run_forward_full(plain, q, k, v, in);
    EXPECT_EQ(f.lse, ref.lse);
    EXPECT_EQ(f.max_logit, ref.max_logit);
    EXPECT_NE(f.o, ref.o);
  }
}

TEST(ReferenceDropout, RejectsAMissingMaskAndABadProbability) {
  ReferenceProblem p = make_problem(2, 1, 2, 2, 8, 8);
  p.dropout = 0.1;
  for (bool forward : {true, false}) {
    const std::optional<InvalidArgument> e = missing_extras_error(p, forward);
    ASSERT_TRUE(e.has_value());
    EXPECT_EQ(e->field(), "extras.dropout_mask");
  }
  for (double bad : {-0.1, 1.0, 1.5, std::nan("")}) {
    p.dropout = bad;
    SCOPED_TRACE("dropout " + std::to_string(bad));
    for (bool forward : {true, false}) {
      const std::optional<InvalidArgument> e = missing_extras_error(p, forward);
      ASSERT_TRUE(e.has_value());
      EXPECT_EQ(e->field(), "dropout");
    }
  }
  // No dropout needs no mask.
  p.dropout = 0.0;
  std::vector<double> buf(1024);
  EXPECT_NO_THROW(reference_forward_cpu(p, buf.data(), buf.data(), buf.data(), buf.data(), buf.data()));
}

// --- 16-bit conversion -------------------------------------------------------------------------

float from_bits(std::uint16_t bits, DType dtype) { return half_bits_to_float(bits, dtype); }
std::uint16_t to_bits(float value, DType dtype) { return float_to_half_bits(value, dtype); }

TEST(ReferenceConvert, HalfKnownValues) {
  const DType h = DType::f16;
  EXPECT_EQ(from_bits(0x3c00, h), 1.0f);
  EXPECT_EQ(from_bits(0xc000, h), -2.0f);
  EXPECT_EQ(from_bits(0x7bff, h), 65504.0f);
  EXPECT_EQ(from_bits(0x0400, h), std::ldexp(1.0f, -14));       // smallest normal
  EXPECT_EQ(from_bits(0x0001, h), std::ldexp(1.0f, -24));       // smallest subnormal
  EXPECT_EQ(from_bits(0x03ff, h), std::ldexp(1023.0f, -24));    // largest subnormal
  EXPECT_EQ(from_bits(0x8001, h), -std::ldexp(1.0f, -24));
  EXPECT_EQ(from_bits(0x7c00, h), std::numeric_limits<float>::infinity());
  EXPECT_EQ(from_bits(0xfc00, h), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(from_bits(0x7e00, h)));
  EXPECT_TRUE(std::isnan(from_bits(0x7c01, h)));  // signalling NaN is still NaN
  EXPECT_TRUE(std::signbit(from_bits(0x8000, h)));
  EXPECT_EQ(to_bits(-0.0f, h), 0x8000);
  EXPECT_EQ(to_bits(1.0f, h), 0x3c00);
  EXPECT_EQ(to_bits(std::ldexp(1.0f, -24), h), 0x0001);
  EXPECT_EQ(to_bits(1e5f, h), 0x7c00);                                  // overflow
  EXPECT_EQ(to_bits(-std::numeric_limits<float>::infinity(), h), 0xfc00);
  EXPECT_EQ(to_bits(std::numeric_limits<float>::denorm_min(), h), 0x0000);  // underflow
}

// Every 16-bit pattern survives a trip through float; NaNs stay NaN with their sign.
void expect_all_patterns_round_trip(DType dtype) {
  for (std::uint32_t bits = 0; bits <= 0xffffu; ++bits) {
    const float value = from_bits(static_cast<std::uint16_t>(bits), dtype);
    const std::uint16_t back = to_bits(value, dtype);
    if (std::isnan(value)) {
      ASSERT_TRUE(std::isnan(from_bits(back, dtype))) << std::hex << bits;
      ASSERT_EQ(back & 0x8000u, bits & 0x8000u) << std::hex << bits;
    } else {
      ASSERT_EQ(back, bits) << std::hex << bits;
    }
  }
}

TEST(ReferenceConvert, HalfRoundTripsEveryPattern) { expect_all_patterns_round_trip(DType::f16); }
TEST(ReferenceConvert, Bf16RoundTripsEveryPattern) { expect_all_patterns_round_trip(DType::bf16); }

TEST(ReferenceConvert, HalfRoundsToNearestEven) {
  const DType h = DType::f16;
  const auto two_pow = [](int e) { return std::ldexp(1.0f, e); };
  EXPECT_EQ(to_bits(1.0f + two_pow(-11), h), 0x3c00);                    // tie, down to even
  EXPECT_EQ(to_bits(1.0f + 3 * two_pow(-11), h), 0x3c02);                // tie, up to even
  EXPECT_EQ(to_bits(1.0f + two_pow(-11) + two_pow(-20), h), 0x3c01);     // just above the tie
  EXPECT_EQ(to_bits(1.0f + two_pow(-11) - two_pow(-20), h), 0x3c00);     // just below the tie
  EXPECT_EQ(to_bits(2.0f - two_pow(-12), h), 0x4000);                    // tie carries into the exponent
  EXPECT_EQ(to_bits(65519.0f, h), 0x7bff);
  EXPECT_EQ(to_bits(65520.0f, h), 0x7c00);                               // tie above the max: inf
  // Subnormal results, in units of 2^-24.
  EXPECT_EQ(to_bits(two_pow(-25), h), 0x0000);                           // tie, down to zero
  EXPECT_EQ(to_bits(two_pow(-25) * (1.0f + two_pow(-10)), h), 0x0001);
  EXPECT_EQ(to_bits(3 * two_pow(-25), h), 0x0002);                       // 1.5 units: up to even
  EXPECT_EQ(to_bits(5 * two_pow(-25), h), 0x0002);                       // 2.5 units: down to even
  EXPECT_EQ(to_bits(2047 * two_pow(-25), h), 0x0400);                    // 1023.5 units: the smallest normal
  EXPECT_EQ(to_bits(-3 * two_pow(-25), h), 0x8002);
}

TEST(ReferenceConvert, Bf16RoundsToNearestEvenAndKeepsNaN) {
  const DType b = DType::bf16;
  const auto two_pow = [](int e) { return std::ldexp(1.0f, e); };
  EXPECT_EQ(to_bits(1.0f, b), 0x3f80);
  EXPECT_EQ(from_bits(0x3f80, b), 1.0f);
  EXPECT_EQ(to_bits(1.0f + two_pow(-8), b), 0x3f80);                     // tie, down to even
  EXPECT_EQ(to_bits(1.0f + 3 * two_pow(-8), b), 0x3f82);                 // tie, up to even
  EXPECT_EQ(to_bits(1.0f + two_pow(-8) + two_pow(-20), b), 0x3f81);
  EXPECT_EQ(to_bits(std::numeric_limits<float>::max(), b), 0x7f80);      // rounds up to inf
  EXPECT_EQ(to_bits(-std::numeric_limits<float>::infinity(), b), 0xff80);
  EXPECT_EQ(to_bits(std::numeric_limits<float>::denorm_min(), b), 0x0000);
  // A NaN whose payload sits only in the low 16 bits would truncate to inf; it must stay NaN.
  std::uint32_t low_payload_nan = 0x7f800001u;
  float nan;
  std::memcpy(&nan, &low_payload_nan, sizeof nan);
  ASSERT_TRUE(std::isnan(nan));
  EXPECT_TRUE(std::isnan(from_bits(to_bits(nan, b), b)));
  EXPECT_TRUE(std::isnan(from_bits(to_bits(std::numeric_limits<float>::quiet_NaN(), DType::f16), DType::f16)));
  EXPECT_TRUE(std::isnan(from_bits(to_bits(nan, DType::f16), DType::f16)));
}

// --- relative error ------------------------------------------------------------------------------

TEST(ReferenceError, IsTheRatioOfNorms) {
  const std::vector<double> ref = {3.0, 4.0}, out = {3.0, 5.0};
  EXPECT_DOUBLE_EQ(relative_error(out.data(), ref.data(), 2), 0.2);
  EXPECT_EQ(relative_error(ref.data(), ref.data(), 2), 0.0);
  const std::vector<float> out_f = {3.0f, 5.0f}, ref_f = {3.0f, 4.0f};
  EXPECT_DOUBLE_EQ(relative_error(out_f.data(), ref_f.data(), 2), 0.2);
  EXPECT_DOUBLE_EQ(relative_error(out_f.data(), ref.data(), 2), 0.2);
}

TEST(ReferenceError, ZeroReferenceGivesTheNormOfOut) {
  const std::vector<double> ref = {0.0, 0.0}, out = {3.0, 4.0};
  EXPECT_DOUBLE_EQ(relative_error(out.data(), ref.data(), 2), 5.0);
}

TEST(ReferenceError, NaNOrInfNeverPasses) {
  const std::vector<float> ref = {1.0f, 2.0f, 3.0f};
  std::vector<float> out = ref;
  out[1] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(relative_error(out.data(), ref.data(), 3), kInf);
  out[1] = std::numeric_limits<float>::infinity();
  EXPECT_EQ(relative_error(out.data(), ref.data(), 3), kInf);
  const std::vector<double> ref_d = {1.0, 2.0, 3.0};
  out[1] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(relative_error(out.data(), ref_d.data(), 3), kInf);
}

// The -inf log-sum-exp of a fully masked row must be matched exactly, and is then left out.
TEST(ReferenceError, NonFiniteReferenceMustMatchExactly) {
  const std::vector<double> ref = {-kInf, 3.0, 4.0};
  const std::vector<double> same = {-kInf, 3.0, 5.0};
  EXPECT_DOUBLE_EQ(relative_error(same.data(), ref.data(), 3), 0.2);
  const std::vector<double> finite = {-1e30, 3.0, 4.0};
  EXPECT_EQ(relative_error(finite.data(), ref.data(), 3), kInf);
  const std::vector<double> nan = {std::numeric_limits<double>::quiet_NaN(), 3.0, 4.0};
  EXPECT_EQ(relative_error(nan.data(), ref.data(), 3), kInf);
}

// --- strided gather / scatter --------------------------------------------------------------------

TEST(ReferenceGather, StridedRoundTripLeavesPaddingAlone) {
  Rng rng;
  SCOPED_TRACE(rng.trace());
  for (DType dtype : {DType::f16, DType::bf16}) {
    SCOPED_TRACE(dtype == DType::f16 ? "f16" : "bf16");
    // [b=2, h=3, s=4, d=8] stored as b, s, h, d with each head row padded to 16 elements.
    TensorDesc desc;
    desc.dtype = dtype;
    desc.dims = {2, 3, 4, 8};
    desc.strides = {4 * 3 * 16, 16, 3 * 16, 1};
    const std::int64_t extent = 2 * 4 * 3 * 16;
    const std::uint16_t poison = 0xabcd;
    std::vector<std::uint16_t> buffer(static_cast<std::size_t>(extent), poison);
    // Multiples of 1/8 in [-16, 16) are exact in both formats, so the trip must be lossless.
    std::uniform_int_distribution<int> dist(-128, 127);
    std::vector<double> values(static_cast<std::size_t>(desc.elements()));
    for (double& x : values) x = dist(rng.engine) / 8.0;
    scatter_from_double(desc, values.data(), buffer.data());
    EXPECT_EQ(gather_to_double(desc, buffer.data()), values);
    // Element (b=1, h=2, s=3, d=5) sits where the strides say.
    const std::int64_t logical = ((1 * 3 + 2) * 4 + 3) * 8 + 5, physical = 1 * 192 + 2 * 16 + 3 * 48 + 5;
    EXPECT_EQ(half_bits_to_float(buffer[physical], dtype), values[logical]);
    std::int64_t untouched = 0;
    for (std::uint16_t x : buffer) untouched += x == poison ? 1 : 0;
    EXPECT_EQ(untouched, extent - desc.elements());
  }
}

// --- score modifiers ---------------------------------------------------------------------------

// ALiBi written as a modifier, with the standard slopes as its per-head tensor, is ALiBi.
TEST(ReferenceScoreMod, AlibiWrittenInIsAlibi) {
  Rng rng;
  SCOPED_TRACE(rng.trace());
  for (Alignment alignment : {Alignment::top_left, Alignment::bottom_right}) {
    ReferenceProblem p = make_problem(6, 2, 4, 7, 8, 8, kCausal, alignment);
    p.batch = 2;
    p.alibi = true;
    ReferenceProblem written = p;
    written.alibi = false;
    written.score_mod = parse_score_mod("add(score,mul(t0[h],sub(kv,q)))");
    const std::vector<double> slopes = alibi_slopes(p.heads_q);
    written.score_mod_tensors = {std::vector<float>(slopes.begin(), slopes.end())};
    // float32 slopes against ALiBi's double ones: equal to about 1e-8.
    const std::vector<double> q = rng.normal(q_size(p)), k = rng.normal(k_size(p)), v = rng.normal(v_size(p));
    const std::vector<double> d_o = rng.normal(o_size(p));
    const FullForward a = run_forward_full(p, q, k, v, {}), b = run_forward_full(written, q, k, v, {});
    EXPECT_LT(relative_error(b.o.data(), a.o.data(), o_size(p)), 1e-7);
    EXPECT_LT(relative_error(b.lse.data(), a.lse.data(), lse_size(p)), 1e-7);
    const FullGradients ga = run_backward_full(p, q, k, v, d_o, {}), gb = run_backward_full(written, q, k, v, d_o, {});
    EXPECT_LT(relative_error(gb.d_q.data(), ga.d_q.data(), q_size(p)), 1e-7);
    EXPECT_LT(relative_error(gb.d_k.data(), ga.d_k.data(), k_size(p)), 1e-7);
    EXPECT_EQ(gb.d_v.size(), ga.d_v.size());
    EXPECT_LT(relative_error(gb.d_v.data(), ga.d_v.data(), v_size(p)), 1e-7);
  }
}

// A causal mask written as a modifier (select to -inf) gives what the causal window gives.
TEST(ReferenceScoreMod, MaskWrittenInIsTheMask) {
  Rng rng;
  SCOPED_TRACE(rng.trace());
  ReferenceProblem masked = make_problem(4, 2, 6, 6, 8, 8, kCausal, Alignment::top_left);
  ReferenceProblem written = make_problem(4, 2, 6, 6, 8, 8);
  written.score_mod = parse_score_mod("select(le(kv,q),score,-inf)");
  expect_same_attention(masked, {}, written, {}, rng);
}

// The backward with modifiers that bend the scores (a softcap, a per-query-row tensor scaling them
// where the distance is small, a square root of a shifted score) against central differences.
TEST(ReferenceScoreMod, BackwardMatchesFiniteDifferences) {
  Rng rng;
  SCOPED_TRACE(rng.trace());
  const std::pair<const char*, float> modifiers[] = {
      {"mul(tanh(div(score,$0)),$0)", 1.5f},  // a cap the scores reach
      {"select(lt(abs(sub(kv,q)),2),mul(score,t0[q]),sub(score,$0))", 3.0f},
      {"sqrt(add(score,$0))", 12.0f},  // the shift keeps the root's argument positive
  };
  for (auto [text, scalar] : modifiers) {
    for (ReferenceProblem p : backward_problems()) {
      p.score_mod = parse_score_mod(text);
      p.score_mod_scalars = {scalar};
      if (p.score_mod.tensors() > 0) {
        std::vector<float> rows;
        for (double x : rng.normal(p.seq_q)) rows.push_back(static_cast<float>(1.0 + 0.5 * x));
        p.score_mod_tensors = {rows};
      }
      SCOPED_TRACE(std::string(text) + " " + describe(p));
      expect_gradients_match_differences(p, rng);
    }
  }
}

TEST(ReferenceScoreMod, RejectsMissingValues) {
  ReferenceProblem p = make_problem(2, 1, 4, 4, 8, 8);
  p.score_mod = parse_score_mod("add(mul(score,$0),t0[h,kv])");
  p.score_mod_scalars = {1.0f};
  p.score_mod_tensors = {std::vector<float>(7)};  // h * s_kv = 8 wanted
  std::vector<double> q(q_size(p)), k(k_size(p)), v(v_size(p)), o(o_size(p)), lse(lse_size(p));
  try {
    reference_forward_cpu(p, q.data(), k.data(), v.data(), o.data(), lse.data());
    ADD_FAILURE() << "accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(e.field(), "score_mod_tensors[0]");
    EXPECT_NE(std::string(e.what()).find("8 elements"), std::string::npos) << e.what();
  }
  p.score_mod_scalars.clear();
  EXPECT_THROW(reference_forward_cpu(p, q.data(), k.data(), v.data(), o.data(), lse.data()), InvalidArgument);
}

}  // namespace
}  // namespace fusedattn
