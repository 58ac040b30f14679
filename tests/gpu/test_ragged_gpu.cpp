// GPU tier: ragged (thd) batches — numerics against the reference in every ragged layout, packed
// sequences against padded slots, plan builds over 1000 random batches, and CUDA graphs replayed
// with new lengths.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "fusedattn/attention.h"
#include "fusedattn/plan_cache.h"
#include "fusedattn/ragged.h"
#include "fusedattn/reference.h"
#include "gpu_skip.h"
#include "supported_passes.h"
#include "testing/attention_buffers.h"
#include "testing/check_result.h"
#include "testing/cuda_check.h"
#include "testing/device_buffer.h"
#include "testing/twins.h"

namespace fusedattn {
namespace {

using check::DeviceBuffer;

struct Case {
  std::string name, spec;
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.spec; }

// Every ragged layout with odd lengths, s_q != s_kv and GQA where the layout allows, each mask
// kind, head dims, f16, deterministic, many sequences (the checker empties the second one), and
// ragged Q with dense K/V.
std::vector<Case> ragged_cases() {
  const std::string gqa = " b=5 s_q=333 s_kv=517 h_q=8 h_kv=2 d=128";
  return {
      {"thd_nomask_bf16", "layout=thd_thd_thd dtype=bf16" + gqa},
      {"thd_causal_bf16", "layout=thd_thd_thd dtype=bf16" + gqa + " causal"},
      {"thd_causal_br_f16", "layout=thd_thd_thd dtype=f16" + gqa + " causal align=bottom_right"},
      {"thd_window_br_bf16", "layout=thd_thd_thd dtype=bf16" + gqa + " window=128,0 align=bottom_right"},
      {"thd_d64_f16", "layout=thd_thd_thd dtype=f16 b=3 s_q=700 s_kv=300 h=4 d=64 causal"},
      {"thd_d256_bf16", "layout=thd_thd_thd dtype=bf16 b=3 s_q=257 s_kv=257 h=4 d=256 causal"},
      {"thd_d192_128_bf16", "layout=thd_thd_thd dtype=bf16 b=3 s_q=200 s_kv=300 h_q=4 h_kv=1 d_qk=192 d_v=128"},
      {"thd_deterministic_bf16", "layout=thd_thd_thd dtype=bf16" + gqa + " causal deterministic=1"},
      {"thd_many_sequences_bf16", "layout=thd_thd_thd dtype=bf16 b=17 s_q=129 s_kv=129 h=4 d=64 causal"},
      {"thd_inference_bf16", "layout=thd_thd_thd dtype=bf16" + gqa + " causal stats=0"},  // no ragged statistics
      {"t3hd_causal_bf16", "layout=t3hd dtype=bf16 b=4 s=400 h=4 d=128 causal"},
      {"th3d_f16", "layout=th3d dtype=f16 b=4 s=400 h=4 d=64"},
      {"thd_t2hd_bf16", "layout=thd_t2hd dtype=bf16" + gqa + " causal"},
      {"thd_th2d_f16", "layout=thd_th2d dtype=f16" + gqa},
      {"thd_q_bshd_kv_bf16", "layout=thd_bshd_bshd dtype=bf16" + gqa + " causal align=bottom_right"},
      {"thd_q_sbhd_kv_f16", "layout=thd_sbhd_sbhd dtype=f16" + gqa + " causal"},
  };
}

class RaggedNumerics : public ::testing::TestWithParam<Case> {};

TEST_P(RaggedNumerics, MatchesReference) {
  FUSEDATTN_REQUIRE_GPU();
  check_supported_passes(parse_spec(GetParam().spec));
}

INSTANTIATE_TEST_SUITE_P(Gpu, RaggedNumerics, ::testing::ValuesIn(ragged_cases()),
                         [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

// --- helpers -------------------------------------------------------------------------------------

template <class T>
T* upload(DeviceBuffer& device, const std::vector<T>& host) {
  if (device.bytes() < host.size() * sizeof(T)) device = DeviceBuffer(std::max<std::size_t>(host.size() * sizeof(T), 16));
  check::check_cuda(cudaMemcpy(device.get(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy");
  return device.as<T>();
}

std::vector<std::int32_t> cumulative(const std::vector<std::int32_t>& lengths) {
  std::vector<std::int32_t> out{0};
  for (std::int32_t n : lengths) out.push_back(out.back() + n);
  return out;
}

std::vector<float> download_half(const void* device, std::int64_t elements, DType dtype) {
  std::vector<std::uint16_t> bits(static_cast<std::size_t>(elements));
  check::check_cuda(cudaMemcpy(bits.data(), device, bits.size() * 2, cudaMemcpyDeviceToHost), "cudaMemcpy");
  std::vector<float> out(bits.size());
  for (std::size_t i = 0; i < bits.size(); ++i) out[i] = half_bits_to_float(bits[i], dtype);
  return out;
}

// Workspace for both passes of `spec`, grown as plans ask for more.
Workspace workspace_for(const AttentionSpec& spec, DeviceBuffer& buffer) {
  const std::size_t need = std::max(get_plan(spec, Pass::forward)->workspace_bytes(),
                                    get_plan(spec, Pass::backward)->workspace_bytes());
  if (buffer.bytes() < need) buffer = DeviceBuffer(need);
  return Workspace{buffer.get(), buffer.bytes(), nullptr};
}

// --- packed sequences ----------------------------------------------------------------------------

// The same sequences packed back to back give what they give in padded slots (which the numerics
// above check against the reference), token for token: O, dQ, dK, dV and the statistics.
TEST(Ragged, PackedSequencesGiveWhatPaddedSlotsGive) {
  FUSEDATTN_REQUIRE_GPU();
  const AttentionSpec spec = parse_spec("layout=thd_thd_thd dtype=bf16 b=5 s_q=300 s_kv=400 h_q=8 h_kv=2 d=64 causal");
  FUSEDATTN_REQUIRE_SUPPORTED_BOTH(spec);
  const AttentionSpec twin = check::ragged_twin(spec);
  check::AttentionBuffers slots(twin, true);
  slots.fill_inputs(20261129);
  std::vector<std::int32_t> len_q = slots.seq_len_q(), len_kv = slots.seq_len_kv();
  len_q[2] = len_kv[2] = 0;  // an empty sequence in the middle
  slots.set_lengths(len_q, len_kv);
  const std::vector<std::int32_t> cu_q = cumulative(len_q), cu_kv = cumulative(len_kv);
  std::vector<std::int32_t> slot_q, slot_kv;
  for (std::int64_t b = 0; b <= spec.batch(); ++b) {
    slot_q.push_back(static_cast<std::int32_t>(b * spec.seq_q()));
    slot_kv.push_back(static_cast<std::int32_t>(b * spec.seq_kv()));
  }
  DeviceBuffer d_cu_q, d_cu_kv, d_slot_q, d_slot_kv;
  RaggedTensors in_slots{spec.batch(), upload(d_cu_q, cu_q), upload(d_cu_kv, cu_kv), upload(d_slot_q, slot_q),
                         upload(d_slot_kv, slot_kv)};
  RaggedTensors packed_seqs{spec.batch(), in_slots.cu_seqlens_q, in_slots.cu_seqlens_kv, nullptr, nullptr};
  const float scale = default_scale(spec);
  DeviceBuffer scratch;
  const Workspace ws = workspace_for(spec, scratch);

  ForwardTensors f = slots.forward_tensors();
  f.ragged = in_slots;
  forward(spec, f, scale, nullptr, ws);
  BackwardTensors g = slots.backward_tensors();
  g.ragged = in_slots;
  backward(spec, g, scale, nullptr, ws);

  // Packed copies: token rows of sequence b move from slot b * s to cu[b].
  const std::int64_t row_q = spec.heads_q() * spec.head_dim_qk(), row_kv = spec.heads_kv() * spec.head_dim_qk();
  const std::int64_t row_o = spec.heads_q() * spec.head_dim_v();
  auto pack = [&](const void* slotted, std::int64_t row, std::int64_t seq, const std::vector<std::int32_t>& cu) {
    DeviceBuffer out(static_cast<std::size_t>(std::max<std::int64_t>(cu.back(), 1) * row * 2));
    for (std::size_t b = 0; b + 1 < cu.size(); ++b) {
      const std::size_t bytes = static_cast<std::size_t>((cu[b + 1] - cu[b]) * row * 2);
      check::check_cuda(cudaMemcpy(static_cast<char*>(out.get()) + cu[b] * row * 2,
                                   static_cast<const char*>(slotted) + static_cast<std::int64_t>(b) * seq * row * 2, bytes,
                                   cudaMemcpyDeviceToDevice),
                        "cudaMemcpy(pack)");
    }
    return out;
  };
  DeviceBuffer q = pack(f.q, row_q, spec.seq_q(), cu_q), k = pack(f.k, row_kv, spec.seq_kv(), cu_kv);
  DeviceBuffer v = pack(f.v, row_kv, spec.seq_kv(), cu_kv), d_o = pack(g.d_o, row_o, spec.seq_q(), cu_q);
  DeviceBuffer o(q.bytes()), dq(q.bytes()), dk(k.bytes()), dv(v.bytes());
  DeviceBuffer stats(static_cast<std::size_t>(std::max(cu_q.back(), 1) * spec.heads_q()) * sizeof(float));
  ForwardTensors pf;
  pf.q = q.get(), pf.k = k.get(), pf.v = v.get(), pf.o = o.get(), pf.stats = stats.as<float>();
  pf.ragged = packed_seqs;
  forward(spec, pf, scale, nullptr, ws);
  BackwardTensors pg;
  pg.q = q.get(), pg.k = k.get(), pg.v = v.get(), pg.o = o.get(), pg.d_o = d_o.get(), pg.stats = stats.as<float>();
  pg.d_q = dq.get(), pg.d_k = dk.get(), pg.d_v = dv.get();
  pg.ragged = packed_seqs;
  backward(spec, pg, scale, nullptr, ws);
  check::check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");

  // Packed results, and the slotted ones packed the same way, compared.
  auto compare = [&](const char* what, const DeviceBuffer& packed, const void* slotted, std::int64_t row, std::int64_t seq,
                     const std::vector<std::int32_t>& cu, double tolerance) {
    DeviceBuffer reference = pack(slotted, row, seq, cu);
    const std::int64_t n = cu.back() * row;
    const auto a = download_half(packed.get(), n, spec.q.dtype), b = download_half(reference.get(), n, spec.q.dtype);
    EXPECT_LE(relative_error(a.data(), b.data(), n), tolerance) << what;
  };
  compare("o", o, f.o, row_o, spec.seq_q(), cu_q, 0.0);  // the same kernel on the same rows: bit for bit
  compare("dq", dq, g.d_q, row_q, spec.seq_q(), cu_q, check::tolerance_for(spec.q.dtype));
  compare("dk", dk, g.d_k, row_kv, spec.seq_kv(), cu_kv, check::tolerance_for(spec.q.dtype));
  compare("dv", dv, g.d_v, row_kv, spec.seq_kv(), cu_kv, check::tolerance_for(spec.q.dtype));
}

// --- plan builds ---------------------------------------------------------------------------------

// 1000 random packed batches (1..64 sequences of 1..4096 tokens) through forward and backward:
// the plans built are at most the buckets those batches reach (fusedattn/ragged.h), not one per
// step, and every call runs.
TEST(Ragged, ThousandRandomBatchesBuildOnlyTheirBuckets) {
  FUSEDATTN_REQUIRE_GPU();
  constexpr std::int64_t kMaxBatch = 64, kMaxSeq = 4096, kHeads = 2, kDim = 64;
  const std::size_t tokens = kMaxBatch * kMaxSeq, bytes = tokens * kHeads * kDim * 2;
  DeviceBuffer q(bytes), k(bytes), v(bytes), o(bytes), d_o(bytes), dq(bytes), dk(bytes), dv(bytes);
  DeviceBuffer stats(tokens * kHeads * sizeof(float)), cu(static_cast<std::size_t>(kMaxBatch + 1) * sizeof(std::int32_t));
  for (const DeviceBuffer* buffer : {&q, &k, &v, &d_o}) check::check_cuda(cudaMemset(buffer->get(), 0, bytes), "cudaMemset");
  std::mt19937_64 rng(4242);
  std::set<std::pair<std::int64_t, std::int64_t>> buckets;
  DeviceBuffer scratch;
  const CacheStats before = plan_cache_stats();
  for (int step = 0; step < 1000; ++step) {
    const std::int64_t batch = std::uniform_int_distribution<std::int64_t>(1, kMaxBatch)(rng);
    std::vector<std::int32_t> lengths;
    for (std::int64_t i = 0; i < batch; ++i) lengths.push_back(std::uniform_int_distribution<std::int32_t>(1, kMaxSeq)(rng));
    const std::int32_t longest = *std::max_element(lengths.begin(), lengths.end());
    const std::vector<std::int32_t> offsets = cumulative(lengths);
    check::check_cuda(cudaMemcpy(cu.get(), offsets.data(), offsets.size() * 4, cudaMemcpyHostToDevice), "cudaMemcpy");
    const AttentionSpec spec = parse_spec("layout=thd_thd_thd dtype=bf16 h=2 d=64 causal b=" + std::to_string(batch) +
                                          " s=" + std::to_string(longest));
    buckets.insert({batch_bucket(batch), sequence_bucket(longest)});
    const RaggedTensors ragged{batch, cu.as<std::int32_t>(), cu.as<std::int32_t>(), nullptr, nullptr};
    const Workspace ws = workspace_for(spec, scratch);
    ForwardTensors f;
    f.q = q.get(), f.k = k.get(), f.v = v.get(), f.o = o.get(), f.stats = stats.as<float>(), f.ragged = ragged;
    forward(spec, f, 0.125f, nullptr, ws);
    BackwardTensors g;
    g.q = q.get(), g.k = k.get(), g.v = v.get(), g.o = o.get(), g.d_o = d_o.get(), g.stats = stats.as<float>();
    g.d_q = dq.get(), g.d_k = dk.get(), g.d_v = dv.get(), g.ragged = ragged;
    backward(spec, g, 0.125f, nullptr, ws);
  }
  check::check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  const CacheStats after = plan_cache_stats();
  const std::uint64_t builds = after.builds - before.builds;
  std::printf("  1000 random batches: %zu buckets reached, %llu plans built (forward and backward)\n", buckets.size(),
              static_cast<unsigned long long>(builds));
  EXPECT_LE(builds, 2 * buckets.size());
  EXPECT_LE(buckets.size(), 49u);
}

// --- CUDA graphs ---------------------------------------------------------------------------------

// A ragged forward + backward captured once at a bucket's size replays with other lengths and
// offsets written into the same device arrays, and gives what eager calls give.
TEST(Ragged, CudaGraphReplaysWithNewLengths) {
  FUSEDATTN_REQUIRE_GPU();
  const AttentionSpec spec = parse_spec("layout=thd_thd_thd dtype=bf16 b=8 s=512 h_q=8 h_kv=2 d=128 causal");
  FUSEDATTN_REQUIRE_SUPPORTED_BOTH(spec);
  const AttentionSpec twin = check::ragged_twin(spec);
  check::AttentionBuffers buffers(twin, true);
  buffers.fill_inputs(7);
  DeviceBuffer cu_q(9 * 4), cu_kv(9 * 4), slot_q(9 * 4), slot_kv(9 * 4);
  std::vector<std::int32_t> slots;
  for (int b = 0; b <= 8; ++b) slots.push_back(b * 512);
  upload(slot_q, slots);
  upload(slot_kv, slots);
  const RaggedTensors ragged{8, cu_q.as<std::int32_t>(), cu_kv.as<std::int32_t>(), slot_q.as<std::int32_t>(),
                             slot_kv.as<std::int32_t>()};
  ForwardTensors f = buffers.forward_tensors();
  BackwardTensors g = buffers.backward_tensors();
  f.ragged = g.ragged = ragged;
  auto fwd_plan = get_plan(spec, Pass::forward), bwd_plan = get_plan(spec, Pass::backward);
  DeviceBuffer workspace(std::max<std::size_t>(16, std::max(fwd_plan->workspace_bytes(), bwd_plan->workspace_bytes())));
  const Workspace ws{workspace.get(), workspace.bytes(), nullptr};
  const float scale = default_scale(spec);
  cudaStream_t stream;
  check::check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");

  auto set_lengths = [&](std::mt19937_64& rng) {
    std::vector<std::int32_t> q, kv;
    for (int b = 0; b < 8; ++b) {
      q.push_back(std::uniform_int_distribution<std::int32_t>(0, 512)(rng));
      kv.push_back(std::uniform_int_distribution<std::int32_t>(q.back(), 512)(rng));
    }
    buffers.set_lengths(q, kv);
    upload(cu_q, cumulative(q));
    upload(cu_kv, cumulative(kv));
  };
  std::mt19937_64 rng(99);
  set_lengths(rng);
  fwd_plan->run(f, scale, stream, ws);  // first use of this stream's handle, outside the capture
  check::check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  cudaGraph_t graph;
  check::check_cuda(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), "cudaStreamBeginCapture");
  fwd_plan->run(f, scale, stream, ws);
  bwd_plan->run(g, scale, stream, ws);
  check::check_cuda(cudaStreamEndCapture(stream, &graph), "cudaStreamEndCapture");
  cudaGraphExec_t exec;
  check::check_cuda(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");

  for (int round = 0; round < 3; ++round) {
    set_lengths(rng);
    buffers.poison_outputs();
    fwd_plan->run(f, scale, stream, ws);
    bwd_plan->run(g, scale, stream, ws);
    check::check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    const auto eager_o = download_half(f.o, twin.o.extent(), spec.q.dtype);
    const auto eager_dq = download_half(g.d_q, twin.q.extent(), spec.q.dtype);
    buffers.poison_outputs();
    check::check_cuda(cudaGraphLaunch(exec, stream), "cudaGraphLaunch");
    check::check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    const auto replay_o = download_half(f.o, twin.o.extent(), spec.q.dtype);
    const auto replay_dq = download_half(g.d_q, twin.q.extent(), spec.q.dtype);
    EXPECT_LE(relative_error(replay_o.data(), eager_o.data(), twin.o.extent()), 0.0) << "round " << round;
    EXPECT_LE(relative_error(replay_dq.data(), eager_dq.data(), twin.q.extent()), check::tolerance_for(spec.q.dtype))
        << "round " << round;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace fusedattn
