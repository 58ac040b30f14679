// GPU tier: the float32 GPU reference against the float64 CPU reference, and the GPU gather/scatter.
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include "fusedattn/errors.h"
#include "fusedattn/reference.h"
#include "gpu_skip.h"
#include "testing/cuda_check.h"

namespace fusedattn {
namespace {

#define REF_CUDA_OK(call)                                                      \
  do {                                                                         \
    const cudaError_t ref_status = (call);                                     \
    ASSERT_EQ(ref_status, cudaSuccess) << #call << ": " << cudaGetErrorString(ref_status); \
  } while (0)

// A device allocation freed on scope exit, poisoned with NaN (all bits set) so that anything a
// kernel forgets to write shows up in the comparison. A failed allocation throws CudaError with
// its size (GPU tests share the device under ctest -j): a null buffer would fail later, obscurely.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
    if (bytes == 0) return;  // an output the case does not ask for
    check::check_cuda(cudaMalloc(&ptr_, bytes), ("cudaMalloc(" + std::to_string(bytes) + " bytes)").c_str());
    check::check_cuda(cudaMemset(ptr_, 0xff, bytes), "cudaMemset(poison)");
  }
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  float* f() const { return static_cast<float*>(ptr_); }
  void* get() const { return ptr_; }
  std::size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  std::size_t bytes_;
};

std::size_t bytes_of(const std::vector<float>& v) { return v.size() * sizeof(float); }

struct Case {
  std::int64_t batch, heads_q, heads_kv, seq_q, seq_kv, d_qk, d_v;
  Window window;
  Alignment alignment;
};

ReferenceProblem to_problem(const Case& c) {
  ReferenceProblem p;
  p.batch = c.batch;
  p.heads_q = c.heads_q;
  p.heads_kv = c.heads_kv;
  p.seq_q = c.seq_q;
  p.seq_kv = c.seq_kv;
  p.head_dim_qk = c.d_qk;
  p.head_dim_v = c.d_v;
  p.window = c.window;
  p.alignment = c.alignment;
  p.scale = 1.0 / std::sqrt(static_cast<double>(c.d_qk));
  return p;
}

std::string describe(const ReferenceProblem& p) {
  return "b=" + std::to_string(p.batch) + " h_q=" + std::to_string(p.heads_q) + " h_kv=" + std::to_string(p.heads_kv) +
         " s_q=" + std::to_string(p.seq_q) + " s_kv=" + std::to_string(p.seq_kv) +
         " d_qk=" + std::to_string(p.head_dim_qk) + " d_v=" + std::to_string(p.head_dim_v) +
         " window=" + to_string(p.window) +
         (p.alignment == Alignment::top_left ? " top_left" : " bottom_right") + " bias=" + to_string(p.bias) +
         (p.alibi ? " alibi" : "") + " softmax=" + to_string(p.softmax) + (p.seq_len_q.empty() ? "" : " padded") +
         (p.dropout > 0.0 ? " dropout=" + std::to_string(p.dropout) : "");
}

std::int64_t bias_size(const ReferenceProblem& p) {
  const std::array<std::int64_t, 4> dims = bias_dims(p.bias, p.batch, p.heads_q, p.seq_q, p.seq_kv);
  return dims[0] * dims[1] * dims[2] * dims[3];
}

// Small shapes covering GQA/MQA, d_qk != d_v, both causal alignments (including rows that see no
// key), s_q != s_kv, lengths that are not multiples of anything, and the head-dim maximum.
std::vector<Case> cases() {
  const auto TL = Alignment::top_left, BR = Alignment::bottom_right;
  const Window none{}, causal = kCausal;
  return {
      {2, 4, 2, 17, 33, 64, 64, none, TL},
      {1, 4, 2, 17, 40, 192, 128, causal, TL},
      {1, 4, 2, 40, 17, 192, 128, causal, BR},  // the first 23 rows see nothing
      {2, 4, 1, 17, 65, 32, 64, causal, BR},    // MQA
      {1, 2, 2, 1, 1, 8, 8, none, TL},
      {1, 2, 1, 1, 100, 128, 128, causal, BR},  // decoding: one query row against a cache
      {1, 1, 1, 37, 37, 256, 256, causal, TL},
      {1, 2, 2, 5, 3, 16, 8, causal, TL},
      {1, 4, 2, 33, 70, 64, 64, Window{9, 0}, BR},  // sliding windows
      {1, 2, 2, 50, 50, 64, 32, Window{7, 3}, TL},
  };
}

