// GPU tier: decodes that fusedattn's own decode kernel takes (src/support/decode_kernel_rule.h),
// against the float64 reference: contiguous and paged caches with lengths of 0, 1, a page plus one
// and ragged ones, windows, 1 to 16 queries of groups up to 8, head dims 64, 128 and 256 (Gemma 2's),
// softcaps, sinks and biases; and FP8 (E4M3) caches, per tensor and per head, against the reference of
// the dequantized cache. ctest runs this file three ways: under
// the rule (the shards), and with FUSEDATTN_DECODE_KERNEL=1 and =0 (gpu/decode_kernel,
// gpu/decode_cudnn), so that every case is checked on the kernel and on cuDNN's path alike.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "fusedattn/attention.h"
#include "fusedattn/fp8.h"
#include "fusedattn/reference.h"
#include "fusedattn/spec.h"
#include "fusedattn/support.h"
#include "gpu_skip.h"
#include "testing/check_result.h"
#include "testing/cuda_check.h"
#include "testing/device_buffer.h"
#include "testing/reference_check.h"

namespace fusedattn {
namespace {

using check::DeviceBuffer;

// What FUSEDATTN_DECODE_KERNEL forces in this process: "1", "0", or "" (the rule chooses).
std::string forced() {
  const char* value = std::getenv("FUSEDATTN_DECODE_KERNEL");
  return value == nullptr ? "" : value;
}

void check_with_lengths(const std::string& spec, std::vector<std::int32_t> seq_len_q,
                        std::vector<std::int32_t> seq_len_kv) {
  check::CheckOptions options;
  options.backward = false;
  options.seq_len_q = std::move(seq_len_q);
  options.seq_len_kv = std::move(seq_len_kv);
  const check::CheckResult result = check::check_against_reference(parse_spec(spec), options);
  std::printf("  %s [%s]\n", result.to_string().c_str(), check_support(parse_spec(spec), Pass::forward).kernel.c_str());
  EXPECT_TRUE(result.passed) << result.to_string();
}

// The choice the process makes is the one it says: forced either way, or the rule's (a contiguous
// decode over 8k keys on the kernel, a paged one of one row tile too, one of four row tiles on cuDNN's
// split decode: decode_kernel_preferred).
TEST(DecodeKernel, TheSupportAnswerNamesTheKernelThatRuns) {
  FUSEDATTN_REQUIRE_GPU();
  const AttentionSpec paged = parse_spec("layout=bshd_paged_bshd dtype=bf16 b=1 s_q=1 s_kv=8192 h_q=32 h_kv=8 d=128 "
                                         "page_size=64 pages=128 causal align=bottom_right");
  const AttentionSpec contiguous = parse_spec("layout=bshd dtype=bf16 b=1 s_q=1 s_kv=8192 h_q=32 h_kv=8 d=128 "
                                              "padding=1 causal align=bottom_right");
  // 16 queries of a group of 4: four row tiles, which stay with cuDNN's split decode.
  const AttentionSpec paged_rows = parse_spec("layout=bshd_paged_bshd dtype=bf16 b=2 s_q=16 s_kv=8192 h_q=32 h_kv=8 "
                                              "d=128 page_size=64 pages=256 causal align=bottom_right");
  const std::string on_paged = check_support(paged, Pass::forward).kernel;
  const std::string on_paged_rows = check_support(paged_rows, Pass::forward).kernel;
  const std::string on_contiguous = check_support(contiguous, Pass::forward).kernel;
  const bool kernel_paged = on_paged.rfind("fusedattn decode kernel", 0) == 0;
  const bool kernel_paged_rows = on_paged_rows.rfind("fusedattn decode kernel", 0) == 0;
  const bool kernel_contiguous = on_contiguous.rfind("fusedattn decode kernel", 0) == 0;
  if (forced() == "1") {
    EXPECT_TRUE(kernel_paged && kernel_paged_rows && kernel_contiguous) << on_paged << " | " << on_contiguous;
  } else if (forced() == "0") {
    EXPECT_FALSE(kernel_paged || kernel_paged_rows || kernel_contiguous) << on_paged << " | " << on_contiguous;
  } else {
    EXPECT_TRUE(kernel_paged && kernel_contiguous) << on_paged << " | " << on_contiguous;
    EXPECT_EQ(on_paged_rows.rfind("cuDNN split decode", 0), 0u) << on_paged_rows;
  }
}

TEST(DecodeKernel, ContiguousCaches) {
  FUSEDATTN_REQUIRE_GPU();
  const std::string gqa = "layout=bshd dtype=bf16 h_q=32 h_kv=8 d=128 padding=1 causal align=bottom_right ";
  check_with_lengths(gqa + "b=3 s_q=1 s_kv=8192", {1, 1, 1}, {8192, 65, 1});
  check_with_lengths(gqa + "b=2 s_q=7 s_kv=3000", {7, 3}, {2999, 7});
  // 16 queries of a group of 8 (128 rows, the most a block takes), f16, a sliding window.
  check_with_lengths("layout=bshd dtype=f16 b=2 s_q=16 s_kv=2048 h_q=64 h_kv=8 d=64 padding=1 window=256,0 "
                     "align=bottom_right",
                     {16, 5}, {2048, 1000});
  // Several queries without a mask, sbhd, MQA.
  check_with_lengths("layout=sbhd dtype=bf16 b=2 s_q=5 s_kv=2100 h_q=16 h_kv=1 d=128 padding=1", {5, 2}, {2100, 700});
  // The merge: calls of 2 to 8 chunks and few blocks (the first two above) are merged in the kernel
  // by each (K/V head, sequence)'s cluster of blocks on SM 9.0; one K/V head over 20k keys takes
  // more chunks than a cluster holds, merged by the merge kernel (the support answer printed beside
  // each case says which).
  check_with_lengths("layout=bshd dtype=bf16 b=2 s_q=1 s_kv=20000 h_q=8 h_kv=1 d=128 padding=1 causal "
                     "align=bottom_right",
                     {1, 1}, {20000, 300});
}

// A softcap (Gemma 2's), the one score modifier the kernel applies: its cap a runtime scalar (drawn
// in [0.5, 2], so that it bends most scores) or a constant written into the modifier; contiguous
// and paged, a window beside it. The kernel is its only path even with FUSEDATTN_DECODE_KERNEL=0:
// cuDNN's refuses paged caches beside a modifier, and gave the first case 0.94 off in relative L2.
TEST(DecodeKernel, Softcaps) {
  FUSEDATTN_REQUIRE_GPU();
  struct Case {
    const char* spec;
    std::vector<std::int32_t> seq_len_q, seq_len_kv;
  };
  const Case cases[] = {
      {"layout=bshd dtype=bf16 b=3 s_q=1 s_kv=3000 h_q=8 h_kv=4 d=128 padding=1 causal align=bottom_right "
       "score_mod=mul($0,tanh(div(score,$0)))",
       {1, 1, 1}, {3000, 1, 1500}},
      {"layout=bshd dtype=f16 b=2 s_q=4 s_kv=700 h_q=16 h_kv=8 d=64 padding=1 window=256,0 align=bottom_right "
       "score_mod=mul(tanh(div(score,5)),5)",
       {4, 2}, {700, 300}},
      {"layout=bshd_paged_bshd dtype=bf16 b=2 s_q=1 s_kv=2048 h_q=32 h_kv=8 d=128 page_size=64 pages=64 causal "
       "align=bottom_right score_mod=mul($0,tanh(div(score,$0)))",
       {1, 1}, {2048, 77}},
      // Gemma 2: d 256, h 8/4, a window of 4096 on its sliding layers; over pages of 16 with 2 queries.
      {"layout=bshd dtype=bf16 b=2 s_q=1 s_kv=5000 h_q=8 h_kv=4 d=256 padding=1 window=4096,0 align=bottom_right "
       "score_mod=mul($0,tanh(div(score,$0)))",
       {1, 1}, {5000, 300}},
      {"layout=bshd_paged_bshd dtype=f16 b=2 s_q=2 s_kv=1024 h_q=16 h_kv=8 d=256 page_size=16 pages=128 causal "
       "align=bottom_right score_mod=mul(tanh(div(score,50)),50)",
       {2, 1}, {1024, 17}},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(check_support(parse_spec(c.spec), Pass::forward).kernel.rfind("fusedattn decode kernel", 0), 0u)
        << c.spec;
    check_with_lengths(c.spec, c.seq_len_q, c.seq_len_kv);
  }
}

// Sinks (gpt-oss: h 64/8, d 64, a window of 128 on alternate layers) and off-by-one: one term added to
// each row's denominator, in the kernel's own rows where one chunk takes the keys and once in the
// merge where chunks are merged. Short sequences (2 and 3 keys) beside long ones, so that the term
// weighs as much as the keys; a sequence without keys has O 0 and the sink's log-sum-exp. On one
// query row or over a paged cache the kernel is the only path (decode_kernel_only: cuDNN refuses the
// first, and has not been checked on the second), under every setting; 4 queries run on cuDNN's
// path too.
TEST(DecodeKernel, SinksAndOffByOne) {
  FUSEDATTN_REQUIRE_GPU();
  // 3000 keys: a merged cut; 200: one chunk, the kernel's rows take the term.
  check_with_lengths("layout=bshd dtype=bf16 b=3 s_q=1 s_kv=3000 h_q=64 h_kv=8 d=64 padding=1 softmax=sink "
                     "causal align=bottom_right",
                     {1, 1, 1}, {3000, 3, 0});
  check_with_lengths("layout=bshd dtype=bf16 b=3 s_q=1 s_kv=200 h_q=64 h_kv=8 d=64 padding=1 softmax=sink "
                     "window=128,0 align=bottom_right",
                     {1, 1, 1}, {200, 2, 0});
  check_with_lengths("layout=bshd dtype=f16 b=2 s_q=4 s_kv=2500 h_q=16 h_kv=4 d=128 padding=1 softmax=off_by_one",
                     {4, 2}, {2500, 3});
  for (const char* one_row : {"softmax=sink", "softmax=off_by_one"}) {
    const std::string spec = std::string("layout=bshd dtype=bf16 b=2 s_q=1 s_kv=100 h_q=8 h_kv=8 d=128 padding=1 ") +
                             one_row;
    EXPECT_EQ(check_support(parse_spec(spec), Pass::forward).kernel.rfind("fusedattn decode kernel", 0), 0u) << spec;
  }
  const std::string paged = "layout=bshd_paged_bshd dtype=bf16 b=3 s_q=1 s_kv=4096 h_q=64 h_kv=8 d=64 page_size=64 "
                            "pages=192 causal align=bottom_right ";
  for (const char* softmax : {"softmax=sink", "softmax=off_by_one"}) {
    EXPECT_EQ(check_support(parse_spec(paged + softmax), Pass::forward).kernel.rfind("fusedattn decode kernel", 0), 0u);
    check_with_lengths(paged + softmax, {1, 1, 1}, {4096, 65, 2});
  }
}

// A bias (a transformers decode step's padding mask and window, as one row of keys a sequence; or
// any broadcast shape), added after a softcap where the call has one: on the kernel for inference
// (decode_kernel_preferred), on cuDNN's path too with FUSEDATTN_DECODE_KERNEL=0 but for the softcap.
TEST(DecodeKernel, Biases) {
  FUSEDATTN_REQUIRE_GPU();
  const std::string gqa = "dtype=bf16 s_q=1 h_q=32 h_kv=8 d=128 ";
  check_with_lengths("layout=bshd b=3 s_kv=3000 bias=b1ss " + gqa, {}, {});
  check_with_lengths("layout=bshd b=2 s_kv=700 bias=bhss " + gqa, {}, {});
  check_with_lengths("layout=bshd b=2 s_kv=5000 bias=111s " + gqa + "padding=1", {1, 1}, {5000, 65});
  check_with_lengths("layout=bshd b=2 s_kv=2100 bias=b1ss score_mod=mul(tanh(div(score,5)),5) " + gqa, {}, {});
  check_with_lengths("layout=bshd dtype=bf16 b=3 s_q=1 s_kv=3000 h_q=8 h_kv=4 d=256 bias=b1ss "
                     "score_mod=mul(tanh(div(score,5)),5)",
                     {}, {});
  check_with_lengths("layout=sbhd dtype=f16 b=2 s_q=4 s_kv=1500 h_q=16 h_kv=4 d=64 bias=1hss padding=1 "
                     "window=256,0",
                     {4, 3}, {1500, 300});
  if (forced() != "0") {
    const std::string spec = "layout=bshd b=16 s_kv=8192 bias=b1ss " + gqa;
    EXPECT_EQ(check_support(parse_spec(spec), Pass::forward).kernel.rfind("fusedattn decode kernel", 0), 0u);
  }
}

// Paged plans of one kernel instance ask for different shared memory (their chunks' page slots): a
// plan set up after another, with fewer bytes, must not leave the first one's launch over the
// function's limit (it failed with cudaErrorInvalidValue, first in an FP8 cache's captured decode).
// 64 sequences of 2048 keys take one chunk each (33 pages), one of 8192 chunks of 448 keys (8 pages).
TEST(DecodeKernel, PlansOfOneInstanceWithDifferentPageSlots) {
  FUSEDATTN_REQUIRE_GPU();
  const std::string sink = "layout=bshd_paged_bshd dtype=bf16 s_q=1 h_q=8 h_kv=8 d=64 page_size=64 softmax=sink "
                           "causal align=bottom_right ";
  const std::string many = sink + "b=64 s_kv=2048 pages=2048", one = sink + "b=1 s_kv=8192 pages=128";
  check_with_lengths(many, std::vector<std::int32_t>(64, 1), std::vector<std::int32_t>(64, 2048));
  check_with_lengths(one, {1}, {8000});
  check_with_lengths(many, std::vector<std::int32_t>(64, 1), std::vector<std::int32_t>(64, 1999));
}

// A sequence without keys beside full ones: its rows are O 0 (and a log-sum-exp of -inf), as the
// reference defines them, contiguous and paged.
TEST(DecodeKernel, SequencesWithoutKeys) {
  FUSEDATTN_REQUIRE_GPU();
  check_with_lengths("layout=bshd_paged_bshd dtype=bf16 b=3 s_q=4 s_kv=2048 h_q=16 h_kv=2 d=128 page_size=64 "
                     "pages=100",
                     {4, 4, 1}, {2048, 0, 65});
  if (forced() == "0") {
    GTEST_SKIP() << "contiguous case left out on cuDNN's path: its padded call writes non-finite O in the rows "
                    "of a sequence without keys (docs/reliability.md, a known wrong result); such calls run "
                    "on the decode kernel by default";
  }
  check_with_lengths("layout=sbhd dtype=bf16 b=2 s_q=5 s_kv=2048 h_q=16 h_kv=1 d=128 padding=1", {5, 5}, {2048, 0});
}

TEST(DecodeKernel, PagedEdges) {
  FUSEDATTN_REQUIRE_GPU();
  // 16-token pages: one key, a page, a page plus one, ragged lengths.
  check_with_lengths("layout=bshd_paged_bshd dtype=bf16 b=5 s_q=1 s_kv=1024 h_q=32 h_kv=8 d=128 page_size=16 "
                     "pages=400 causal align=bottom_right",
                     {1, 1, 1, 1, 1}, {1, 16, 17, 1000, 1024});
  check_with_lengths("layout=sbhd_paged_sbhd dtype=f16 b=3 s_q=12 s_kv=4096 h_q=16 h_kv=2 d=64 page_size=64 "
                     "pages=200 causal align=bottom_right",
                     {12, 3, 1}, {4096, 65, 12});
  check_with_lengths("layout=bshd_paged_sbhd dtype=bf16 b=1 s_q=4 s_kv=32768 h_q=32 h_kv=8 d=128 page_size=32 "
                     "pages=1024 window=512,0 align=bottom_right",
                     {4}, {32001});
  // The kernel's three ways to find a copy's page (decode_tile_copies.cuh): pages of 48 keys (each
  // copy divides), of 128 (a tile in one page, half a page a tile), of 16 and 32 (a row's page and
  // place repeat every tile): with one row tile each warp copies its 16 keys, with two (32 rows) the
  // block copies, a thread's copies of one tile then spanning pages.
  check_with_lengths("layout=bshd_paged_bshd dtype=bf16 b=3 s_q=2 s_kv=960 h_q=16 h_kv=4 d=128 page_size=48 "
                     "pages=100 causal align=bottom_right",
                     {2, 1, 2}, {960, 49, 97});
  check_with_lengths("layout=bshd_paged_bshd dtype=f16 b=2 s_q=1 s_kv=2048 h_q=8 h_kv=8 d=64 page_size=128 "
                     "pages=40 causal align=bottom_right",
                     {1, 1}, {2048, 129});
  check_with_lengths("layout=bshd_paged_bshd dtype=bf16 b=2 s_q=3 s_kv=512 h_q=12 h_kv=3 d=64 page_size=16 "
                     "pages=80 causal align=bottom_right",
                     {3, 2}, {512, 33});
  check_with_lengths("layout=bshd_paged_bshd dtype=bf16 b=2 s_q=4 s_kv=1024 h_q=32 h_kv=4 d=128 page_size=16 "
                     "pages=140 causal align=bottom_right",
                     {4, 3}, {1024, 17});
  check_with_lengths("layout=bshd_paged_bshd dtype=f16 b=2 s_q=8 s_kv=2048 h_q=32 h_kv=8 d=64 page_size=32 "
                     "pages=140 causal align=bottom_right",
                     {8, 5}, {2048, 33});
}

// --- FP8 (E4M3) caches ------------------------------------------------------------------------------

struct Fp8Case {
  const char* spec;  // the 16-bit spec; k and v become E4M3
  Fp8Scaling scaling;
  std::vector<std::int32_t> len_q, len_kv;
  double q_magnitude = 1.0;  // q uniform in [-q_magnitude, q_magnitude]
};

double uniform(std::mt19937_64& rng, double low, double high) {
  return std::uniform_real_distribution<double>(low, high)(rng);
}

// Runs one FP8-cache decode and checks O and the log-sum-exp against the float64 reference of the
// dequantized cache. K and V heads have magnitudes from 0.5 to 8, so per-head descales matter; every
// pool byte no sequence has (pages past a length, keys past one) is an E4M3 NaN, and O and the
// statistics are NaN before the call.
void check_fp8_cache(const Fp8Case& c, std::uint64_t seed) {
  AttentionSpec spec = parse_spec(c.spec);
  spec.k.dtype = spec.v.dtype = DType::e4m3;
  spec.fp8_scaling = c.scaling;
  spec.stats = true;
  validate(spec);
  const Support support = check_support(spec, Pass::forward);
  ASSERT_TRUE(support.ok()) << support.to_string();
  const std::int64_t b = spec.batch(), s_q = spec.seq_q(), s_kv = spec.seq_kv(), h_q = spec.heads_q();
  const std::int64_t h_kv = spec.heads_kv(), d = spec.head_dim_v();
  std::mt19937_64 rng(seed);
  // K and V in [b, h_kv, s_kv, d], each head's descale from its own amax (or the tensor's).
  std::vector<double> k(b * h_kv * s_kv * d), v(k.size());
  for (std::size_t n = 0; n < k.size(); ++n) {
    const double magnitude = 0.5 * std::pow(2.0, static_cast<double>(n / (s_kv * d) % h_kv % 5));
    k[n] = uniform(rng, -magnitude, magnitude);
    v[n] = uniform(rng, -magnitude, magnitude);
  }
  auto descales_of = [&](const std::vector<double>& x) {
    std::vector<float> amax(h_kv, 0.0f);
    for (std::size_t n = 0; n < x.size(); ++n) {
      const std::size_t head = n / (s_kv * d) % h_kv;
      amax[head] = std::max(amax[head], static_cast<float>(std::fabs(x[n])));
    }
    if (c.scaling == Fp8Scaling::tensor) amax.assign(1, *std::max_element(amax.begin(), amax.end()));
    for (float& a : amax) a /= fp8_max(DType::e4m3);
    return amax;
  };
  const std::vector<float> descale_k = descales_of(k), descale_v = descales_of(v);
  // Where token t of sequence i, head h lives in the pools (paged: through a shuffled table).
  const bool paged = spec.paged_kv();
  const std::int64_t pool = paged ? spec.k.batch() : b, page = paged ? spec.page_size() : s_kv;
  std::vector<std::int32_t> table(b * std::max<std::int64_t>(spec.kv_pages, 1));
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), rng);
  auto offset = [&](const TensorDesc& desc, std::int64_t i, std::int64_t h, std::int64_t t) {
    const std::int64_t entry = paged ? table[i * spec.kv_pages + t / page] : i;
    return entry * desc.strides[kBatch] + h * desc.strides[kHead] + (t % page) * desc.strides[kSeq];
  };
  const std::size_t pool_bytes = static_cast<std::size_t>(spec.k.elements());
  std::vector<std::uint8_t> k8(pool_bytes, 0x7f), v8(pool_bytes, 0x7f);  // 0x7f: E4M3 NaN
  for (std::int64_t i = 0; i < b; ++i) {
    for (std::int64_t h = 0; h < h_kv; ++h) {
      const float dk = descale_k[c.scaling == Fp8Scaling::head ? h : 0];
      const float dv = descale_v[c.scaling == Fp8Scaling::head ? h : 0];
      for (std::int64_t t = 0; t < c.len_kv[i]; ++t) {
        for (std::int64_t x = 0; x < d; ++x) {
          const std::size_t n = ((i * h_kv + h) * s_kv + t) * d + x;
          const std::uint8_t kb = float_to_fp8_bits(static_cast<float>(k[n]) / dk, DType::e4m3);
          const std::uint8_t vb = float_to_fp8_bits(static_cast<float>(v[n]) / dv, DType::e4m3);
          k8[offset(spec.k, i, h, t) + x] = kb;
          v8[offset(spec.v, i, h, t) + x] = vb;
          k[n] = static_cast<double>(fp8_bits_to_float(kb, DType::e4m3)) * dk;  // what the kernel sees
          v[n] = static_cast<double>(fp8_bits_to_float(vb, DType::e4m3)) * dv;
        }
      }
    }
  }
  std::vector<std::uint16_t> q_bits(spec.q.elements());
  for (std::uint16_t& bits : q_bits) {
    bits = float_to_half_bits(static_cast<float>(uniform(rng, -c.q_magnitude, c.q_magnitude)), spec.q.dtype);
  }
  const std::vector<double> q = gather_to_double(spec.q, q_bits.data());

