// GPU float32 attention reference: plain CUDA kernels for shapes too large for the CPU reference.
//
// Deliberately simple: no tensor cores, no tiling. One block owns one output row (a query row for
// the forward and dQ, a key row for dK/dV); its warps take turns over the other sequence, and the
// 32 lanes of a warp split the head dimension, so a dot product is one warp shuffle reduction and
// the block synchronizes only once, to merge its warps at the end. Each block re-reads K and V
// from L2, which is what makes this slow at long sequences; it is meant to be obviously right.
// Padding lengths travel as a small device array; padding rows and keys are still written (as
// zeros, lse -inf), because callers poison their outputs and compare every element.
#include <array>
#include <cmath>
#include <cstdint>
#include <string>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include "exec/element_conversions.cuh"
#include "exec/strided_elements.cuh"
#include "fusedattn/errors.h"
#include "fusedattn/reference.h"
#include "spec/window_rule.h"
#include "problem_check.h"
#include "score_terms.h"

namespace fusedattn {

namespace {

constexpr int kWarpSize = 32;
constexpr int kWarps = 4;  // per block; more only lengthens the final merge at short sequences
constexpr int kThreads = kWarps * kWarpSize;
constexpr int kMaxHeadDim = 256;                         // the largest head dim cuDNN attention takes
constexpr int kPerLane = kMaxHeadDim / kWarpSize;        // head-dim elements one lane owns
constexpr int kGatherThreads = 256;

void check_launch(const char* kernel) {
  const cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess) {
    throw CudaError(std::string(kernel) + " launch failed: " + cudaGetErrorString(status));
  }
}

void check_call(cudaError_t status, const std::string& call) {
  if (status != cudaSuccess) throw CudaError(call + " failed: " + cudaGetErrorString(status));
}

// Stream-ordered device scratch, so that nothing here synchronizes the device. release() frees it
// and reports a failure; the destructor frees only what an exception left behind, silently, since
// an error is already on its way out.
class StreamScratch {
 public:
  StreamScratch(std::size_t bytes, cudaStream_t stream, const char* what) : stream_(stream), what_(what) {
    if (bytes > 0) check_call(cudaMallocAsync(&ptr_, bytes, stream), "cudaMallocAsync(" + what_ + ")");
  }
  ~StreamScratch() {
    if (ptr_ != nullptr) (void)cudaFreeAsync(ptr_, stream_);
  }
  StreamScratch(const StreamScratch&) = delete;
  StreamScratch& operator=(const StreamScratch&) = delete;
  void* get() const { return ptr_; }
  void release() {
    void* ptr = ptr_;
    ptr_ = nullptr;
    if (ptr != nullptr) check_call(cudaFreeAsync(ptr, stream_), "cudaFreeAsync(" + what_ + ")");
  }

 private:
  void* ptr_ = nullptr;
  cudaStream_t stream_;
  std::string what_;
};

void check_gpu_problem(const ReferenceProblem& p) {
  detail::check_reference_problem(p);
  if (!p.score_mod.empty()) {
    throw InvalidArgument("score_mod", to_string(p.score_mod), "none for the GPU reference (the CPU one applies it)");
  }
  const std::string limit = "must be at most " + std::to_string(kMaxHeadDim) + " for the GPU reference";
  if (p.head_dim_qk > kMaxHeadDim) throw InvalidArgument("head_dim_qk", std::to_string(p.head_dim_qk), limit);
  if (p.head_dim_v > kMaxHeadDim) throw InvalidArgument("head_dim_v", std::to_string(p.head_dim_v), limit);
  // One block per row, and a grid has at most 2^31 - 1 blocks.
  const std::int64_t max_rows = 0x7fffffff;
  const std::int64_t q_rows = p.batch * p.heads_q * p.seq_q, kv_rows = p.batch * p.heads_kv * p.seq_kv;
  if (q_rows > max_rows || kv_rows > max_rows) {
    throw InvalidArgument("batch * heads * seq", std::to_string(q_rows > kv_rows ? q_rows : kv_rows),
                          "must be below 2^31 for the GPU reference");
  }
}

/// The problem as kernels see it: plain values, passed by value, and the lengths per batch entry
/// as device arrays (null when there is no padding: every entry is full length). The bias (null
/// without one), the sink logits (null unless softmax == sink) and the dropout keep mask (null
/// without dropout) are the caller's device arrays.
struct Shape {
  std::int64_t batch, heads_q, heads_kv, seq_q, seq_kv;
  int d_qk, d_v;
  std::int64_t window_left, window_right;
  bool bottom_right;
  float scale;
  const std::int64_t* len_q;
  const std::int64_t* len_kv;
  const float* bias;
  detail::BiasIndex bias_at;
  bool alibi;
  bool extra_term;    // off_by_one or sink: the denominator has one more term, e^extra_logit(h)
  const float* sink;  // per query head; null for off_by_one, whose extra logit is 0
  const float* dropout_mask;  // [b, h_q, s_q, s_kv], 0 or 1; null without dropout
  float keep_scale;           // 1 / (1 - dropout)