struct Inputs {
  std::vector<float> q, k, v, d_o;
  std::vector<float> bias, sink;  // empty unless the problem has a bias / a sink softmax
  std::vector<float> mask;        // dropout keep mask [b, h_q, s_q, s_kv]; empty without dropout
};

// A keep mask with each visible element kept (1) with probability 1 - p.dropout, else 0, and NaN
// where the row does not see the key, which neither reference may read.
std::vector<float> random_mask(const ReferenceProblem& p, std::mt19937& rng) {
  std::bernoulli_distribution keep(1.0 - p.dropout);
  std::vector<float> mask;
  mask.reserve(static_cast<std::size_t>(p.batch * p.heads_q * p.seq_q * p.seq_kv));
  for (std::int64_t b = 0; b < p.batch; ++b) {
    for (std::int64_t h = 0; h < p.heads_q; ++h) {
      for (std::int64_t i = 0; i < p.seq_q; ++i) {
        for (std::int64_t j = 0; j < p.seq_kv; ++j) {
          const bool kept = keep(rng);
          mask.push_back(reference_visible(p, b, i, j) ? (kept ? 1.0f : 0.0f)
                                                       : std::numeric_limits<float>::quiet_NaN());
        }
      }
    }
  }
  return mask;
}

Inputs random_inputs(const ReferenceProblem& p, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const auto fill = [&](std::int64_t n) {
    std::vector<float> out(static_cast<std::size_t>(n));
    for (float& x : out) x = dist(rng);
    return out;
  };
  return {fill(p.batch * p.heads_q * p.seq_q * p.head_dim_qk), fill(p.batch * p.heads_kv * p.seq_kv * p.head_dim_qk),
          fill(p.batch * p.heads_kv * p.seq_kv * p.head_dim_v), fill(p.batch * p.heads_q * p.seq_q * p.head_dim_v),
          fill(bias_size(p)), p.softmax == Softmax::sink ? fill(p.heads_q) : std::vector<float>{},
          p.dropout > 0.0 ? random_mask(p, rng) : std::vector<float>{}};
}

std::vector<double> widen(const std::vector<float>& x) { return std::vector<double>(x.begin(), x.end()); }

struct Results {
  std::vector<float> o, lse, d_q, d_k, d_v;
  std::vector<float> max_logit, d_bias, d_sink;  // d_bias, d_sink empty unless the problem has them
};