  auto upload = [](const void* host, std::size_t bytes) {
    DeviceBuffer buffer(bytes);
    check::check_cuda(cudaMemcpy(buffer.get(), host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
    return buffer;
  };
  const DeviceBuffer q_d = upload(q_bits.data(), q_bits.size() * 2), k_d = upload(k8.data(), k8.size());
  const DeviceBuffer v_d = upload(v8.data(), v8.size()), table_d = upload(table.data(), table.size() * 4);
  const DeviceBuffer len_q_d = upload(c.len_q.data(), b * 4), len_kv_d = upload(c.len_kv.data(), b * 4);
  const DeviceBuffer dk_d = upload(descale_k.data(), descale_k.size() * 4);
  const DeviceBuffer dv_d = upload(descale_v.data(), descale_v.size() * 4);
  DeviceBuffer o_d(spec.o.elements() * 2), stats_d(b * h_q * s_q * 4);
  check::check_cuda(cudaMemset(o_d.get(), 0xff, o_d.bytes()), "cudaMemset");  // NaN in f16 and bf16
  check::check_cuda(cudaMemset(stats_d.get(), 0xff, stats_d.bytes()), "cudaMemset");

  ForwardTensors t;
  t.q = q_d.get();
  t.k = k_d.get();
  t.v = v_d.get();
  t.o = o_d.get();
  t.stats = stats_d.as<float>();
  t.seq_len_q = len_q_d.as<std::int32_t>();
  t.seq_len_kv = len_kv_d.as<std::int32_t>();
  if (paged) t.page_table_k = t.page_table_v = table_d.as<std::int32_t>();
  t.fp8.descale_k = dk_d.as<float>();
  t.fp8.descale_v = dv_d.as<float>();
  const float scale = default_scale(spec);
  const auto plan = get_plan(spec, Pass::forward);
  DeviceBuffer workspace(plan->workspace_bytes());
  plan->run(t, scale, nullptr, Workspace{workspace.get(), workspace.bytes()});
  check::check_cuda(cudaDeviceSynchronize(), "the FP8-cache decode");

  ReferenceProblem problem = reference_problem(spec, scale);
  problem.seq_len_q.assign(c.len_q.begin(), c.len_q.end());
  problem.seq_len_kv.assign(c.len_kv.begin(), c.len_kv.end());
  std::vector<double> o_ref(b * h_q * s_q * d), lse_ref(b * h_q * s_q);
  reference_forward_cpu(problem, q.data(), k.data(), v.data(), o_ref.data(), lse_ref.data());
  std::vector<std::uint16_t> o_bits(spec.o.elements());
  std::vector<float> stats(b * h_q * s_q);
  check::check_cuda(cudaMemcpy(o_bits.data(), o_d.get(), o_d.bytes(), cudaMemcpyDeviceToHost), "cudaMemcpy");
  check::check_cuda(cudaMemcpy(stats.data(), stats_d.get(), stats_d.bytes(), cudaMemcpyDeviceToHost), "cudaMemcpy");
  const std::vector<double> o = gather_to_double(spec.o, o_bits.data());
  const double err_o = relative_error(o.data(), o_ref.data(), static_cast<std::int64_t>(o.size()));
  // The statistics: -inf exactly where the reference's row sees nothing, else within 1e-3.
  int wrong_stats = 0;
  for (std::size_t n = 0; n < stats.size(); ++n) {
    const bool both_empty = std::isinf(lse_ref[n]) && std::isinf(stats[n]) && stats[n] < 0;
    if (!both_empty && !(std::fabs(stats[n] - lse_ref[n]) <= 1e-3 * std::max(1.0, std::fabs(lse_ref[n])))) ++wrong_stats;
  }
  const double tolerance = check::tolerance_for(spec.o.dtype);
  std::printf("  %s seed=%llu err_o=%.3g (tolerance %.3g) stats wrong: %d of %zu [%s]\n", to_string(spec).c_str(),
              static_cast<unsigned long long>(seed), err_o, tolerance, wrong_stats, stats.size(), support.kernel.c_str());
  EXPECT_LT(err_o, tolerance) << to_string(spec) << " seed " << seed;
  EXPECT_EQ(wrong_stats, 0) << to_string(spec) << " seed " << seed;
}

TEST(DecodeKernel, Fp8CachesMatchTheDequantizedReference) {
  FUSEDATTN_REQUIRE_GPU();
  const Fp8Case cases[] = {
      {"layout=bshd dtype=bf16 b=2 s_q=1 s_kv=3000 h_q=32 h_kv=8 d=128 padding=1 causal align=bottom_right",
       Fp8Scaling::tensor, {1, 1}, {3000, 1}},
      {"layout=bshd_paged_bshd dtype=bf16 b=3 s_q=4 s_kv=2048 h_q=16 h_kv=2 d=128 page_size=64 pages=100 causal "
       "align=bottom_right",
       Fp8Scaling::head, {4, 1, 4}, {65, 2048, 0}},
      {"layout=sbhd_paged_sbhd dtype=f16 b=2 s_q=16 s_kv=1024 h_q=32 h_kv=8 d=64 page_size=16 pages=160 causal "
       "align=bottom_right",
       Fp8Scaling::head, {16, 9}, {1024, 17}},
      {"layout=bshd dtype=bf16 b=2 s_q=1 s_kv=2500 h_q=8 h_kv=4 d=256 padding=1 causal align=bottom_right",
       Fp8Scaling::head, {1, 1}, {2500, 130}},
      // bf16 queries past f16's range (65504), where the kernel's f16 products need their rows scaled.
      {"layout=bshd_paged_bshd dtype=bf16 b=2 s_q=2 s_kv=1024 h_q=16 h_kv=4 d=128 page_size=32 pages=70 causal "
       "align=bottom_right",
       Fp8Scaling::tensor, {2, 1}, {1024, 300}, 3.0e5},
  };
  std::random_device entropy;
  for (const Fp8Case& c : cases) check_fp8_cache(c, (static_cast<std::uint64_t>(entropy()) << 32) | entropy());
}

}  // namespace
}  // namespace fusedattn