  __device__ std::int64_t group() const { return heads_q / heads_kv; }
  __device__ bool padding_row(std::int64_t b, std::int64_t i) const {
    return len_q != nullptr && i >= len_q[b];
  }
  // ALiBi slope of query head hq (0 without ALiBi), from the same double formula as the CPU's.
  __device__ float slope(std::int64_t hq) const {
    return alibi ? static_cast<float>(detail::alibi_slope(hq, heads_q)) : 0.0f;
  }
  // The logit of (b, hq, i, j) from its scaled dot product: + bias + ALiBi.
  __device__ float logit(float scaled_dot, float slope_h, std::int64_t b, std::int64_t hq, std::int64_t i,
                         std::int64_t j) const {
    float x = scaled_dot;
    if (bias != nullptr) x += bias[bias_at.at(b, hq, i, j)];
    if (alibi) x += slope_h * static_cast<float>(j - i);
    return x;
  }
  __device__ float extra_logit(std::int64_t hq) const { return sink != nullptr ? sink[hq] : 0.0f; }
  // Dropout's factor M_ij / (1 - p) on probability (b, hq, i, j): 1 without dropout. Called only
  // for keys the row sees.
  __device__ float drop(std::int64_t b, std::int64_t hq, std::int64_t i, std::int64_t j) const {
    return dropout_mask == nullptr ? 1.0f : dropout_mask[stat_row(b, hq, i) * seq_kv + j] * keep_scale;
  }
  // The keys row i of batch entry b sees: the window over the entry's actual lengths, so that the
  // entry behaves as it would alone and unpadded; none at all for a padding row.
  __device__ detail::KeyRange keys(std::int64_t b, std::int64_t i) const {
    const std::int64_t entry_q = len_q == nullptr ? seq_q : len_q[b];
    const std::int64_t entry_kv = len_kv == nullptr ? seq_kv : len_kv[b];
    if (i >= entry_q) return detail::KeyRange{0, -1};
    return detail::visible_keys(window_left, window_right, bottom_right, entry_q, entry_kv, i);
  }
  // Starts of row i of query head hq (in Q/dQ: d_qk wide; in O/dO: d_v wide; in lse: 1 wide).
  __device__ std::int64_t q_row(std::int64_t b, std::int64_t hq, std::int64_t i) const {
    return ((b * heads_q + hq) * seq_q + i) * d_qk;
  }
  __device__ std::int64_t o_row(std::int64_t b, std::int64_t hq, std::int64_t i) const {
    return ((b * heads_q + hq) * seq_q + i) * d_v;
  }
  __device__ std::int64_t stat_row(std::int64_t b, std::int64_t hq, std::int64_t i) const {
    return (b * heads_q + hq) * seq_q + i;
  }
  // Starts of key row j of kv head hk (K/dK: d_qk wide, V/dV: d_v wide).
  __device__ std::int64_t k_row(std::int64_t b, std::int64_t hk, std::int64_t j) const {
    return ((b * heads_kv + hk) * seq_kv + j) * d_qk;
  }
  __device__ std::int64_t v_row(std::int64_t b, std::int64_t hk, std::int64_t j) const {
    return ((b * heads_kv + hk) * seq_kv + j) * d_v;
  }
};

// `lengths`: the device copy of seq_len_q followed by seq_len_kv, or null without padding.
Shape make_shape(const ReferenceProblem& p, const std::int64_t* lengths, const ReferenceExtras<float>& extras) {
  return Shape{p.batch, p.heads_q, p.heads_kv, p.seq_q, p.seq_kv, static_cast<int>(p.head_dim_qk),
               static_cast<int>(p.head_dim_v), p.window.left, p.window.right, p.alignment == Alignment::bottom_right,
               static_cast<float>(p.scale), lengths, lengths == nullptr ? nullptr : lengths + p.batch,
               p.bias != Bias::none ? extras.bias : nullptr, detail::bias_index(p), p.alibi,
               p.softmax != Softmax::vanilla, p.softmax == Softmax::sink ? extras.sink : nullptr,
               p.dropout > 0.0 ? extras.dropout_mask : nullptr, static_cast<float>(1.0 / (1.0 - p.dropout))};
}

// Scratch for the device copy of the lengths: seq_len_q then seq_len_kv (none without padding).
std::size_t length_bytes(const ReferenceProblem& p) {
  return (p.seq_len_q.size() + p.seq_len_kv.size()) * sizeof(std::int64_t);
}

// Enqueues the copy of the lengths into `scratch`. The vectors are pageable host memory, from
// which cudaMemcpyAsync returns only once it has read them (staged for the DMA), so the caller may
// destroy them as soon as the reference call returns, although the copy itself is stream-ordered.
// Returns the device lengths for make_shape.
const std::int64_t* upload_lengths(const ReferenceProblem& p, const StreamScratch& scratch, cudaStream_t stream) {
  auto* lengths = static_cast<std::int64_t*>(scratch.get());
  if (lengths == nullptr) return nullptr;
  const std::size_t bytes = static_cast<std::size_t>(p.batch) * sizeof(std::int64_t);
  check_call(cudaMemcpyAsync(lengths, p.seq_len_q.data(), bytes, cudaMemcpyHostToDevice, stream),
             "cudaMemcpyAsync(reference seq_len_q)");
  check_call(cudaMemcpyAsync(lengths + p.batch, p.seq_len_kv.data(), bytes, cudaMemcpyHostToDevice, stream),
             "cudaMemcpyAsync(reference seq_len_kv)");
  return lengths;
}

// Lane `lane` owns head-dim elements lane, lane + 32, lane + 64, ... of every row it touches.
__device__ void load_row(const float* row, int dim, int lane, float (&out)[kPerLane]) {
#pragma unroll
  for (int t = 0; t < kPerLane; ++t) {
    const int d = lane + t * kWarpSize;
    out[t] = d < dim ? row[d] : 0.0f;
  }
}

// Dot product of a lane-distributed row with a row in memory; every lane gets the full sum.
__device__ float warp_dot(const float (&mine)[kPerLane], const float* row, int dim, int lane) {
  float sum = 0.0f;
#pragma unroll
  for (int t = 0; t < kPerLane; ++t) {
    const int d = lane + t * kWarpSize;
    if (d < dim) sum += mine[t] * row[d];
  }
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  return sum;
}

// acc += alpha * row
__device__ void warp_axpy(float alpha, const float* row, int dim, int lane, float (&acc)[kPerLane]) {
#pragma unroll
  for (int t = 0; t < kPerLane; ++t) {
    const int d = lane + t * kWarpSize;
    if (d < dim) acc[t] += alpha * row[d];
  }
}

// Parks each warp's lane-distributed row in shared memory so the block can sum them.
__device__ void stash_row(const float (&acc)[kPerLane], int dim, int lane, float* shared_row) {
#pragma unroll
  for (int t = 0; t < kPerLane; ++t) {
    const int d = lane + t * kWarpSize;
    if (d < dim) shared_row[d] = acc[t];
  }
}

// Block (b, hq, i) = blockIdx.x in row-major order of [b, h_q, s_q]. Each warp runs an online
// softmax over its share of the keys (running max m, running sum l, unnormalised output acc);
// the warps' partial results are then merged by rescaling to the common max, together with the
// softmax's extra term (off_by_one, sink) if it has one. max_logit (null: not wanted) gets the
// largest visible logit, which is the merged max before the extra term. Dropout scales only what
// acc accumulates (each p by M_ij / (1 - p)), not l: lse and the max logit come from P.
__global__ void __launch_bounds__(kThreads) reference_forward_kernel(Shape s, const float* q, const float* k,
                                                                     const float* v, float* o, float* lse,
                                                                     float* max_logit) {
  __shared__ float warp_max[kWarps], warp_sum[kWarps];
  __shared__ float warp_acc[kWarps][kMaxHeadDim];
  const std::int64_t row = blockIdx.x;
  const std::int64_t i = row % s.seq_q, hq = (row / s.seq_q) % s.heads_q, b = row / (s.seq_q * s.heads_q);
  const std::int64_t hk = hq / s.group();
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;

  float q_mine[kPerLane], acc[kPerLane] = {};
  load_row(q + s.q_row(b, hq, i), s.d_qk, lane, q_mine);
  float m = -INFINITY, l = 0.0f;
  const float slope = s.slope(hq);
  const detail::KeyRange keys = s.keys(b, i);  // empty for padding rows: they take the no-key path
  for (std::int64_t j = keys.first + warp; j <= keys.last; j += kWarps) {
    const float score = s.logit(s.scale * warp_dot(q_mine, k + s.k_row(b, hk, j), s.d_qk, lane), slope, b, hq, i, j);
    if (score == -INFINITY) continue;  // a bias of -inf hides the key (and would make m - m_new NaN)
    const float m_new = fmaxf(m, score);
    const float rescale = expf(m - m_new);  // 0 on the first visible key, when m is -inf
    const float p = expf(score - m_new);
    l = l * rescale + p;
#pragma unroll
    for (int t = 0; t < kPerLane; ++t) acc[t] *= rescale;
    warp_axpy(p * s.drop(b, hq, i, j), v + s.v_row(b, hk, j), s.d_v, lane, acc);
    m = m_new;
  }
  stash_row(acc, s.d_v, lane, warp_acc[warp]);
  if (lane == 0) {
    warp_max[warp] = m;
    warp_sum[warp] = l;
  }
  __syncthreads();

  float visible_max = -INFINITY;
  for (int w = 0; w < kWarps; ++w) visible_max = fmaxf(visible_max, warp_max[w]);
  if (max_logit != nullptr && threadIdx.x == 0) max_logit[s.stat_row(b, hq, i)] = visible_max;
  // A padding row has no denominator at all, not even the extra term.
  const bool extra = s.extra_term && !s.padding_row(b, i);
  const float extra_logit = extra ? s.extra_logit(hq) : -INFINITY;
  const float row_max = fmaxf(visible_max, extra_logit);
  float* o_row = o + s.o_row(b, hq, i);
  if (row_max == -INFINITY) {  // an empty denominator (or a padding row): O = 0, lse = -inf by definition
    for (int d = threadIdx.x; d < s.d_v; d += kThreads) o_row[d] = 0.0f;
    if (threadIdx.x == 0) lse[s.stat_row(b, hq, i)] = -INFINITY;
    return;
  }
  float weight[kWarps], total = 0.0f;  // a warp that saw no key has m = -inf and weight 0
  for (int w = 0; w < kWarps; ++w) {
    weight[w] = expf(warp_max[w] - row_max);
    total += warp_sum[w] * weight[w];
  }
  if (extra) total += expf(extra_logit - row_max);  // 0 for a sink of -inf
  for (int d = threadIdx.x; d < s.d_v; d += kThreads) {
    float sum = 0.0f;
    for (int w = 0; w < kWarps; ++w) sum += warp_acc[w][d] * weight[w];
    o_row[d] = sum / total;  // a row that sees no key but has the extra term: every acc is 0, O = 0
  }
  if (threadIdx.x == 0) lse[s.stat_row(b, hq, i)] = row_max + logf(total);
}

// D_r = dot(dO_r, O_r) for every row r of [b, h_q, s_q]: one warp per row, grid-stride.
__global__ void reference_row_dot_kernel(std::int64_t rows, int d_v, const float* o, const float* d_o,
                                         float* d_row) {
  const int lane = threadIdx.x % kWarpSize;
  const std::int64_t warps_total = static_cast<std::int64_t>(gridDim.x) * (blockDim.x / kWarpSize);
  for (std::int64_t r = (static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarpSize; r < rows;
       r += warps_total) {
    float o_mine[kPerLane];
    load_row(o + r * d_v, d_v, lane, o_mine);
    const float sum = warp_dot(o_mine, d_o + r * d_v, d_v, lane);
    if (lane == 0) d_row[r] = sum;
  }
}

// Block (b, hq, i): dQ_i = scale * sum_j dS_ij k_j, with P_ij = exp(s_ij - lse_i) (s_ij the logit:
// scaled score + bias + ALiBi; lse_i includes the softmax's extra term) and dS_ij = P_ij (dO_i.v_j
// * M_ij / (1 - p) - D_i) (the factor is 1 without dropout; D uses O with dropout). Warps split the
// keys; their partial dQ rows are summed at the end. When d_s is not null (a [b, h_q, s_q, s_kv]
// array the caller zeroed), dS_ij is stored there for every visible key.
__global__ void __launch_bounds__(kThreads) reference_dq_kernel(Shape s, const float* q, const float* k,
                                                                const float* v, const float* lse,
                                                                const float* d_row, const float* d_o, float* d_q,
                                                                float* d_s_out) {
  __shared__ float warp_acc[kWarps][kMaxHeadDim];
  const std::int64_t row = blockIdx.x;
  const std::int64_t i = row % s.seq_q, hq = (row / s.seq_q) % s.heads_q, b = row / (s.seq_q * s.heads_q);
  const std::int64_t hk = hq / s.group();
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;

  float q_mine[kPerLane], do_mine[kPerLane], acc[kPerLane] = {};
  load_row(q + s.q_row(b, hq, i), s.d_qk, lane, q_mine);
  load_row(d_o + s.o_row(b, hq, i), s.d_v, lane, do_mine);
  const float row_lse = lse[s.stat_row(b, hq, i)], row_d = d_row[s.stat_row(b, hq, i)];
  // Only visible keys: this leaves the padding rows' dQ at exactly 0. A row whose lse is -inf (it
  // sees no key, or a bias of -inf on every key it sees) has P = 0 throughout, and is skipped so
  // that exp(-inf - -inf) is never formed.
  const detail::KeyRange keys = row_lse == -INFINITY ? detail::KeyRange{0, -1} : s.keys(b, i);
  const float slope = s.slope(hq);
  float* d_s_row = d_s_out == nullptr ? nullptr : d_s_out + s.stat_row(b, hq, i) * s.seq_kv;
  for (std::int64_t j = keys.first + warp; j <= keys.last; j += kWarps) {
    const float* k_row = k + s.k_row(b, hk, j);
    const float p = expf(s.logit(s.scale * warp_dot(q_mine, k_row, s.d_qk, lane), slope, b, hq, i, j) - row_lse);
    const float d_s = p * (warp_dot(do_mine, v + s.v_row(b, hk, j), s.d_v, lane) * s.drop(b, hq, i, j) - row_d);
    warp_axpy(s.scale * d_s, k_row, s.d_qk, lane, acc);
    if (d_s_row != nullptr && lane == 0) d_s_row[j] = d_s;
  }
  stash_row(acc, s.d_qk, lane, warp_acc[warp]);
  __syncthreads();
  float* dq_row = d_q + s.q_row(b, hq, i);
  for (int d = threadIdx.x; d < s.d_qk; d += kThreads) {
    float sum = 0.0f;
    for (int w = 0; w < kWarps; ++w) sum += warp_acc[w][d];
    dq_row[d] = sum;
  }
}

// Block (b, hk, j): dV_j = sum Pd_ij dO_i (Pd = P M / (1 - p), P without dropout) and dK_j = scale
// * sum dS_ij q_i (P and dS as in the dQ kernel), over every row i of every query head that shares
// kv head hk (GQA/MQA). Warps split the (head, row) pairs. A padding key is visible to no row, so
// its dK/dV rows are written as exactly 0.
__global__ void __launch_bounds__(kThreads) reference_dkdv_kernel(Shape s, const float* q, const float* k,
                                                                  const float* v, const float* lse,
                                                                  const float* d_row, const float* d_o,
                                                                  float* d_k, float* d_v) {
  __shared__ float warp_dk[kWarps][kMaxHeadDim], warp_dv[kWarps][kMaxHeadDim];
  const std::int64_t row = blockIdx.x;
  const std::int64_t j = row % s.seq_kv, hk = (row / s.seq_kv) % s.heads_kv, b = row / (s.seq_kv * s.heads_kv);
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;

  float k_mine[kPerLane], v_mine[kPerLane], dk_acc[kPerLane] = {}, dv_acc[kPerLane] = {};
  load_row(k + s.k_row(b, hk, j), s.d_qk, lane, k_mine);
  load_row(v + s.v_row(b, hk, j), s.d_v, lane, v_mine);
  const std::int64_t group = s.group(), pairs = group * s.seq_q;
  for (std::int64_t pair = warp; pair < pairs; pair += kWarps) {
    const std::int64_t hq = hk * group + pair / s.seq_q, i = pair % s.seq_q;
    if (!s.keys(b, i).contains(j) || lse[s.stat_row(b, hq, i)] == -INFINITY) continue;
    const float* q_row = q + s.q_row(b, hq, i);
    const float* do_row = d_o + s.o_row(b, hq, i);
    const std::int64_t stat = s.stat_row(b, hq, i);
    const float logit = s.logit(s.scale * warp_dot(k_mine, q_row, s.d_qk, lane), s.slope(hq), b, hq, i, j);
    const float p = expf(logit - lse[stat]);
    const float drop = s.drop(b, hq, i, j);
    const float d_s = p * (warp_dot(v_mine, do_row, s.d_v, lane) * drop - d_row[stat]);
    warp_axpy(p * drop, do_row, s.d_v, lane, dv_acc);
    warp_axpy(s.scale * d_s, q_row, s.d_qk, lane, dk_acc);
  }
  stash_row(dk_acc, s.d_qk, lane, warp_dk[warp]);
  stash_row(dv_acc, s.d_v, lane, warp_dv[warp]);
  __syncthreads();
  float* dk_row = d_k + s.k_row(b, hk, j);
  float* dv_row = d_v + s.v_row(b, hk, j);
  for (int d = threadIdx.x; d < s.d_qk; d += kThreads) {
    float sum = 0.0f;
    for (int w = 0; w < kWarps; ++w) sum += warp_dk[w][d];
    dk_row[d] = sum;
  }
  for (int d = threadIdx.x; d < s.d_v; d += kThreads) {
    float sum = 0.0f;
    for (int w = 0; w < kWarps; ++w) sum += warp_dv[w][d];
    dv_row[d] = sum;
  }
}

// dBias from the dS array [b, h_q, s_q, s_kv] (0 where a key is not visible): one thread per
// element of the bias, summing, in double and in a fixed order, every dS element that reads it
// (all of a broadcast dim, the one matching index of a real dim). Deterministic, no atomics.
__global__ void reference_dbias_kernel(Shape s, std::int64_t bias_b, std::int64_t bias_h, std::int64_t bias_q,
                                       const float* d_s, float* d_bias) {
  const std::int64_t n = bias_b * bias_h * bias_q * s.seq_kv;
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t x = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; x < n; x += step) {
    const std::int64_t j = x % s.seq_kv, ii = (x / s.seq_kv) % bias_q, hh = (x / (s.seq_kv * bias_q)) % bias_h,
                       bb = x / (s.seq_kv * bias_q * bias_h);
    // A real dim (size > 1, or the problem's own size 1) covers only its index; a broadcast one all.
    const bool all_b = bias_b == 1, all_h = bias_h == 1, all_q = bias_q == 1;
    double sum = 0.0;
    for (std::int64_t b = all_b ? 0 : bb; b < (all_b ? s.batch : bb + 1); ++b) {
      for (std::int64_t h = all_h ? 0 : hh; h < (all_h ? s.heads_q : hh + 1); ++h) {
        for (std::int64_t i = all_q ? 0 : ii; i < (all_q ? s.seq_q : ii + 1); ++i) {
          sum += d_s[s.stat_row(b, h, i) * s.seq_kv + j];
        }
      }
    }
    d_bias[x] = static_cast<float>(sum);
  }
}

// dSink_h = -sum over entries b and rows i of e^(sink_h - lse_i) * D_i: the sink's probability
// times the row's D (the derivative of sum(O ∘ dO) through the denominator; with dropout too, since
// D comes from O with dropout). One block per head;
// each thread sums a fixed stride of rows in double, then a fixed tree: deterministic. Padding
// rows (and any row whose lse is -inf) contribute nothing.
__global__ void __launch_bounds__(kThreads) reference_dsink_kernel(Shape s, const float* lse, const float* d_row,
                                                                   float* d_sink) {
  __shared__ double partial[kThreads];
  const std::int64_t hq = blockIdx.x;
  const double sink = s.sink[hq];
  double sum = 0.0;
  for (std::int64_t r = threadIdx.x; r < s.batch * s.seq_q; r += kThreads) {
    const std::int64_t b = r / s.seq_q, i = r % s.seq_q;
    if (s.padding_row(b, i)) continue;
    const std::int64_t stat = s.stat_row(b, hq, i);
    const float row_lse = lse[stat];
    if (row_lse == -INFINITY) continue;
    sum += exp(sink - static_cast<double>(row_lse)) * static_cast<double>(d_row[stat]);
  }
  partial[threadIdx.x] = sum;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) partial[threadIdx.x] += partial[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) d_sink[hq] = static_cast<float>(-partial[0]);
}