// Runs the GPU forward and backward, asking for every optional output the problem has (the max
// logit always); outputs start out as NaN.
void run_gpu(const ReferenceProblem& p, const Inputs& in, Results& out) {
  out.o.assign(in.d_o.size(), 0.0f);
  out.lse.assign(static_cast<std::size_t>(p.batch * p.heads_q * p.seq_q), 0.0f);
  out.d_q.assign(in.q.size(), 0.0f);
  out.d_k.assign(in.k.size(), 0.0f);
  out.d_v.assign(in.v.size(), 0.0f);
  out.max_logit.assign(out.lse.size(), 0.0f);
  out.d_bias.assign(in.bias.size(), 0.0f);
  out.d_sink.assign(in.sink.size(), 0.0f);
  DeviceBuffer q(bytes_of(in.q)), k(bytes_of(in.k)), v(bytes_of(in.v)), d_o(bytes_of(in.d_o));
  DeviceBuffer o(bytes_of(out.o)), lse(bytes_of(out.lse)), d_q(bytes_of(out.d_q)), d_k(bytes_of(out.d_k)),
      d_v(bytes_of(out.d_v)), max_logit(bytes_of(out.max_logit));
  // One float more than needed, so that an empty bias or sink still gets an allocation.
  DeviceBuffer bias(bytes_of(in.bias) + sizeof(float)), sink(bytes_of(in.sink) + sizeof(float)),
      d_bias(bytes_of(out.d_bias) + sizeof(float)), d_sink(bytes_of(out.d_sink) + sizeof(float)),
      mask(bytes_of(in.mask) + sizeof(float));
  for (const DeviceBuffer* b :
       {&q, &k, &v, &d_o, &o, &lse, &d_q, &d_k, &d_v, &max_logit, &bias, &sink, &d_bias, &d_sink, &mask}) {
    ASSERT_NE(b->get(), nullptr);
  }
  REF_CUDA_OK(cudaMemcpy(q.get(), in.q.data(), q.bytes(), cudaMemcpyHostToDevice));
  REF_CUDA_OK(cudaMemcpy(k.get(), in.k.data(), k.bytes(), cudaMemcpyHostToDevice));
  REF_CUDA_OK(cudaMemcpy(v.get(), in.v.data(), v.bytes(), cudaMemcpyHostToDevice));
  REF_CUDA_OK(cudaMemcpy(d_o.get(), in.d_o.data(), d_o.bytes(), cudaMemcpyHostToDevice));
  REF_CUDA_OK(cudaMemcpy(bias.get(), in.bias.data(), bytes_of(in.bias), cudaMemcpyHostToDevice));
  REF_CUDA_OK(cudaMemcpy(sink.get(), in.sink.data(), bytes_of(in.sink), cudaMemcpyHostToDevice));
  REF_CUDA_OK(cudaMemcpy(mask.get(), in.mask.data(), bytes_of(in.mask), cudaMemcpyHostToDevice));
  ReferenceExtras<float> extras;
  extras.bias = in.bias.empty() ? nullptr : bias.f();
  extras.sink = in.sink.empty() ? nullptr : sink.f();
  extras.dropout_mask = in.mask.empty() ? nullptr : mask.f();
  extras.max_logit = max_logit.f();
  extras.d_bias = in.bias.empty() ? nullptr : d_bias.f();
  extras.d_sink = in.sink.empty() ? nullptr : d_sink.f();
  cudaStream_t stream = nullptr;
  REF_CUDA_OK(cudaStreamCreate(&stream));
  reference_forward_gpu(p, q.f(), k.f(), v.f(), o.f(), lse.f(), stream, extras);
  reference_backward_gpu(p, q.f(), k.f(), v.f(), o.f(), lse.f(), d_o.f(), d_q.f(), d_k.f(), d_v.f(), stream, extras);
  const cudaError_t synced = cudaStreamSynchronize(stream);
  cudaStreamDestroy(stream);
  REF_CUDA_OK(synced);
  REF_CUDA_OK(cudaMemcpy(out.o.data(), o.get(), o.bytes(), cudaMemcpyDeviceToHost));
  REF_CUDA_OK(cudaMemcpy(out.lse.data(), lse.get(), lse.bytes(), cudaMemcpyDeviceToHost));
  REF_CUDA_OK(cudaMemcpy(out.d_q.data(), d_q.get(), d_q.bytes(), cudaMemcpyDeviceToHost));
  REF_CUDA_OK(cudaMemcpy(out.d_k.data(), d_k.get(), d_k.bytes(), cudaMemcpyDeviceToHost));
  REF_CUDA_OK(cudaMemcpy(out.d_v.data(), d_v.get(), d_v.bytes(), cudaMemcpyDeviceToHost));
  REF_CUDA_OK(cudaMemcpy(out.max_logit.data(), max_logit.get(), max_logit.bytes(), cudaMemcpyDeviceToHost));
  REF_CUDA_OK(cudaMemcpy(out.d_bias.data(), d_bias.get(), bytes_of(out.d_bias), cudaMemcpyDeviceToHost));
  REF_CUDA_OK(cudaMemcpy(out.d_sink.data(), d_sink.get(), bytes_of(out.d_sink), cudaMemcpyDeviceToHost));
}

struct CpuResults {
  std::vector<double> o, lse, d_q, d_k, d_v;
  std::vector<double> max_logit, d_bias, d_sink;
};

