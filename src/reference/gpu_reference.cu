// GPU float32 attention reference: plain CUDA kernels for shapes too large for the CPU reference.
//
// Deliberately simple: no tensor cores, no tiling. One block owns one output row (a query row for
// the forward and dQ, a key row for dK/dV); its warps take turns over the other sequence, and the
// 32 lanes of a warp split the head dimension, so a dot product is one warp shuffle reduction and
// the block synchronizes only once, to merge its warps at the end. Each block re-reads K and V
// from L2, which is what makes this slow at long sequences; it is meant to be obviously right.
// Padding lengths travel as a small device array; padding rows and keys are still written (as
// zeros, lse -inf), because callers poison their outputs and compare every element.
#include <cmath>
#include <cstdint>
#include <string>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "fusedattn/errors.h"
#include "fusedattn/reference.h"
#include "spec/window_rule.h"
#include "problem_check.h"

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
/// as device arrays (null when there is no padding: every entry is full length).
struct Shape {
  std::int64_t batch, heads_q, heads_kv, seq_q, seq_kv;
  int d_qk, d_v;
  std::int64_t window_left, window_right;
  bool bottom_right;
  float scale;
  const std::int64_t* len_q;
  const std::int64_t* len_kv;

  __device__ std::int64_t group() const { return heads_q / heads_kv; }
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
Shape make_shape(const ReferenceProblem& p, const std::int64_t* lengths) {
  return Shape{p.batch, p.heads_q, p.heads_kv, p.seq_q, p.seq_kv, static_cast<int>(p.head_dim_qk),
               static_cast<int>(p.head_dim_v), p.window.left, p.window.right, p.alignment == Alignment::bottom_right,
               static_cast<float>(p.scale), lengths, lengths == nullptr ? nullptr : lengths + p.batch};
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
// the warps' partial results are then merged by rescaling to the common max.
__global__ void __launch_bounds__(kThreads) reference_forward_kernel(Shape s, const float* q, const float* k,
                                                                     const float* v, float* o, float* lse) {
  __shared__ float warp_max[kWarps], warp_sum[kWarps];
  __shared__ float warp_acc[kWarps][kMaxHeadDim];
  const std::int64_t row = blockIdx.x;
  const std::int64_t i = row % s.seq_q, hq = (row / s.seq_q) % s.heads_q, b = row / (s.seq_q * s.heads_q);
  const std::int64_t hk = hq / s.group();
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;

  float q_mine[kPerLane], acc[kPerLane] = {};
  load_row(q + s.q_row(b, hq, i), s.d_qk, lane, q_mine);
  float m = -INFINITY, l = 0.0f;
  const detail::KeyRange keys = s.keys(b, i);  // empty for padding rows: they take the no-key path
  for (std::int64_t j = keys.first + warp; j <= keys.last; j += kWarps) {
    const float score = s.scale * warp_dot(q_mine, k + s.k_row(b, hk, j), s.d_qk, lane);
    const float m_new = fmaxf(m, score);
    const float rescale = expf(m - m_new);  // 0 on the first visible key, when m is -inf
    const float p = expf(score - m_new);
    l = l * rescale + p;
#pragma unroll
    for (int t = 0; t < kPerLane; ++t) acc[t] *= rescale;
    warp_axpy(p, v + s.v_row(b, hk, j), s.d_v, lane, acc);
    m = m_new;
  }
  stash_row(acc, s.d_v, lane, warp_acc[warp]);
  if (lane == 0) {
    warp_max[warp] = m;
    warp_sum[warp] = l;
  }
  __syncthreads();

  float row_max = -INFINITY;
  for (int w = 0; w < kWarps; ++w) row_max = fmaxf(row_max, warp_max[w]);
  float* o_row = o + s.o_row(b, hq, i);
  if (row_max == -INFINITY) {  // no key seen (or a padding row): O = 0, lse = -inf by definition
    for (int d = threadIdx.x; d < s.d_v; d += kThreads) o_row[d] = 0.0f;
    if (threadIdx.x == 0) lse[s.stat_row(b, hq, i)] = -INFINITY;
    return;
  }
  float weight[kWarps], total = 0.0f;  // a warp that saw no key has m = -inf and weight 0
  for (int w = 0; w < kWarps; ++w) {
    weight[w] = expf(warp_max[w] - row_max);
    total += warp_sum[w] * weight[w];
  }
  for (int d = threadIdx.x; d < s.d_v; d += kThreads) {
    float sum = 0.0f;
    for (int w = 0; w < kWarps; ++w) sum += warp_acc[w][d] * weight[w];
    o_row[d] = sum / total;
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

// Block (b, hq, i): dQ_i = scale * sum_j dS_ij k_j, with P_ij = exp(scale q_i.k_j - lse_i) and
// dS_ij = P_ij (dO_i.v_j - D_i). Warps split the keys; their partial dQ rows are summed at the end.
__global__ void __launch_bounds__(kThreads) reference_dq_kernel(Shape s, const float* q, const float* k,
                                                                const float* v, const float* lse,
                                                                const float* d_row, const float* d_o, float* d_q) {
  __shared__ float warp_acc[kWarps][kMaxHeadDim];
  const std::int64_t row = blockIdx.x;
  const std::int64_t i = row % s.seq_q, hq = (row / s.seq_q) % s.heads_q, b = row / (s.seq_q * s.heads_q);
  const std::int64_t hk = hq / s.group();
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;

  float q_mine[kPerLane], do_mine[kPerLane], acc[kPerLane] = {};
  load_row(q + s.q_row(b, hq, i), s.d_qk, lane, q_mine);
  load_row(d_o + s.o_row(b, hq, i), s.d_v, lane, do_mine);
  const float row_lse = lse[s.stat_row(b, hq, i)], row_d = d_row[s.stat_row(b, hq, i)];
  // Only visible keys: this also guards exp(score - lse) on rows whose lse is -inf, and leaves the
  // padding rows' dQ at exactly 0.
  const detail::KeyRange keys = s.keys(b, i);
  for (std::int64_t j = keys.first + warp; j <= keys.last; j += kWarps) {
    const float* k_row = k + s.k_row(b, hk, j);
    const float p = expf(s.scale * warp_dot(q_mine, k_row, s.d_qk, lane) - row_lse);
    const float d_s = p * (warp_dot(do_mine, v + s.v_row(b, hk, j), s.d_v, lane) - row_d);
    warp_axpy(s.scale * d_s, k_row, s.d_qk, lane, acc);
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

// Block (b, hk, j): dV_j = sum P_ij dO_i and dK_j = scale * sum dS_ij q_i, over every row i of
// every query head that shares kv head hk (GQA/MQA). Warps split the (head, row) pairs. A padding
// key is visible to no row, so its dK/dV rows are written as exactly 0.
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
    if (!s.keys(b, i).contains(j)) continue;
    const float* q_row = q + s.q_row(b, hq, i);
    const float* do_row = d_o + s.o_row(b, hq, i);
    const std::int64_t stat = s.stat_row(b, hq, i);
    const float p = expf(s.scale * warp_dot(k_mine, q_row, s.d_qk, lane) - lse[stat]);
    const float d_s = p * (warp_dot(v_mine, do_row, s.d_v, lane) - d_row[stat]);
    warp_axpy(p, do_row, s.d_v, lane, dv_acc);
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

// --- strided 16-bit <-> contiguous float ------------------------------------------------------

struct Strided {
  std::int64_t dims[4], strides[4];
};

Strided make_strided(const TensorDesc& desc) {
  Strided out{};
  for (int axis = 0; axis < 4; ++axis) {
    out.dims[axis] = desc.dims[axis];
    out.strides[axis] = desc.strides[axis];
  }
  return out;
}

// Offset of the n-th element of the logical [b, h, s, d] order in the strided tensor.
__device__ std::int64_t strided_offset(const Strided& t, std::int64_t n) {
  std::int64_t offset = 0;
#pragma unroll
  for (int axis = 3; axis >= 0; --axis) {
    offset += (n % t.dims[axis]) * t.strides[axis];
    n /= t.dims[axis];
  }
  return offset;
}

__device__ float to_float(__half x) { return __half2float(x); }
__device__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
template <class T>
__device__ T from_float(float x);
template <>
__device__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

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
                           float* lse, cudaStream_t stream) {
  check_gpu_problem(p);
  StreamScratch lengths(length_bytes(p), stream, "reference lengths");
  const Shape s = make_shape(p, upload_lengths(p, lengths, stream));
  const std::int64_t rows = p.batch * p.heads_q * p.seq_q;
  reference_forward_kernel<<<static_cast<unsigned int>(rows), kThreads, 0, stream>>>(s, q, k, v, o, lse);
  check_launch("reference_forward_kernel");
  lengths.release();
}

void reference_backward_gpu(const ReferenceProblem& p, const float* q, const float* k, const float* v,
                            const float* o, const float* lse, const float* d_o, float* d_q, float* d_k, float* d_v,
                            cudaStream_t stream) {
  check_gpu_problem(p);
  const std::int64_t q_rows = p.batch * p.heads_q * p.seq_q;
  const std::int64_t kv_rows = p.batch * p.heads_kv * p.seq_kv;
  StreamScratch lengths(length_bytes(p), stream, "reference lengths");
  const Shape s = make_shape(p, upload_lengths(p, lengths, stream));
  StreamScratch d_scratch(static_cast<std::size_t>(q_rows) * sizeof(float), stream, "reference D");
  float* d_row = static_cast<float*>(d_scratch.get());

  // D = rowsum(dO ∘ O) needs no lengths: the kernels after it read D only on rows that see a key.
  const int warps_per_block = kGatherThreads / kWarpSize;
  reference_row_dot_kernel<<<grid_stride_blocks(q_rows, warps_per_block), kGatherThreads, 0, stream>>>(
      q_rows, s.d_v, o, d_o, d_row);
  check_launch("reference_row_dot_kernel");
  reference_dq_kernel<<<static_cast<unsigned int>(q_rows), kThreads, 0, stream>>>(s, q, k, v, lse, d_row, d_o, d_q);
  check_launch("reference_dq_kernel");
  reference_dkdv_kernel<<<static_cast<unsigned int>(kv_rows), kThreads, 0, stream>>>(s, q, k, v, lse, d_row, d_o,
                                                                                      d_k, d_v);
  check_launch("reference_dkdv_kernel");
  d_scratch.release();
  lengths.release();
}

void gather_to_float_gpu(const TensorDesc& desc, const void* src, float* dst, cudaStream_t stream) {
  const std::int64_t n = desc.elements();
  if (n <= 0) return;
  const Strided t = make_strided(desc);
  const unsigned int blocks = grid_stride_blocks(n, kGatherThreads);
  if (desc.dtype == DType::bf16) {
    gather_kernel<<<blocks, kGatherThreads, 0, stream>>>(t, n, static_cast<const __nv_bfloat16*>(src), dst);
  } else {
    gather_kernel<<<blocks, kGatherThreads, 0, stream>>>(t, n, static_cast<const __half*>(src), dst);
  }
  check_launch("gather_kernel");
}

void scatter_from_float_gpu(const TensorDesc& desc, const float* src, void* dst, cudaStream_t stream) {
  const std::int64_t n = desc.elements();
  if (n <= 0) return;
  const Strided t = make_strided(desc);
  const unsigned int blocks = grid_stride_blocks(n, kGatherThreads);
  if (desc.dtype == DType::bf16) {
    scatter_kernel<<<blocks, kGatherThreads, 0, stream>>>(t, n, src, static_cast<__nv_bfloat16*>(dst));
  } else {
    scatter_kernel<<<blocks, kGatherThreads, 0, stream>>>(t, n, src, static_cast<__half*>(dst));
  }
  check_launch("scatter_kernel");
}

}  // namespace fusedattn