// --- strided 16-bit or FP8 <-> contiguous float ----------------------------------------------

using detail::make_strided;
using detail::Strided;
using detail::strided_offset;

using detail::E4M3;
using detail::E5M2;
using detail::from_float;
using detail::to_float;

template <class T>
__global__ void gather_kernel(Strided t, std::int64_t n, const T* src, float* dst) {
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t x = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; x < n; x += step) {
    dst[x] = to_float(src[strided_offset(t, x)]);
  }
}

template <class T>
__global__ void scatter_kernel(Strided t, std::int64_t n, const float* src, T* dst) {
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t x = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; x < n; x += step) {
    dst[strided_offset(t, x)] = from_float<T>(src[x]);
  }
}

// Enough blocks to cover n once, capped: the kernels stride over the rest.
unsigned int grid_stride_blocks(std::int64_t n, int threads) {
  const std::int64_t wanted = (n + threads - 1) / threads;
  return static_cast<unsigned int>(wanted < 65536 ? wanted : 65536);
}

}  // namespace

void reference_forward_gpu(const ReferenceProblem& p, const float* q, const float* k, const float* v, float* o,
                           float* lse, cudaStream_t stream, const ReferenceExtras<float>& extras) {
  check_gpu_problem(p);
  detail::check_reference_extras(p, extras);
  StreamScratch lengths(length_bytes(p), stream, "reference lengths");
  const Shape s = make_shape(p, upload_lengths(p, lengths, stream), extras);
  const std::int64_t rows = p.batch * p.heads_q * p.seq_q;
  reference_forward_kernel<<<static_cast<unsigned int>(rows), kThreads, 0, stream>>>(s, q, k, v, o, lse,
                                                                                      extras.max_logit);
  check_launch("reference_forward_kernel");
  lengths.release();
}