// The CPU reference on exactly the float inputs the GPU saw.
CpuResults run_cpu(const ReferenceProblem& p, const Inputs& in) {
  const std::vector<double> q = widen(in.q), k = widen(in.k), v = widen(in.v), d_o = widen(in.d_o);
  const std::vector<double> bias = widen(in.bias), sink = widen(in.sink), mask = widen(in.mask);
  const std::size_t rows = static_cast<std::size_t>(p.batch * p.heads_q * p.seq_q);
  CpuResults out{std::vector<double>(in.d_o.size()), std::vector<double>(rows), std::vector<double>(q.size()),
                 std::vector<double>(k.size()),      std::vector<double>(v.size()), std::vector<double>(rows),
                 std::vector<double>(bias.size()),   std::vector<double>(sink.size())};
  ReferenceExtras<double> extras;
  extras.bias = bias.empty() ? nullptr : bias.data();
  extras.sink = sink.empty() ? nullptr : sink.data();
  extras.dropout_mask = mask.empty() ? nullptr : mask.data();
  extras.max_logit = out.max_logit.data();
  extras.d_bias = bias.empty() ? nullptr : out.d_bias.data();
  extras.d_sink = sink.empty() ? nullptr : out.d_sink.data();
  reference_forward_cpu(p, q.data(), k.data(), v.data(), out.o.data(), out.lse.data(), extras);
  reference_backward_cpu(p, q.data(), k.data(), v.data(), d_o.data(), out.d_q.data(), out.d_k.data(),
                         out.d_v.data(), extras);
  return out;
}

void expect_close(const Results& gpu, const CpuResults& cpu) {
  const auto n = [](const std::vector<double>& x) { return static_cast<std::int64_t>(x.size()); };
  EXPECT_LT(relative_error(gpu.o.data(), cpu.o.data(), n(cpu.o)), 1e-5) << "O";
  EXPECT_LT(relative_error(gpu.lse.data(), cpu.lse.data(), n(cpu.lse)), 1e-5) << "lse";
  EXPECT_LT(relative_error(gpu.d_q.data(), cpu.d_q.data(), n(cpu.d_q)), 1e-5) << "dQ";
  EXPECT_LT(relative_error(gpu.d_k.data(), cpu.d_k.data(), n(cpu.d_k)), 1e-5) << "dK";
  EXPECT_LT(relative_error(gpu.d_v.data(), cpu.d_v.data(), n(cpu.d_v)), 1e-5) << "dV";
  EXPECT_LT(relative_error(gpu.max_logit.data(), cpu.max_logit.data(), n(cpu.max_logit)), 1e-5) << "max logit";
  if (!cpu.d_bias.empty()) {
    EXPECT_LT(relative_error(gpu.d_bias.data(), cpu.d_bias.data(), n(cpu.d_bias)), 1e-5) << "dBias";
  }
  if (!cpu.d_sink.empty()) {
    EXPECT_LT(relative_error(gpu.d_sink.data(), cpu.d_sink.data(), n(cpu.d_sink)), 1e-5) << "dSink";
  }
}

TEST(ReferenceGpu, MatchesCpuForwardAndBackward) {
  FUSEDATTN_REQUIRE_GPU();
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE("random seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  for (const Case& c : cases()) {
    const ReferenceProblem p = to_problem(c);
    SCOPED_TRACE(describe(p));
    const Inputs in = random_inputs(p, rng);
    Results gpu;
    run_gpu(p, in, gpu);
    if (HasFatalFailure()) return;
    expect_close(gpu, run_cpu(p, in));
  }
}

// Padded problems: entries shorter than the padded sizes, entries of length zero on either side,
// and entries whose rows outnumber their keys (so bottom-right must use the entry's own lengths).
std::vector<ReferenceProblem> padded_problems() {
  const auto TL = Alignment::top_left, BR = Alignment::bottom_right;
  std::vector<ReferenceProblem> out;
  for (const Case& c : {Case{4, 4, 2, 17, 33, 64, 64, Window{}, TL}, Case{4, 4, 2, 17, 33, 64, 64, kCausal, BR},
                        Case{4, 4, 1, 17, 33, 128, 64, kCausal, TL}, Case{4, 4, 2, 17, 33, 64, 64, Window{9, 0}, BR},
                        Case{4, 2, 2, 17, 33, 32, 64, Window{7, 3}, TL}}) {
    ReferenceProblem p = to_problem(c);
    p.seq_len_q = {17, 0, 9, 12};
    p.seq_len_kv = {33, 20, 0, 5};
    out.push_back(p);
  }
  return out;
}