void reference_backward_gpu(const ReferenceProblem& p, const float* q, const float* k, const float* v,
                            const float* o, const float* lse, const float* d_o, float* d_q, float* d_k, float* d_v,
                            cudaStream_t stream, const ReferenceExtras<float>& extras) {
  check_gpu_problem(p);
  detail::check_reference_extras(p, extras);
  const std::int64_t q_rows = p.batch * p.heads_q * p.seq_q;
  const std::int64_t kv_rows = p.batch * p.heads_kv * p.seq_kv;
  StreamScratch lengths(length_bytes(p), stream, "reference lengths");
  const Shape s = make_shape(p, upload_lengths(p, lengths, stream), extras);
  StreamScratch d_scratch(static_cast<std::size_t>(q_rows) * sizeof(float), stream, "reference D");
  float* d_row = static_cast<float*>(d_scratch.get());

  // D = rowsum(dO ∘ O) needs no lengths: the kernels after it read D only on rows that see a key.
  const int warps_per_block = kGatherThreads / kWarpSize;
  reference_row_dot_kernel<<<grid_stride_blocks(q_rows, warps_per_block), kGatherThreads, 0, stream>>>(
      q_rows, s.d_v, o, d_o, d_row);
  check_launch("reference_row_dot_kernel");
  // dBias: the dQ kernel also stores dS [b, h_q, s_q, s_kv] (zero where masked), which a second
  // kernel then sums over the bias's broadcast dims. A bhss bias has exactly dS's shape, so dS
  // goes straight into d_bias; the others need a float scratch of b * h_q * s_q * s_kv.
  const bool want_d_bias = p.bias != Bias::none && extras.d_bias != nullptr;
  const bool d_s_is_d_bias = want_d_bias && p.bias == Bias::bhss;
  const std::size_t d_s_bytes = static_cast<std::size_t>(q_rows * p.seq_kv) * sizeof(float);
  StreamScratch d_s_scratch(want_d_bias && !d_s_is_d_bias ? d_s_bytes : 0, stream, "reference dS");
  float* d_s = !want_d_bias ? nullptr : d_s_is_d_bias ? extras.d_bias : static_cast<float*>(d_s_scratch.get());
  if (d_s != nullptr) check_call(cudaMemsetAsync(d_s, 0, d_s_bytes, stream), "cudaMemsetAsync(reference dS)");
  reference_dq_kernel<<<static_cast<unsigned int>(q_rows), kThreads, 0, stream>>>(s, q, k, v, lse, d_row, d_o, d_q,
                                                                                   d_s);
  check_launch("reference_dq_kernel");
  if (want_d_bias && !d_s_is_d_bias) {
    const std::array<std::int64_t, 4> dims = bias_dims(p.bias, p.batch, p.heads_q, p.seq_q, p.seq_kv);
    reference_dbias_kernel<<<grid_stride_blocks(detail::bias_elements(p), kGatherThreads), kGatherThreads, 0,
                             stream>>>(s, dims[0], dims[1], dims[2], d_s, extras.d_bias);
    check_launch("reference_dbias_kernel");
  }
  if (p.softmax == Softmax::sink && extras.d_sink != nullptr) {
    reference_dsink_kernel<<<static_cast<unsigned int>(p.heads_q), kThreads, 0, stream>>>(s, lse, d_row,
                                                                                         extras.d_sink);
    check_launch("reference_dsink_kernel");
  }
  reference_dkdv_kernel<<<static_cast<unsigned int>(kv_rows), kThreads, 0, stream>>>(s, q, k, v, lse, d_row, d_o,
                                                                                      d_k, d_v);
  check_launch("reference_dkdv_kernel");
  d_s_scratch.release();
  d_scratch.release();
  lengths.release();
}

void gather_to_float_gpu(const TensorDesc& desc, const void* src, float* dst, cudaStream_t stream) {
  const std::int64_t n = desc.elements();
  if (n <= 0) return;
  const Strided t = make_strided(desc);
  const unsigned int blocks = grid_stride_blocks(n, kGatherThreads);
  switch (desc.dtype) {
    case DType::bf16:
      gather_kernel<<<blocks, kGatherThreads, 0, stream>>>(t, n, static_cast<const __nv_bfloat16*>(src), dst);
      break;
    case DType::f16:
      gather_kernel<<<blocks, kGatherThreads, 0, stream>>>(t, n, static_cast<const __half*>(src), dst);
      break;
    case DType::e4m3:
      gather_kernel<<<blocks, kGatherThreads, 0, stream>>>(t, n, static_cast<const E4M3*>(src), dst);
      break;
    case DType::e5m2:
      gather_kernel<<<blocks, kGatherThreads, 0, stream>>>(t, n, static_cast<const E5M2*>(src), dst);
      break;
  }
  check_launch("gather_kernel");
}

void scatter_from_float_gpu(const TensorDesc& desc, const float* src, void* dst, cudaStream_t stream) {
  const std::int64_t n = desc.elements();
  if (n <= 0) return;
  const Strided t = make_strided(desc);
  const unsigned int blocks = grid_stride_blocks(n, kGatherThreads);
  switch (desc.dtype) {
    case DType::bf16:
      scatter_kernel<<<blocks, kGatherThreads, 0, stream>>>(t, n, src, static_cast<__nv_bfloat16*>(dst));
      break;
    case DType::f16:
      scatter_kernel<<<blocks, kGatherThreads, 0, stream>>>(t, n, src, static_cast<__half*>(dst));
      break;
    case DType::e4m3:
      scatter_kernel<<<blocks, kGatherThreads, 0, stream>>>(t, n, src, static_cast<E4M3*>(dst));
      break;
    case DType::e5m2:
      scatter_kernel<<<blocks, kGatherThreads, 0, stream>>>(t, n, src, static_cast<E5M2*>(dst));
      break;
  }
  check_launch("scatter_kernel");
}

}  // namespace fusedattn