// Every row r >= lens[b] of every head of every entry b of a [batch, heads, seq, dim] array is
// exactly `pad`: padding must be written (the GPU outputs start out as NaN), not left alone.
template <class T>
void expect_padding(const std::vector<T>& x, std::int64_t heads, std::int64_t seq,
                    const std::vector<std::int64_t>& lens, std::int64_t dim, T pad, const char* what) {
  for (std::size_t b = 0; b < lens.size(); ++b) {
    for (std::int64_t h = 0; h < heads; ++h) {
      for (std::int64_t r = lens[b]; r < seq; ++r) {
        for (std::int64_t d = 0; d < dim; ++d) {
          const T got = x[static_cast<std::size_t>(((static_cast<std::int64_t>(b) * heads + h) * seq + r) * dim + d)];
          ASSERT_EQ(got, pad) << what << " entry " << b << " head " << h << " row " << r << " dim " << d;
        }
      }
    }
  }
}

// Padding rows: O = 0, lse = -inf and dQ = 0 on both references; padding keys: dK = dV = 0.
template <class T>
void expect_all_padding(const ReferenceProblem& p, const std::vector<T>& o, const std::vector<T>& lse,
                        const std::vector<T>& d_q, const std::vector<T>& d_k, const std::vector<T>& d_v) {
  const T zero = 0, minus_inf = -std::numeric_limits<T>::infinity();
  expect_padding(o, p.heads_q, p.seq_q, p.seq_len_q, p.head_dim_v, zero, "O");
  expect_padding(lse, p.heads_q, p.seq_q, p.seq_len_q, 1, minus_inf, "lse");
  expect_padding(d_q, p.heads_q, p.seq_q, p.seq_len_q, p.head_dim_qk, zero, "dQ");
  expect_padding(d_k, p.heads_kv, p.seq_kv, p.seq_len_kv, p.head_dim_qk, zero, "dK");
  expect_padding(d_v, p.heads_kv, p.seq_kv, p.seq_len_kv, p.head_dim_v, zero, "dV");
}

TEST(ReferenceGpu, PaddedMatchesCpuAndZeroesThePadding) {
  FUSEDATTN_REQUIRE_GPU();
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE("random seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  for (const ReferenceProblem& p : padded_problems()) {
    SCOPED_TRACE(describe(p));
    const Inputs in = random_inputs(p, rng);
    Results gpu;
    run_gpu(p, in, gpu);
    if (HasFatalFailure()) return;
    const CpuResults cpu = run_cpu(p, in);
    expect_close(gpu, cpu);
    {
      SCOPED_TRACE("GPU");
      expect_all_padding(p, gpu.o, gpu.lse, gpu.d_q, gpu.d_k, gpu.d_v);
    }
    {
      SCOPED_TRACE("CPU");
      expect_all_padding(p, cpu.o, cpu.lse, cpu.d_q, cpu.d_k, cpu.d_v);
    }
  }
}

// Rows that see no key: O exactly 0 and lse exactly -inf (not NaN, not a large negative number).
TEST(ReferenceGpu, FullyMaskedRowsAreZeroWithMinusInfLse) {
  FUSEDATTN_REQUIRE_GPU();
  std::mt19937 rng(std::random_device{}());
  const ReferenceProblem p = to_problem({1, 2, 1, 6, 2, 8, 8, kCausal, Alignment::bottom_right});
  const Inputs in = random_inputs(p, rng);
  Results gpu;
  run_gpu(p, in, gpu);
  if (HasFatalFailure()) return;
  for (std::int64_t h = 0; h < p.heads_q; ++h) {
    for (std::int64_t i = 0; i < p.seq_q - p.seq_kv; ++i) {
      const std::int64_t row = h * p.seq_q + i;
      EXPECT_EQ(gpu.lse[row], -std::numeric_limits<float>::infinity()) << "head " << h << " row " << i;
      for (std::int64_t d = 0; d < p.head_dim_v; ++d) EXPECT_EQ(gpu.o[row * p.head_dim_v + d], 0.0f);
      for (std::int64_t d = 0; d < p.head_dim_qk; ++d) EXPECT_EQ(gpu.d_q[row * p.head_dim_qk + d], 0.0f);
    }
  }
}

TEST(ReferenceGpu, RejectsHeadDimAboveTheLimit) {
  FUSEDATTN_REQUIRE_GPU();
  ReferenceProblem p = to_problem({1, 1, 1, 4, 4, 264, 64, Window{}, Alignment::top_left});
  try {
    reference_forward_gpu(p, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(e.field(), "head_dim_qk");
    EXPECT_EQ(e.value(), "264");
  }
}


// --- bias, ALiBi, softmax variants, max logit ----------------------------------------------------

// Each case of `problems` with a fresh draw, GPU against CPU on every output (max logit included).
void expect_gpu_matches_cpu(const std::vector<ReferenceProblem>& problems) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE("random seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  for (const ReferenceProblem& p : problems) {
    SCOPED_TRACE(describe(p));
    const Inputs in = random_inputs(p, rng);
    Results gpu;
    run_gpu(p, in, gpu);
    if (::testing::Test::HasFatalFailure()) return;
    expect_close(gpu, run_cpu(p, in));
  }
}

// Shapes for the extras: GQA, s_q both below and above s_kv, rows that see nothing, a window.
std::vector<Case> extra_cases() {
  const auto TL = Alignment::top_left, BR = Alignment::bottom_right;
  return {
      {2, 4, 2, 17, 33, 64, 64, Window{}, TL},
      {2, 4, 2, 40, 17, 128, 64, kCausal, BR},  // the first 23 rows see nothing
      {1, 4, 1, 33, 70, 64, 32, Window{9, 0}, BR},
  };
}

TEST(ReferenceGpu, BiasShapesMatchCpuWithDBias) {
  FUSEDATTN_REQUIRE_GPU();
  std::vector<ReferenceProblem> problems;
  for (Bias bias : {Bias::bhss, Bias::b1ss, Bias::one_hss, Bias::one_1ss, Bias::one_11s}) {
    for (const Case& c : extra_cases()) {
      ReferenceProblem p = to_problem(c);
      p.bias = bias;
      problems.push_back(p);
    }
  }
  expect_gpu_matches_cpu(problems);
}

TEST(ReferenceGpu, AlibiMatchesCpu) {
  FUSEDATTN_REQUIRE_GPU();
  std::vector<ReferenceProblem> problems;
  for (const Case& c : {Case{2, 12, 4, 17, 33, 64, 64, kCausal, Alignment::top_left},  // 12 heads: interleaved slopes
                        Case{1, 8, 2, 33, 70, 64, 64, kCausal, Alignment::bottom_right},
                        Case{1, 4, 2, 40, 17, 32, 32, kCausal, Alignment::bottom_right}}) {
    ReferenceProblem p = to_problem(c);
    p.alibi = true;
    problems.push_back(p);
    p.bias = Bias::one_11s;  // both terms at once
    problems.push_back(p);
  }
  expect_gpu_matches_cpu(problems);
}

TEST(ReferenceGpu, OffByOneAndSinkMatchCpuWithDSink) {
  FUSEDATTN_REQUIRE_GPU();
  std::vector<ReferenceProblem> problems;
  for (Softmax softmax : {Softmax::off_by_one, Softmax::sink}) {
    for (const Case& c : extra_cases()) {
      ReferenceProblem p = to_problem(c);
      p.softmax = softmax;
      problems.push_back(p);
    }
    ReferenceProblem decode = to_problem({1, 2, 1, 1, 100, 128, 128, kCausal, Alignment::bottom_right});
    decode.softmax = softmax;
    problems.push_back(decode);
  }
  expect_gpu_matches_cpu(problems);
}

// Every extra at once on padded problems (zero-length entries included): padding rows stay
// O = 0, lse = -inf, max logit -inf on both references, even with the extra softmax term.
TEST(ReferenceGpu, PaddedWithEveryExtraMatchesCpu) {
  FUSEDATTN_REQUIRE_GPU();
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE("random seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  const Bias biases[] = {Bias::b1ss, Bias::one_11s, Bias::bhss, Bias::one_hss, Bias::one_1ss};
  std::size_t n = 0;
  for (ReferenceProblem p : padded_problems()) {
    p.bias = biases[n++ % 5];
    p.alibi = p.window.causal();
    p.softmax = n % 2 == 0 ? Softmax::off_by_one : Softmax::sink;
    SCOPED_TRACE(describe(p));
    const Inputs in = random_inputs(p, rng);
    Results gpu;
    run_gpu(p, in, gpu);
    if (HasFatalFailure()) return;
    const CpuResults cpu = run_cpu(p, in);
    expect_close(gpu, cpu);
    const float minus_inf = -std::numeric_limits<float>::infinity();
    expect_padding(gpu.lse, p.heads_q, p.seq_q, p.seq_len_q, 1, minus_inf, "GPU lse");
    expect_padding(gpu.max_logit, p.heads_q, p.seq_q, p.seq_len_q, 1, minus_inf, "GPU max logit");
    expect_padding(gpu.o, p.heads_q, p.seq_q, p.seq_len_q, p.head_dim_v, 0.0f, "GPU O");
    expect_padding(gpu.d_q, p.heads_q, p.seq_q, p.seq_len_q, p.head_dim_qk, 0.0f, "GPU dQ");
    expect_padding(cpu.lse, p.heads_q, p.seq_q, p.seq_len_q, 1, -std::numeric_limits<double>::infinity(), "CPU lse");
  }
}

// Dropout with a random keep mask (NaN where a row does not see the key, so neither reference may
// read it there): plain, with each bias path (bhss writes dS straight into dBias, b1ss goes through
// the scratch), with a sink (dSink) and off_by_one, and on padded problems with every extra.
TEST(ReferenceGpu, DropoutMatchesCpu) {
  FUSEDATTN_REQUIRE_GPU();
  std::vector<ReferenceProblem> problems;
  for (const Case& c : extra_cases()) {
    ReferenceProblem p = to_problem(c);
    p.dropout = 0.3;
    problems.push_back(p);
    p.bias = Bias::bhss;
    problems.push_back(p);
    p.bias = Bias::b1ss;
    p.softmax = Softmax::sink;
    problems.push_back(p);
    p.bias = Bias::none;
    p.softmax = Softmax::off_by_one;
    p.dropout = 0.1;
    problems.push_back(p);
  }
  ReferenceProblem decode = to_problem({1, 2, 1, 1, 100, 128, 128, kCausal, Alignment::bottom_right});
  decode.dropout = 0.5;
  decode.softmax = Softmax::sink;
  problems.push_back(decode);
  const Bias biases[] = {Bias::one_hss, Bias::bhss, Bias::one_11s, Bias::b1ss, Bias::one_1ss};
  std::size_t n = 0;
  for (ReferenceProblem p : padded_problems()) {
    p.bias = biases[n++ % 5];
    p.alibi = p.window.causal();
    p.softmax = n % 2 == 0 ? Softmax::vanilla : Softmax::sink;
    p.dropout = 0.3;
    problems.push_back(p);
  }
  expect_gpu_matches_cpu(problems);
}

TEST(ReferenceGpu, RejectsMissingExtras) {
  FUSEDATTN_REQUIRE_GPU();
  ReferenceProblem p = to_problem({1, 1, 1, 4, 4, 64, 64, Window{}, Alignment::top_left});
  p.bias = Bias::bhss;
  try {
    reference_forward_gpu(p, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr);
    ADD_FAILURE() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(e.field(), "extras.bias");
  }
  p.bias = Bias::none;
  p.softmax = Softmax::sink;
  try {
    reference_backward_gpu(p, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                           nullptr);
    ADD_FAILURE() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(e.field(), "extras.sink");
  }
  p.softmax = Softmax::vanilla;
  p.dropout = 0.2;
  try {
    reference_forward_gpu(p, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr);
    ADD_FAILURE() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(e.field(), "extras.dropout_mask");
  }
  p.dropout = 1.0;
  try {
    reference_backward_gpu(p, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                           nullptr);
    ADD_FAILURE() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(e.field(), "dropout");
  }
}

// Scatter into the K slice of a packed [b, s, 3, h, d] QKV buffer and gather it back: the 16-bit
// values must be exactly what the host conversion gives (both round to nearest even), and the Q
// and V slices around it must stay untouched.
void check_packed_round_trip(DType dtype) {
  const std::int64_t b = 2, h = 3, s = 5, d = 16;
  TensorDesc desc;
  desc.dtype = dtype;
  desc.dims = {b, h, s, d};
  desc.strides = {s * 3 * h * d, d, 3 * h * d, 1};
  const std::int64_t total = b * s * 3 * h * d, k_base = h * d, n = desc.elements();

  std::mt19937 rng(std::random_device{}());
  std::normal_distribution<float> dist(0.0f, 100.0f);
  std::vector<float> values(static_cast<std::size_t>(n));
  for (float& x : values) x = dist(rng);
  // Values where rounding is delicate: ties, overflow, subnormals, signed zero, infinity.
  const float specials[] = {1.0f + std::ldexp(1.0f, -11), 1.0f + std::ldexp(1.0f, -8), 65520.0f, 1e-7f,
                            3 * std::ldexp(1.0f, -25), -0.0f, std::numeric_limits<float>::infinity(), 1e30f};
  for (std::size_t x = 0; x < sizeof specials / sizeof specials[0]; ++x) values[x * 7] = specials[x];

  const std::uint16_t poison = 0x7777;
  std::vector<std::uint16_t> host(static_cast<std::size_t>(total), poison);
  DeviceBuffer packed(host.size() * sizeof(std::uint16_t)), dense(bytes_of(values)), back(bytes_of(values));
  ASSERT_NE(packed.get(), nullptr);
  ASSERT_NE(dense.get(), nullptr);
  ASSERT_NE(back.get(), nullptr);
  REF_CUDA_OK(cudaMemcpy(packed.get(), host.data(), packed.bytes(), cudaMemcpyHostToDevice));
  REF_CUDA_OK(cudaMemcpy(dense.get(), values.data(), dense.bytes(), cudaMemcpyHostToDevice));
  std::uint16_t* k_slice = static_cast<std::uint16_t*>(packed.get()) + k_base;
  scatter_from_float_gpu(desc, dense.f(), k_slice, nullptr);
  gather_to_float_gpu(desc, k_slice, back.f(), nullptr);
  REF_CUDA_OK(cudaDeviceSynchronize());
  std::vector<float> gathered(values.size());
  REF_CUDA_OK(cudaMemcpy(host.data(), packed.get(), packed.bytes(), cudaMemcpyDeviceToHost));
  REF_CUDA_OK(cudaMemcpy(gathered.data(), back.get(), back.bytes(), cudaMemcpyDeviceToHost));

  std::vector<bool> written(host.size(), false);
  for (std::int64_t x = 0; x < n; ++x) {
    const std::int64_t bi = x / (h * s * d), hi = x / (s * d) % h, si = x / d % s, di = x % d;
    const std::int64_t at = k_base + bi * desc.strides[0] + hi * desc.strides[1] + si * desc.strides[2] + di;
    written[at] = true;
    const std::uint16_t expected = float_to_half_bits(values[x], dtype);
    ASSERT_EQ(host[at], expected) << "element " << x << " value " << values[x];
    const float widened = half_bits_to_float(expected, dtype);
    ASSERT_EQ(std::memcmp(&gathered[x], &widened, sizeof(float)), 0) << "element " << x;  // -0.0 too
  }
  for (std::size_t at = 0; at < host.size(); ++at) {
    if (!written[at]) {
      ASSERT_EQ(host[at], poison) << "offset " << at << " outside the K slice was written";
    }
  }
}

TEST(ReferenceGpu, GatherScatterRoundTripBf16) {
  FUSEDATTN_REQUIRE_GPU();
  check_packed_round_trip(DType::bf16);
}

TEST(ReferenceGpu, GatherScatterRoundTripF16) {
  FUSEDATTN_REQUIRE_GPU();
  check_packed_round_trip(DType::f16);
}

}  // namespace
}  // namespace fusedattn
